"""The command line is derived from the settings tree: every flag documented, every field reachable, and the
names users of transformers' Trainer / run_glue and google-research/bert already type."""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bertkit import __version__
from bertkit import settings as st
from bertkit.cli import COMMANDS, build_parser, build_settings, main, normalize_argv, tokenizer_dir
from bertkit.settings.fields import on_command_line


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def _all_commands() -> list[tuple[str, argparse.ArgumentParser, type]]:
    top = _subparsers(build_parser())
    out = []
    for name, command in COMMANDS.items():
        family, _, task = name.partition(" ")
        out.append((name, _subparsers(top[family])[task] if task else top[name], command.settings))
    return out


ALL = _all_commands()


@pytest.mark.parametrize("name,parser,cls", ALL, ids=[c[0] for c in ALL])
def test_every_flag_has_help_and_a_shown_default(name, parser, cls):
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction) or action.dest == "_config_file":
            continue
        assert action.help, f"{name}: {action.option_strings or action.dest} has no help"
        if action.option_strings:
            assert "(default:" in action.help or "(required)" in action.help or "Default:" in action.help, \
                f"{name}: {action.option_strings[0]} does not show its default: {action.help!r}"


def test_every_commands_help_renders():
    for name, parser, _ in ALL:
        raw = parser.format_help()  # argparse %-formats help strings: a bare "%" in a docstring crashed this
        text = " ".join(raw.split())
        assert raw.startswith("usage:"), name
        assert "80% become [MASK]" in text or name != "create-pretraining-data"  # a bare "80%" broke its help
        assert "--config FILE" in text, name


@pytest.mark.parametrize("name,parser,cls", ALL, ids=[c[0] for c in ALL])
def test_every_settings_field_is_reachable_from_the_command_line(name, parser, cls):
    dests = {a.dest for a in parser._actions}
    for f in dataclasses.fields(cls):
        if on_command_line(f):
            assert f.name in dests, f"{name}: settings field {f.name} has no flag"


def test_main_parses_a_command_with_every_flag_the_full_parser_gives_it():
    """main() declares the flags of the command its arguments name only (all 700 took 30 ms of every start-up): that
    command is the one found, whatever comes before and after it, and it gets every flag it has in the full parser;
    arguments that name no command get the full parser (argparse's help and errors list every command)."""
    from bertkit.cli import _command_named

    for name, parser, _ in ALL:
        assert _command_named(["-v", *name.split(), "--output-dir", "out", "--layers", "-1,0", "x"]) == name
        family, _, task = name.partition(" ")
        top = _subparsers(build_parser(name))
        alone = _subparsers(top[family])[task] if task else top[name]
        assert [a.option_strings for a in alone._actions] == [a.option_strings for a in parser._actions], name
        assert set(top) == set(_subparsers(build_parser())), name  # every command still listed
    for argv in (["--help"], ["finetune", "--help"], ["pretrian", "--data", "d"], []):
        assert _command_named(argv) is None, argv


def _settings(argv: list[str]):
    argv = normalize_argv(argv)
    args = build_parser().parse_args(argv)
    name = f"{args.command} {args.family}" if "family" in vars(args) else args.command
    return build_settings(COMMANDS[name].settings, args)


def test_trainer_names_parse_to_the_right_fields(tmp_path):
    s = _settings(["finetune", "ner", "--data-dir", "d", "--model-name-or-path", "m", "--output-dir", "o",
                   "--learning-rate", "3e-5", "--num-train-epochs", "2", "--gradient-accumulation-steps", "2",
                   "--warmup-ratio", "0.2", "--warmup-steps", "7", "--save-steps", "10", "--save-total-limit", "3",
                   "--eval-steps", "5", "--logging-steps", "4", "--seed", "9", "--bf16", "--max-train-samples", "100",
                   "--max-eval-samples", "50", "--batch-size", "16"])
    assert isinstance(s, st.NerSettings)
    assert (s.learning_rate, s.num_train_epochs, s.gradient_accumulation_steps, s.warmup_ratio, s.warmup_steps) == \
        (3e-5, 2.0, 2, 0.2, 7)
    assert (s.save_steps, s.save_total_limit, s.eval_steps, s.logging_steps, s.seed, s.bf16) == (10, 3, 5, 4, 9, True)
    assert (s.max_train_samples, s.max_eval_samples, s.batch_size) == (100, 50, 16)
    assert (s.model_name_or_path, s.output_dir) == (Path("m"), Path("o"))
    p = _settings(["predict", "glue", "--task", "sst2", "--data-dir", "d", "--model", "m", "--out", "o",
                   "--max-predict-samples", "5"])
    assert p.max_predict_samples == 5


def test_underscore_spellings_are_accepted():
    s = _settings(["finetune", "swag", "--train_file", "t.csv", "--predict_file", "v.csv", "--model_name_or_path", "m",
                   "--output_dir", "o", "--learning_rate=4e-5"])
    assert s.learning_rate == 4e-5 and s.train_file == Path("t.csv")


def test_defaults_are_the_task_defaults():
    glue = _settings(["finetune", "glue", "--task", "rte", "--data-dir", "d", "--model", "m", "--out", "o"])
    assert (glue.num_train_epochs, glue.batch_size, glue.learning_rate, glue.seed) == (3.0, 32, None, (1,))
    assert glue.grid(384) == (1e-4,) and glue.grid(768) == (2e-5,)  # one run by default, sized to the model
    paper = _settings(["finetune", "glue", "--task", "rte", "--data-dir", "d", "--model", "m", "--out", "o",
                       "--learning-rate", "paper", "--seeds", "1,2,3"])
    assert paper.grid(384) == st.PAPER_GRID and paper.seed == (1, 2, 3)
    squad2 = _settings(["finetune", "squad", "--predict-file", "p.json", "--version", "2.0", "--model", "m",
                        "--out", "o"])
    assert (squad2.num_train_epochs, squad2.batch_size, squad2.max_seq_length) == (2.0, 48, 384)
    swag = _settings(["finetune", "swag", "--train-file", "t", "--predict-file", "p", "--model", "m", "--out", "o"])
    assert (swag.num_train_epochs, swag.batch_size) == (3.0, 16)
    pre = _settings(["pretrain", "--data", "d", "--vocab", "v", "--out", "o", "--max-steps", "10"])
    assert (pre.learning_rate, pre.warmup_ratio, pre.batch_size, pre.seed, pre.config_name) == (1e-4, 0.01, 32, 42, "mini")


@pytest.mark.parametrize("argv", [["finetune", "ner", "--data-dir", "d"], ["finetune", "swag", "--train-file", "t",
                                  "--predict-file", "p"], ["finetune", "squad", "--predict-file", "p"]])
@pytest.mark.parametrize("rates", ["1e-4,2e-4", "paper"])
def test_a_list_learning_rate_is_refused_where_no_grid_runs(argv, rates, capsys):
    with pytest.raises(SystemExit) as exit_info:  # argparse's usage error
        main([*argv, "--model", "m", "--out", "o", "--learning-rate", rates])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert f"--learning-rate/--lr: '{rates}': this command trains once" in err and "finetune glue" in err
    with pytest.raises(SystemExit):
        main(["pretrain", "--data", "d", "--vocab", "v", "--out", "o", "--max-steps", "1", "--lr", rates])
    assert "trains once" in capsys.readouterr().err
    # the help of these commands does not promise grids; glue's does
    lr_help = {name: next(a.help for a in parser._actions if a.dest == "learning_rate") for name, parser, _ in ALL
               if any(a.dest == "learning_rate" for a in parser._actions)}
    for name, text in lr_help.items():
        assert ("comma list" in text and "'paper'" in text) == (name in ("finetune glue", "finetune classify")), (name, text)


def test_settings_file_values_are_type_checked(tmp_path, capsys):
    cfg = tmp_path / "run.json"
    base = ["finetune", "ner", "--data-dir", "d", "--model", "m", "--out", "o", "--config", str(cfg)]
    for values, message in (({"learning_rate": [1e-4, 2e-4]}, "learning_rate must be a number or None, got "
                                                              "(0.0001, 0.0002) (tuple)"),
                            ({"learning_rate": "1e-4,2e-4"},
                             f"--config {cfg}: learning_rate: '1e-4,2e-4': this command trains once"),
                            ({"batch_size": 16.5}, "batch_size must be an int, got 16.5 (float)"),
                            ({"bf16": "yes"}, "bf16 must be a bool, got 'yes' (str)"),
                            ({"tag_scheme": "bio"}, "tag_scheme 'bio' is not one of ('iob1', 'iob2')"),
                            ({"num_train_epochs": "two"},
                             f"--config {cfg}: num_train_epochs: could not convert string to float")):
        cfg.write_text(json.dumps(values))
        assert main(base) == 2
        assert f"bertkit finetune ner: error: {message}" in capsys.readouterr().err
    # GLUE takes one value or a list for its grid fields, from a file as from the command line
    cfg.write_text(json.dumps({"learning_rate": 3e-5, "seed": 4}))
    glue = _settings(["finetune", "glue", "--task", "rte", "--data-dir", "d", "--model", "m", "--out", "o",
                      "--config", str(cfg)])
    assert (glue.learning_rate, glue.seed) == ((3e-5,), (4,))
    cfg.write_text(json.dumps({"learning_rate": "paper", "seed": [1, 2]}))
    glue = _settings(["finetune", "glue", "--task", "rte", "--data-dir", "d", "--model", "m", "--out", "o",
                      "--config", str(cfg)])
    assert (glue.learning_rate, glue.seed) == (st.PAPER_GRID, (1, 2))


@pytest.mark.parametrize("argv,message", [
    (["train-tokenizer", "a.txt", "--out", "o", "--vocab-size", "0"], "vocab_size must be at least 1, got 0"),
    (["train-tokenizer", "a.txt", "--out", "o", "--workers", "0"], "num_workers must be at least 1, got 0"),
    (["create-pretraining-data", "a.txt", "--vocab", "v", "--out", "o", "--num-workers", "0"],
     "num_workers must be at least 1, got 0"),
    (["predict", "glue", "--task", "rte", "--data-dir", "d", "--model", "m", "--out", "o", "--max-predict-samples",
      "0"], "max_predict_samples must be at least 1, got 0"),
    (["extract-features", "--model", "m", "--input", "i", "--out", "o.jsonl", "--batch-size", "0"],
     "batch_size must be at least 1, got 0"),
    (["demo", "--steps", "0"], "steps must be at least 1, got 0"),
    (["quantize", "--model", "m", "--out", "o", "--max-seq-length", "2"],  # was: "pass max_length 3", no such flag
     "max_seq_length must be at least 3 (a word of each calibration text, [CLS] and [SEP]), got 2"),
    (["finetune", "squad", "--predict-file", "p", "--model", "m", "--out", "o", "--doc-stride", "0"],
     "doc_stride must be at least 1, got 0"),
    (["finetune", "squad", "--predict-file", "p", "--model", "m", "--out", "o", "--max-seq-length", "0"],
     "max_seq_length must be at least 1, got 0"),  # squad's own default once dropped the shared field's check
])
def test_every_settings_class_validates_itself(argv, message, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    assert message in capsys.readouterr().err
    assert not list(tmp_path.iterdir())  # refused before any output directory was claimed


def test_bad_hyperparameters_are_refused_before_any_work(tmp_path, capsys):
    for flag, value, message in (("--learning-rate", "inf", "learning_rate must be a finite positive number"),
                                 ("--learning-rate", "-1", "learning_rate must be a finite positive number"),
                                 ("--warmup-ratio", "2", "warmup_ratio must be in [0, 1)"),
                                 ("--batch-size", "0", "batch_size must be at least 1")):
        code = main(["pretrain", "--data", str(tmp_path / "none"), "--vocab", "v", "--out", str(tmp_path / "o"),
                     "--max-steps", "1", flag, value])
        assert code == 2
        assert message in capsys.readouterr().err
    assert not (tmp_path / "o").exists()  # refused before anything was written


def test_global_batch_that_does_not_split_is_a_clear_error(tmp_path, capsys):
    from bertkit.settings.training import micro_batch_size

    with pytest.raises(ValueError, match="--batch-size 30 .global. does not split evenly over 1 process.es. x 4"):
        micro_batch_size(30, 1, 4)


def test_a_list_flag_with_an_item_left_out_is_refused(capsys):
    """"-1,,2" was read as -1,2: the value between the commas was dropped without a word."""
    with pytest.raises(SystemExit):
        _settings(["extract-features", "--model", "m", "--input", "i.txt", "--out", "o.jsonl", "--layers", "-1,,2"])
    assert "expected a comma-separated list of int, got '-1,,2'" in capsys.readouterr().err
    assert _settings(["extract-features", "--model", "m", "--input", "i.txt", "--out", "o.jsonl",
                      "--layers", "-1,2"]).layers == (-1, 2)


@pytest.mark.parametrize("command", [["finetune", "ner", "--data-dir", "d", "--model", "m"],
                                     ["pretrain", "--data", "d", "--vocab", "v", "--max-steps", "1"]])
def test_a_global_batch_that_does_not_split_over_torchruns_processes_is_refused_with_the_settings(
        command, monkeypatch, tmp_path, capsys):
    """Checked where the settings are, before the process joins its group or loads a model: not minutes later."""
    for name, value in (("RANK", "0"), ("WORLD_SIZE", "2"), ("LOCAL_RANK", "0")):
        monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match="--batch-size 6 .global. does not split evenly over 2 process.es. x 2 "):
        _settings([*command, "--out", "o", "--batch-size", "6", "--gradient-accumulation-steps", "2"])
    assert _settings([*command, "--out", "o", "--batch-size", "8", "--gradient-accumulation-steps", "2"])
    code = main([*command, "--out", str(tmp_path / "o"), "--batch-size", "6", "--gradient-accumulation-steps", "2"])
    assert code == 2 and "does not split evenly over 2 process(es)" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_a_command_refused_for_its_input_leaves_no_directory_it_made(tmp_path, minilm_dir, capsys):
    """Was: the output directory's new parents were left behind, empty (made to lock the output before reading)."""
    corpus = tmp_path / "mac.txt"
    corpus.write_bytes(b"One sentence here.\rAnother one here.\r")  # lines that end in \r alone: refused
    out = tmp_path / "new" / "runs" / "out"
    assert main(["create-pretraining-data", str(corpus), "--vocab", str(minilm_dir), "--output-dir", str(out)]) == 2
    assert "mac.txt: a carriage return" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mac.txt"]


def test_vocab_accepts_the_file_as_well_as_the_directory(tmp_path):
    (tmp_path / "vocab.txt").write_text("[PAD]\n")
    assert tokenizer_dir(tmp_path / "vocab.txt") == tmp_path and tokenizer_dir(tmp_path) == tmp_path


def test_settings_file_holds_the_same_fields_and_flags_win(tmp_path):
    cfg = tmp_path / "run.json"
    cfg.write_text(json.dumps({"data": "d", "vocab": "v", "output_dir": "o", "max_steps": 100, "learning_rate": 5e-4,
                               "config_name": "tiny"}))
    s = _settings(["pretrain", "--config", str(cfg), "--learning-rate", "1e-3"])
    assert (s.max_steps, s.learning_rate, s.config_name, s.output_dir) == (100, 1e-3, "tiny", Path("o"))
    cfg.write_text(json.dumps({"no_such_setting": 1}))
    with pytest.raises(ValueError, match="unknown settings .'no_such_setting'."):
        _settings(["pretrain", "--config", str(cfg)])


def test_missing_required_setting_names_the_flag(capsys):
    assert main(["pretrain", "--data", "d", "--vocab", "v"]) == 2
    err = capsys.readouterr().err
    assert "--output-dir" in err and "--max-steps" in err


def test_version_and_python_dash_m(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0 and capsys.readouterr().out.strip() == f"bertkit {__version__}"
    run = subprocess.run([sys.executable, "-m", "bertkit", "--help"], capture_output=True, text=True, check=True)
    for name in ("pretrain", "finetune", "create-pretraining-data", "extract-features"):
        assert name in run.stdout


def test_fine_tuning_scores_share_one_unit():
    from bertkit.tasks.metrics import to_fractions

    assert to_fractions({"f1": 90.5, "precision": 80.0, "total": 7, "per_type": {"PER": {"f1": 50.0}}}) == \
        {"f1": 0.905, "precision": 0.8, "total": 7, "per_type": {"PER": {"f1": 0.5}}}


def test_create_pretraining_data_runs_from_the_command_line(tmp_path, minilm_dir, capsys):
    """Every PretrainingConfig field the CLI passes reaches the library (random_next_prob once crashed it)."""
    corpus = tmp_path / "c.txt"
    corpus.write_text("one sentence here.\nanother one here.\n\nsecond doc first.\nsecond doc second.\n")
    assert main(["create-pretraining-data", str(corpus), "--vocab", str(minilm_dir / "vocab.txt"), "--output-dir",
                 str(tmp_path / "out"), "--input-format", "sentences", "--dupe-factor", "1", "--random-next-prob",
                 "0.3", "--no-progress"]) == 0
    assert json.loads(capsys.readouterr().out)["shards"] == 1
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["config"]["random_next_prob"] == 0.3


@pytest.mark.parametrize("command", ["create-pretraining-data", "pretrain"])
def test_a_vocab_file_not_named_vocab_txt_is_refused(tmp_path, minilm_dir, capsys, command):
    """--vocab DIR/small.txt once read DIR/vocab.txt, another vocabulary, without a word."""
    for name in ("vocab.txt", "tokenizer_config.json"):
        shutil.copy(minilm_dir / name, tmp_path / name)
    (tmp_path / "small.txt").write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\na\n")
    corpus = tmp_path / "c.txt"
    corpus.write_text("one sentence here.\nanother one here.\n")
    rest = ([str(corpus)] if command == "create-pretraining-data" else
            ["--data", str(tmp_path), "--max-steps", "1", "--config-name", "tiny"])
    assert main([command, *rest, "--vocab", str(tmp_path / "small.txt"), "--output-dir", str(tmp_path / "out")]) == 2
    assert f"--vocab {tmp_path / 'small.txt'} is a file other than vocab.txt" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


# Fields a command keeps off its command line, each for a stated reason (a new hidden field must be added here,
# so "every settings field is reachable" cannot erode quietly).
HIDDEN_FIELDS = {
    "num_train_epochs": "pre-training runs --max-steps; the shared field does not apply",
    "max_train_samples": "pre-training data is made smaller with create-pretraining-data",
    "task": "predict TASK: the command's name sets it",
    "optim": "one optimiser, AdamW: the field takes transformers' names for it from TrainingArguments",
}


@pytest.mark.parametrize("name,parser,cls", ALL, ids=[c[0] for c in ALL])
def test_only_known_fields_are_hidden_from_the_command_line(name, parser, cls):
    hidden = {f.name for f in dataclasses.fields(cls) if not on_command_line(f)}
    assert hidden <= set(HIDDEN_FIELDS), f"{name}: {sorted(hidden - set(HIDDEN_FIELDS))} have no flag"


def _settings_defaults() -> dict[str, set]:
    """Every value a settings field of any command defaults to, by field name."""
    out: dict[str, set] = {}
    for _, _, cls in ALL:
        for f in dataclasses.fields(cls):
            if f.default is not dataclasses.MISSING:
                out.setdefault(f.name, set()).add(f.default)
    return out


def _mirrors() -> list[tuple[object, str, type, tuple[str, ...]]]:
    """(library function, its parameter, settings class, the field or fields whose default it mirrors).

    Settings are plain data that import nothing from the library, and a library function keeps its own
    default (a named constant of its module) so it can be called without a settings object; the two are
    written twice on purpose, and these are the pairs that must say the same thing."""
    from bertkit import features
    from bertkit.training import feature_study, optim, token_tasks

    return [
        (optim.build_optimizer, "weight_decay", st.TrainingSettings, ("weight_decay",)),
        (optim.build_optimizer, "betas", st.TrainingSettings, ("adam_beta1", "adam_beta2")),
        (optim.build_optimizer, "eps", st.TrainingSettings, ("adam_epsilon",)),
        (token_tasks.predict_squad, "n_best_size", st.PredictSquadSettings, ("n_best_size",)),
        (token_tasks.predict_squad, "max_answer_length", st.PredictSquadSettings, ("max_answer_length",)),
        (token_tasks.predict_squad, "null_threshold", st.PredictSquadSettings, ("null_threshold",)),
        (token_tasks.predict_squad, "batch_size", st.PredictSquadSettings, ("batch_size",)),
        (token_tasks.predict_ner, "batch_size", st.PredictNerSettings, ("batch_size",)),
        (token_tasks.predict_swag, "batch_size", st.PredictSwagSettings, ("batch_size",)),
        (feature_study.BiLSTMTagger, "num_layers", st.StudySettings, ("lstm_layers",)),
        (feature_study.BiLSTMTagger, "dropout", st.StudySettings, ("dropout",)),
        (feature_study.extract_word_activations, "max_seq_length", st.StudySettings, ("max_seq_length",)),
        (feature_study.extract_word_activations, "batch_size", st.StudySettings, ("extract_batch_size",)),
        (features.extract_features, "layers", st.ExtractSettings, ("layers",)),
        (features.extract_features, "max_seq_length", st.ExtractSettings, ("max_seq_length",)),
        (features.extract_features, "batch_size", st.ExtractSettings, ("batch_size",)),
    ]


def test_library_defaults_agree_with_the_settings_defaults_they_mirror():
    """Calling a library function without an argument does what the command does without its flag: the
    function's default (``build_optimizer(eps=ADAM_EPSILON)``) equals the settings field's
    (``adam_epsilon: float = 1e-6``). A changed default on one side only fails here."""
    import inspect

    drift = []
    for function, parameter, cls, names in _mirrors():
        library = inspect.signature(function).parameters[parameter].default
        assert library is not inspect.Parameter.empty, f"{function.__qualname__}({parameter}) has no default"
        fields = {f.name: f.default for f in dataclasses.fields(cls)}
        command = tuple(fields[n] for n in names) if len(names) > 1 else fields[names[0]]
        if library != command:
            drift.append(f"{function.__qualname__}({parameter}={library!r}) but {cls.__name__}."
                         f"{'/'.join(names)} = {command!r}")
    assert not drift, "library and command defaults differ: " + "; ".join(drift)


def test_library_defaults_are_named_constants_not_restated_literals():
    """A recipe, the loop, the CLI or the demo that writes a command's default as a bare literal in a signature
    (``batch_size=64`` beside ``eval_batch_size: int = 64``) hides that it mirrors a setting; it names a
    constant of its module instead (``batch_size: int = EVAL_BATCH_SIZE``), which the test above can pair with
    the field. Numbers and tuples only: on/off switches and None mean "not given" everywhere. Optimizer classes
    keep their own published defaults, as torch.optim's do."""
    import ast

    import bertkit

    defaults = _settings_defaults()
    src = Path(bertkit.__file__).parent
    paths = [src / "cli.py", src / "demo.py", src / "features.py", *sorted((src / "training").glob("*.py"))]
    restated = []
    for path in paths:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        optimizers = {n.name for n in ast.walk(tree) if isinstance(n, ast.ClassDef)
                      and any(getattr(b, "id", getattr(b, "attr", "")) == "Optimizer" for b in n.bases)}
        skip = {id(f) for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name in optimizers
                for f in n.body}
        for fn in ast.walk(tree):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) or id(fn) in skip:
                continue
            args = fn.args
            positional = args.posonlyargs + args.args
            pairs = list(zip(positional[len(positional) - len(args.defaults):], args.defaults))
            pairs += [(a, d) for a, d in zip(args.kwonlyargs, args.kw_defaults) if d is not None]
            for arg, node in pairs:
                try:
                    value = ast.literal_eval(node)
                except ValueError:
                    continue  # a name or an expression: a named constant, or computed
                if isinstance(value, bool) or not isinstance(value, (int, float, tuple)):
                    continue
                if value in defaults.get(arg.arg, ()):
                    restated.append(f"{path.name}:{fn.lineno} {fn.name}({arg.arg}={value!r})")
    assert not restated, "settings defaults restated as literals (name a module constant): " + ", ".join(restated)


SEQUENCE_COMMANDS = [name for name, _, cls in ALL
                     if {"max_seq_length", "max_length"} & {f.name for f in dataclasses.fields(cls)}
                     and {"model_name_or_path", "model"} & {f.name for f in dataclasses.fields(cls)}]


@pytest.mark.parametrize("name", SEQUENCE_COMMANDS)
def test_a_sequence_length_beyond_the_models_positions_is_refused_at_once(name, tiny_checkpoint, tmp_path, capsys):
    """Was: --max-seq-length above the model's positions was accepted; the command locked its output directory,
    read its data and failed at the first long batch with the forward pass's advice to truncate in the tokenizer.
    Now every command that applies a model refuses it before anything else, naming both numbers and the fix."""
    model = tiny_checkpoint(tmp_path / "model", tokenizer=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a"],
                            max_position_embeddings=16)
    cls = COMMANDS[name].settings
    flag = "--max-seq-length" if "max_seq_length" in {f.name for f in dataclasses.fields(cls)} else "--max-length"
    values = {"task": "sst2" if name.endswith("glue") else "feature-extraction", "output_file": tmp_path / "out.jsonl"}
    argv = [*name.split(), flag, "17"]
    if "max_query_length" in {f.name for f in dataclasses.fields(cls)}:
        argv += ["--max-query-length", "8"]  # room for context in 17 tokens: that refusal comes from the flags alone
    for f in dataclasses.fields(cls):
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            value = model if f.name in ("model_name_or_path", "model") else values.get(f.name, tmp_path / f.name)
            argv += [f"--{f.name.replace('_', '-')}", str(value)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1] == (f"bertkit {name}: error: {flag} 17 exceeds max_position_embeddings 16 of "
                                            f"{model}: it has no position embedding beyond 16 tokens; pass {flag} 16 "
                                            "or less"), err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]  # nothing locked, made or written


def test_a_help_shows_the_default_a_command_gives_a_field_not_the_text_written_for_anothers():
    """Was: pretrain's --learning-rate help read "Default: the paper's rate for the task on models 768 wide and up,
    1e-4 below. (default: 0.0001)": the fine-tuning commands' rule beside the 1e-4 pre-training always runs at."""
    helps = {name: {a.dest: a.help for a in parser._actions} for name, parser, _ in ALL}
    assert helps["pretrain"]["learning_rate"] == "Peak learning rate. (default: 0.0001)"
    assert helps["finetune ner"]["learning_rate"] == ("Peak learning rate. Default: the paper's rate for the task on "
                                                      "models 768 wide and up, 1e-4 below.")
    assert helps["finetune glue"]["num_train_epochs"] == ("Passes over the training data (fractions allowed). "
                                                          "(default: 3.0)")
    # squad's batch is the paper's for its --version: its help said "(default: None)", the batch it never runs
    assert helps["finetune squad"]["batch_size"].endswith("(and processes). Default: the task's (the paper's): SQuAD's "
                                                          "32 for version 1.1, 48 for 2.0.")
    assert helps["finetune glue"]["batch_size"].endswith("(and processes). (default: 32)")


def test_help_loads_neither_torch_nor_numpy():
    """`bertkit COMMAND --help` and a usage error read the settings and the task list only: numpy, imported by the
    serving modules the task list reads, took 0.42 s of --help to 0.33 s on two busy cores."""
    code = ("import contextlib, io, sys\nfrom bertkit.cli import main\n"
            "for argv in (['--help'], ['serve', '--help'], ['predict', 'sentence-embedding', '--help'], ['pretrian']):\n"
            "    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):\n"
            "        try:\n            main(argv)\n        except SystemExit:\n            pass\n"
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'numpy', 'safetensors', 'tqdm'}))")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert run.stdout.split() == ["[]"]


@pytest.mark.parametrize("command", [["finetune", "ner", "--data-dir", "d", "--model", "m"],
                                     ["pretrain", "--data", "d", "--vocab", "v", "--max-steps", "1"]])
def test_resume_and_overwrite_together_are_refused(command, tmp_path, capsys):
    """Was: both were taken and --resume won without a word (a cut-short run continued where the user may have
    asked to start again), or a new run started under --resume where there was nothing to continue."""
    out = tmp_path / "o"
    assert main([*command, "--output-dir", str(out), "--resume", "--overwrite"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"bertkit {' '.join(command[:2]) if command[0] == 'finetune' else 'pretrain'}: error: --resume and "
        "--overwrite are both set: --resume continues the run in --output-dir from its last checkpoint, --overwrite "
        "starts it again (bertkit's files there are removed once the new run is finished); choose one"]
    assert not list(tmp_path.iterdir())


EMPTY = {"--output-dir": ["train-tokenizer", "CORPUS", "--output-dir", ""],
         "files": ["train-tokenizer", "", "--output-dir", "out"],
         "--vocab": ["create-pretraining-data", "CORPUS", "--vocab", "", "--output-dir", "out"],
         "--config": ["train-tokenizer", "CORPUS", "--config", "RUN_JSON"]}


@pytest.mark.parametrize("flag", EMPTY)
def test_an_empty_path_is_refused_not_read_as_the_working_directory(flag, tmp_path, monkeypatch, capsys):
    """Was: `--output-dir ""` became Path("") = ".", and train-tokenizer wrote its vocabulary into the working
    directory, unnamed; an empty --vocab or --model read the files there (errors.given_path refuses "" from
    Python)."""
    corpus = tmp_path / "c.txt"
    corpus.write_text("a good film here.\nthe cat sat.\n")
    (tmp_path / "run.json").write_text(json.dumps({"output_dir": ""}))
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    argv = [{"CORPUS": str(corpus), "RUN_JSON": str(tmp_path / "run.json")}.get(a, a) for a in EMPTY[flag]]
    try:
        code = main([*argv, "--vocab-size", "30"] if argv[0] == "train-tokenizer" else argv)
    except SystemExit as e:  # argparse's usage error
        code = e.code
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.endswith("an empty path; pass a path ('.' for the working directory)"), err
    assert not list(work.iterdir())
    assert main(["train-tokenizer", str(corpus), "--vocab-size", "30", "--no-progress", "--output-dir", "."]) == 0
    assert (work / "vocab.txt").is_file()  # "." is the working directory, asked for by name


def test_ctrl_c_ends_a_command_with_one_line_and_the_shells_status_not_a_traceback(tmp_path, monkeypatch, capsys):
    """Ctrl-C printed bertkit's note on what it kept, then a Python traceback of where the interrupt landed (some 50
    lines), and the process died by the signal; now one line and exit 130, as a shell reports SIGINT."""
    import bertkit.tokenization.trainer

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(bertkit.tokenization.trainer, "train_wordpiece_vocab", interrupted)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("a few words of text\n", encoding="utf-8")
    assert main(["train-tokenizer", str(corpus), "--output-dir", str(tmp_path / "out"), "--no-progress"]) == 130
    assert capsys.readouterr().err.strip().splitlines()[-1] == "bertkit train-tokenizer: interrupted"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus.txt"]


def test_a_flag_given_twice_with_two_values_is_refused_naming_both(capsys):
    """argparse kept the last of a repeated flag without a word (`predict ... --max-length 64 --max-length 128` ran at
    128); now every command's flags, by either spelling, refuse a second value with both shown; the same value twice
    is taken, and --config, a list of files, still takes several."""
    argv = ["predict", "text-classification", "--model", "m", "--input", "i.txt", "--output-file", "o.jsonl"]
    for extra, shown in ((["--max-length", "64", "--max_length=128"], "--max-length 64 and --max-length 128"),
                         (["--model-name-or-path", "n"], "--model m and --model-name-or-path n"),
                         (["--progress", "--no-progress"], "--progress and --no-progress")):
        with pytest.raises(SystemExit) as exit_info:
            main([*argv, *extra])
        assert exit_info.value.code == 2
        assert capsys.readouterr().err.strip().splitlines()[-1].endswith(f": given twice, as {shown}; give it once")
    s = _settings([*argv, "--max-length", "64", "--max-length", "64", "--overwrite", "--overwrite"])
    assert (s.max_length, s.overwrite) == (64, True)
    for name, parser, _ in ALL:  # every flag of every command that takes a value, given twice
        for action in parser._actions:
            if not action.option_strings or action.dest in ("help", "_config_file", "verbose"):
                continue
            values = [[], []] if action.nargs == 0 else [[action.choices[0]], [action.choices[-1]]] if (
                action.choices) else [["1"], ["2"]]
            twice = [action.option_strings[0], *values[0], action.option_strings[-1], *values[1]]
            if action.nargs == 0:
                twice[-1] = "--no-" + action.dest.replace("_", "-")
            with pytest.raises(SystemExit):
                parser.parse_args(twice)
            assert "given twice" in capsys.readouterr().err, (name, twice)


def test_verbose_is_taken_after_the_command_too():
    """`bertkit pretrain ... -v` said "unrecognized arguments: -v": only the top level took it."""
    for argv, verbose in ((["-v", "demo"], True), (["demo", "-v"], True), (["demo", "--verbose"], True), (["demo"], False)):
        assert build_parser("demo").parse_args(argv).verbose is verbose, argv


def test_download_example_model_reports_the_models_files_not_the_runs_bookkeeping(tmp_path, monkeypatch, capsys):
    """Its report listed ".bertkit-lock" and ".bertkit-partial" (the run's, in the directory while it is written)
    among the model's files."""
    import json

    from bertkit import examples
    from bertkit.cli import main

    def fake_download(out_dir):  # what unpack_example_wheel writes, without pip
        for name in ("config.json", "model.safetensors", "vocab.txt"):
            (Path(out_dir) / name).write_text("x", encoding="utf-8")
        return Path(out_dir)

    monkeypatch.setattr(examples, "download_example_model", fake_download)
    assert main(["download-example-model", str(tmp_path / "m")]) == 0
    assert json.loads(capsys.readouterr().out)["files"] == ["config.json", "model.safetensors", "vocab.txt"]
