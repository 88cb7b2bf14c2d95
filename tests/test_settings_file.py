"""``--config FILE``: a JSON object of a command's settings, named as their fields, as transformers'
``HfArgumentParser.parse_args_into_dataclasses(args_filename=...)`` reads one: every setting a flag gives (the
positional ones too), converted and checked as the flags are; several files merge in order; the command line wins."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from bertkit.cli import COMMANDS, build_parser, build_settings, main, normalize_argv


def _settings(argv: list[str]):
    args = build_parser().parse_args(normalize_argv(argv))
    name = f"{args.command} {args.family}" if "family" in vars(args) else args.command
    return build_settings(COMMANDS[name].settings, args)


def _config(path: Path, values: dict) -> str:
    path.write_text(json.dumps(values))
    return str(path)


def _data_files(out: Path) -> dict:
    return json.loads((out / ".bertkit-run.json").read_text())["files"]


def test_positional_settings_come_from_the_file(tmp_path, minilm_dir, monkeypatch, capsys):
    """Was: a config giving create-pretraining-data's "files" (or download-example-model's "output_dir") was refused,
    "the following arguments are required: files", before the file was read; the positional argument had to stay on
    the command line."""
    monkeypatch.chdir(tmp_path)
    Path("corpus.txt").write_text(
        "The cat sat on the mat. It was warm there.\n\nA dog ran home. It was late.\n" * 20
    )
    common = {"vocab": str(minilm_dir), "max_seq_length": 32, "progress": False}
    assert (
        main(
            [
                "create-pretraining-data",
                "corpus.txt",
                "--output-dir",
                "flags",
                "--vocab",
                str(minilm_dir),
                "--max-seq-length",
                "32",
                "--no-progress",
            ]
        )
        == 0
    )
    assert (
        main(
            [
                "create-pretraining-data",
                "--config",
                _config(tmp_path / "c.json", {"files": ["corpus.txt"], "output_dir": "file", **common}),
            ]
        )
        == 0
    )
    assert (
        main(
            [
                "create-pretraining-data",
                "--config",  # one path, as on the command line, is a list of one
                _config(tmp_path / "c.json", {"files": "corpus.txt", "output_dir": "one", **common}),
            ]
        )
        == 0
    )
    capsys.readouterr()
    assert _data_files(Path("flags")) == _data_files(Path("file")) == _data_files(Path("one"))
    # the command line's positional wins over the file's; neither: the name of what is missing
    s = _settings(
        [
            "create-pretraining-data",
            "cli.txt",
            "--config",
            _config(tmp_path / "c.json", {"files": ["file.txt"], "output_dir": "o", **common}),
        ]
    )
    assert s.files == [Path("cli.txt")]
    assert _settings(["create-pretraining-data", "--config", str(tmp_path / "c.json")]).files == [
        Path("file.txt")
    ]
    assert main(["create-pretraining-data", "--vocab", "v", "--output-dir", "o"]) == 2
    assert (
        capsys.readouterr()
        .err.strip()
        .endswith("error: missing required setting(s) files (on the command line or in --config)")
    )
    # an optional positional left out is not argparse's "==SUPPRESS==" placeholder taken for a path
    s = _settings(["download-example-model", "--config", _config(tmp_path / "d.json", {"output_dir": "m"})])
    assert s.output_dir == Path("m")
    assert _settings(
        ["download-example-model", "given", "--config", str(tmp_path / "d.json")]
    ).output_dir == Path("given")
    assert main(["download-example-model"]) == 2
    assert "missing required setting(s) output_dir" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "c.json",
        "corpus.txt",
        "d.json",
        "file",
        "flags",
        "one",
    ]


def test_several_files_merge_in_order_and_the_command_line_wins(tmp_path):
    """Was: a second --config replaced the first without a word, its settings dropped (transformers'
    ``args_file_flag`` reads every file given, a later one winning)."""
    base = _config(
        tmp_path / "base.json",
        {
            "task": "rte",
            "data_dir": "d",
            "model_name_or_path": "m",
            "output_dir": "o",
            "max_seq_length": 64,
            "seed": 3,
        },
    )
    over = _config(tmp_path / "over.json", {"max_seq_length": 32})
    s = _settings(["finetune", "glue", "--config", base, "--config", over])
    assert (s.task, s.max_seq_length, s.seed) == ("rte", 32, (3,))
    s = _settings(["finetune", "glue", "--config", over, "--config", base, "--seed", "5"])
    assert (s.max_seq_length, s.seed) == (64, (5,))


@pytest.mark.parametrize(
    "value,shown", [(5, "5 (int)"), (True, "True (bool)"), ({"a": 1}, "{'a': 1} (dict)")]
)
def test_a_path_setting_of_another_json_type_is_named(tmp_path, capsys, value, shown):
    """Was: ``"output_dir": 5`` in a settings file crashed with a traceback, "TypeError: expected str, bytes or
    os.PathLike object, not int" (exit 1)."""
    cfg = _config(
        tmp_path / "c.json", {"task": "rte", "data_dir": "d", "model_name_or_path": "m", "output_dir": value}
    )
    assert main(["finetune", "glue", "--config", cfg]) == 2
    assert (
        capsys.readouterr().err.strip()
        == f"bertkit finetune glue: error: output_dir must be a path, got {shown}"
    )
    cfg = _config(tmp_path / "c.json", {"files": [3], "output_dir": "o"})
    assert main(["train-tokenizer", "--config", cfg]) == 2
    assert "error: files must be list[Path], got [3] (list)" in capsys.readouterr().err


def test_yaml_and_other_shapes_are_refused_with_what_to_do(tmp_path, capsys):
    """Was: a YAML file (transformers' ``parse_yaml_file`` reads one) was "not valid JSON (Expecting value: line 1
    column 1 (char 0))"; a JSON list or null did not say what it held."""
    argv = ["finetune", "glue", "--task", "rte", "--data-dir", "d", "--model", "m", "--out", "o", "--config"]
    (tmp_path / "run.yaml").write_text("max_seq_length: 64\nseed: 3\n")
    assert main([*argv, str(tmp_path / "run.yaml")]) == 2
    err = capsys.readouterr().err
    assert (
        f"--config {tmp_path / 'run.yaml'}: a YAML file; --config reads JSON only" in err
        and "yaml.safe_load" in err
    )
    (tmp_path / "run.yml").write_text('{"seed": 3}')  # YAML that is JSON reads as JSON
    assert _settings([*argv, str(tmp_path / "run.yml")]).seed == (3,)
    for text, held in (('[{"seed": 3}]', "list"), ("null", "null"), ("3", "int")):
        (tmp_path / "run.json").write_text(text)
        assert main([*argv, str(tmp_path / "run.json")]) == 2
        assert (
            capsys.readouterr()
            .err.strip()
            .endswith(
                f"--config {tmp_path / 'run.json'}: expected a JSON object of setting names to values, got {held}"
            )
        )


def test_a_runs_recorded_settings_are_a_settings_file(tmp_path, capsys):
    """The settings a run records in its .bertkit-run.json (``resume_fingerprint``) read back as --config give the
    same settings. Was: pretrain's recorded num_train_epochs and max_train_samples (fixed by the command, no flags)
    were "unknown settings", so a recorded pretrain run could not be run again from its record."""
    from bertkit.settings import resume_fingerprint

    s = _settings(
        [
            "pretrain",
            "--data",
            "d",
            "--vocab",
            "v",
            "--output-dir",
            "o",
            "--max-steps",
            "7",
            "--config-name",
            "tiny",
            "--no-nsp",
            "--learning-rate",
            "3e-4",
        ]
    )
    recorded = resume_fingerprint(s)
    assert (recorded["num_train_epochs"], recorded["max_train_samples"]) == (None, None)
    again = _settings(["pretrain", "--config", _config(tmp_path / "run.json", recorded)])
    assert resume_fingerprint(again) == recorded
    # such a field at another value is refused by name: pretrain runs --max-steps, not epochs
    assert (
        main(["pretrain", "--config", _config(tmp_path / "run.json", {**recorded, "num_train_epochs": 3})])
        == 2
    )
    assert capsys.readouterr().err.strip() == (
        f"bertkit pretrain: error: --config {tmp_path / 'run.json'}: num_train_epochs 3 is not a setting of this "
        "command (fixed at None); remove it"
    )


def test_a_setting_spelled_both_ways_is_given_twice(tmp_path, capsys):
    """Was: ``{"max_seq_length": 64, "max-seq-length": 128}`` ran at 128 without a word (the dash spelling, read as
    the same field, silently replaced the first; the same key twice was already refused)."""
    cfg = tmp_path / "run.json"
    cfg.write_text(
        '{"task": "rte", "data_dir": "d", "model_name_or_path": "m", "output_dir": "o", '
        '"max_seq_length": 64, "max-seq-length": 128}'
    )
    assert main(["finetune", "glue", "--config", str(cfg)]) == 2
    assert capsys.readouterr().err.strip() == (
        f"bertkit finetune glue: error: --config {cfg}: the setting 'max_seq_length' is given twice (as "
        "'max-seq-length' too); give it once"
    )
    cfg.write_text(
        '{"task": "rte", "data_dir": "d", "model_name_or_path": "m", "output_dir": "o", "max-seq-length": 96}'
    )
    assert _settings(["finetune", "glue", "--config", str(cfg)]).max_seq_length == 96


@pytest.mark.parametrize(
    "values,message",
    [
        ({"seed": 3.5}, "seed must be tuple[int, ...], got 3.5 (float)"),
        ({"seed": True}, "seed must be tuple[int, ...], got True (bool)"),
        (
            {"learning_rate": {"lr": 1e-4}},
            "learning_rate must be tuple[float, ...] or None, got {'lr': 0.0001} (dict)",
        ),
    ],
)
def test_a_grid_setting_of_another_json_type_is_named(tmp_path, capsys, values, message):
    """Was: ``"seed": 3.5`` in a GLUE settings file crashed with "TypeError: 'float' object is not iterable" and a
    traceback (exit 1); a JSON object for learning_rate became the tuple of its keys."""
    base = {"task": "rte", "data_dir": "d", "model_name_or_path": "m", "output_dir": "o"}
    assert main(["finetune", "glue", "--config", _config(tmp_path / "c.json", {**base, **values})]) == 2
    assert capsys.readouterr().err.strip() == f"bertkit finetune glue: error: {message}"
    s = _settings(
        [
            "finetune",
            "glue",
            "--config",
            _config(tmp_path / "c.json", {**base, "seed": 4, "learning_rate": 1}),
        ]
    )
    assert (s.seed, s.learning_rate) == ((4,), (1,))


def test_every_settings_field_refuses_any_json_value_by_name(tmp_path):
    """Every command's every setting, given each JSON type in a settings file, builds or is refused with a
    BertkitError (one line, exit 2), never another exception (a traceback). Was: finetune squad's ``"version": {}``
    crashed with "TypeError: unhashable type: 'dict'" (and glue's ``"seed": 3.5``, ``"output_dir": 5``: above)."""
    import argparse
    import dataclasses

    from bertkit.errors import BertkitError
    from bertkit.settings.fields import on_command_line

    cfg = tmp_path / "c.json"
    for name, command in COMMANDS.items():
        fields = [f for f in dataclasses.fields(command.settings) if on_command_line(f)]
        required = {
            f.name: {"files": ["a.txt"], "task": "rte", "max_steps": 1}.get(f.name, "x")
            for f in fields
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        }
        required.update({"output_file": "o.jsonl"} if "output_file" in required else {})
        for f in fields:
            for value in (5, True, None, {}, "x", 1.5, [1]):  # each JSON type
                # A new file each time: ext4 flushes a file truncated to zero and rewritten (auto_da_alloc),
                # 3 ms a time over these 4,700 rewrites.
                cfg.unlink(missing_ok=True)
                cfg.write_text(json.dumps({**required, f.name: value}))
                try:
                    build_settings(command.settings, argparse.Namespace(_config_file=[cfg]))
                except BertkitError:
                    pass
                except Exception as e:  # noqa: BLE001 - the test names what escaped
                    pytest.fail(f"{name}: {f.name}={value!r}: {type(e).__name__}: {e}")


def test_a_models_config_json_is_named_as_such(minilm_dir, capsys):
    """Was: ``bertkit pretrain --config MODEL/config.json`` (run_mlm.py's --config_name is a model's config) listed 20
    "unknown settings" and the 45 known ones, not what the file is nor where it goes."""
    config = minilm_dir / "config.json"
    assert (
        main(
            [
                "pretrain",
                "--data",
                "d",
                "--vocab",
                "v",
                "--out",
                "o",
                "--max-steps",
                "2",
                "--config",
                str(config),
            ]
        )
        == 2
    )
    assert capsys.readouterr().err.strip() == (
        f"bertkit pretrain: error: --config {config} is a model's config.json (hidden_size, num_attention_heads, "
        "...); --config takes this command's settings: pass a model's directory as --model, and a model shape to "
        "pretrain as --config-name FILE"
    )


@pytest.mark.parametrize("value", [5, {"hidden_size": 64}, ["tiny"], None])
def test_a_model_shape_of_another_json_type_is_named(tmp_path, capsys, value):
    """Was: pretrain's config_name (typed Any) took any JSON value, and the run crashed later with "TypeError:
    expected str, bytes or os.PathLike object, not int" and a traceback (exit 1)."""
    cfg = _config(
        tmp_path / "c.json",
        {"data": "d", "vocab": "v", "output_dir": "o", "max_steps": 1, "config_name": value},
    )
    assert main(["pretrain", "--config", cfg]) == 2
    shown = {list: "('tiny',) (tuple)"}.get(type(value), f"{value!r} ({type(value).__name__})")
    assert capsys.readouterr().err.strip() == (
        f"bertkit pretrain: error: config_name must be a str or a path or BertConfig, got {shown}"
    )


def test_a_flags_other_spelling_is_named_with_its_field(tmp_path, capsys):
    """Was: ``{"lr": 1e-4, "out": "o"}`` (the flags --lr and --out) was "unknown settings ['lr', 'out']" and the list
    of 45 known ones, not which name each one goes by."""
    cfg = _config(tmp_path / "c.json", {"data_dir": "d", "model": "m", "out": "o", "lr": 1e-4})
    assert main(["finetune", "ner", "--config", cfg]) == 2
    assert capsys.readouterr().err.strip() == (
        f"bertkit finetune ner: error: --config {cfg}: a settings file names each setting by its field: "
        "'learning_rate' for 'lr', 'model_name_or_path' for 'model', 'output_dir' for 'out'"
    )


SETTING_OF_A_PART_NOT_THERE = [  # (command, setting, value, the message's tail); each ran without a word, and without it
    (["pretrain", "--data", "d", "--vocab", "v", "--max-steps", "2"], "phase1_fraction", 0.5,
     "splits --max-steps between --data and --phase2-data: add --phase2-data, or drop --phase1-fraction"),
    (["pretrain", "--data", "d", "--vocab", "v", "--max-steps", "2"], "eval_steps", 1.0,
     "sets when or how the held-out instances of --eval-data are scored: add --eval-data, or drop --eval-steps"),
    (["pretrain", "--data", "d", "--vocab", "v", "--max-steps", "2"], "eval_instances", 5,
     "sets when or how the held-out instances of --eval-data are scored: add --eval-data, or drop --eval-instances"),
    (["finetune", "squad", "--model", "m", "--predict-file", "p.json", "--train-file", "t.json"], "heldout_fraction",
     0.5, "splits --predict-file into training and held-out articles, which only a run without --train-file does "
     "(with one, all of --predict-file is scored): drop --heldout-fraction, or --train-file"),
    (["finetune", "squad", "--model", "m", "--predict-file", "p.json", "--train-file", "t.json"], "split_seed", 3,
     "splits --predict-file into training and held-out articles"),
    (["predict", "squad", "--model", "m", "--predict-file", "p.json"], "null_threshold", 3.0,
     "sets when to predict no answer, which only --version 2.0 does (version 1.1 answers every question): add "
     "--version 2.0, or drop --null-threshold"),
]


@pytest.mark.parametrize("argv,name,value,message", SETTING_OF_A_PART_NOT_THERE,
                         ids=[c[1] for c in SETTING_OF_A_PART_NOT_THERE])
def test_a_setting_of_a_part_of_the_run_that_is_not_there_is_refused(argv, name, value, message, tmp_path,
                                                                      monkeypatch, capsys):
    """Was: `pretrain --phase1-fraction 0.5` without --phase2-data, `--eval-steps`/`--eval-instances` without
    --eval-data, `finetune squad --heldout-fraction`/`--split-seed` with --train-file and `predict squad
    --null-threshold` on version 1.1 each ran to the end as if not given. Refused from a flag or a file alike; the
    default value, which says nothing, is taken."""
    monkeypatch.chdir(tmp_path)
    flag = f"--{name.replace('_', '-')}"
    base = [*argv, "--output-dir", "out"]
    assert main([*base, flag, str(value)]) == 2
    assert f"error: {flag} {value} {message}" in capsys.readouterr().err
    assert main([*base, "--config", _config(tmp_path / "run.json", {name: value})]) == 2
    assert f"error: {flag} {value} {message}" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.json"]  # refused before an output directory was made
    s = _settings(base)  # not given: the default, which changes nothing
    assert getattr(s, name) == next(f.default for f in dataclasses.fields(s) if f.name == name)


@pytest.mark.parametrize("strategy", ["steps", "epoch"])
def test_pretrain_eval_strategy_without_eval_data_is_refused(strategy, tmp_path, monkeypatch, capsys):
    """Was: `pretrain --eval-strategy steps` (and, after that was refused, `--eval-strategy epoch`) without
    --eval-data ran to the end with no evaluation, its summary.json and metrics.jsonl those of a run without the
    flag, and the setting recorded as if it had acted. Unset, it is "no" there (it was "epoch": nothing evaluated)."""
    monkeypatch.chdir(tmp_path)
    base = ["pretrain", "--data", "d", "--vocab", "v", "--max-steps", "2", "--output-dir", "out"]
    message = (f"error: --eval-strategy {strategy} sets when or how the held-out instances of --eval-data are scored: "
               "add --eval-data, or drop --eval-strategy")
    assert main([*base, "--eval-strategy", strategy]) == 2
    assert message in capsys.readouterr().err
    assert main([*base, "--config", _config(tmp_path / "run.json", {"eval_strategy": strategy})]) == 2
    assert message in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.json"]
    assert _settings([*base, "--eval-strategy", "no"]).eval_strategy == "no"
    assert _settings(base).eval_strategy == "no"
    assert _settings([*base, "--eval-data", "e", "--eval-strategy", strategy]).eval_strategy == strategy
    assert _settings([*base, "--eval-data", "e"]).eval_strategy == "epoch"


@pytest.mark.parametrize("asked", [["--eval-strategy", "epoch"], ["--eval-strategy", "steps"], ["--eval-steps", "2"],
                                   ["--eval-delay", "1"]])
def test_finetune_swag_refuses_an_evaluation_on_an_unlabelled_file(asked, tmp_path, monkeypatch, capsys):
    """Was: `finetune swag --eval-strategy epoch` on test.csv was accepted and scored nothing (report per_epoch [], no
    eval record in metrics.jsonl), the setting recorded as if it had acted; steps and a delay were refused by a second
    check in the task, after the model loaded. Now all are refused by the settings; unset, the run does not
    evaluate, and on a labelled file each is taken."""
    monkeypatch.chdir(tmp_path)
    header = "video-id,fold-ind,startphrase,sent1,sent2,gold-source,ending0,ending1,ending2,ending3"
    Path("test.csv").write_text(f"{header}\nv,1,a b,a,b,gold,c,d,e,f\n")
    Path("val.csv").write_text(f"{header},label\nv,1,a b,a,b,gold,c,d,e,f,0\n")
    base = ["finetune", "swag", "--train-file", "val.csv", "--model", "m", "--output-dir", "out"]
    assert main([*base, "--predict-file", "test.csv", *asked]) == 2
    shown = {"2": "2.0", "1": "1.0"}.get(asked[1], asked[1])  # the number as read
    assert (f"error: {asked[0]} {shown} sets when the loop scores --predict-file test.csv, which has no label column "
            f"(a test file): nothing would be scored; drop {asked[0]}, or give a labelled --predict-file (val.csv)"
            ) in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["test.csv", "val.csv"]
    assert _settings([*base, "--predict-file", "test.csv"]).eval_strategy == "no"
    labelled = _settings([*base, "--predict-file", "val.csv", *asked])
    assert labelled.eval_strategy == (asked[1] if asked[0] == "--eval-strategy" else
                                      "steps" if asked[0] == "--eval-steps" else "epoch")


def test_transformers_and_google_names_bertkit_spells_otherwise_say_what_to_give(tmp_path, capsys):
    """Was: `--per_device_train_batch_size 8` (run_glue.py's), `--do_train` or google's `--warmup_proportion` said
    only "unrecognized arguments"; now what each is here, on the command line and in a settings file."""
    base = ["finetune", "glue", "--task", "rte", "--data-dir", "d", "--model", "m", "--out", "o"]
    with pytest.raises(SystemExit) as exit_info:
        main([*base, "--per_device_train_batch_size", "8", "--do_train", "--warmup_proportion=0.1"])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "bertkit: error: unrecognized arguments: --per-device-train-batch-size 8 --do-train --warmup-proportion=0.1 "
        "(--per-device-train-batch-size is per process: give --batch-size, the global batch (per process x processes "
        "x --gradient-accumulation-steps); --do-train is no flag here (bertkit finetune TASK trains and scores on dev, "
        "bertkit predict TASK predicts): leave it out; --warmup-proportion is --warmup-ratio here)")
    with pytest.raises(SystemExit):
        main([*base, "--bogus", "1"])
    assert capsys.readouterr().err.strip().splitlines()[-1] == "bertkit: error: unrecognized arguments: --bogus 1"
    assert main([*base, "--config", _config(tmp_path / "hf.json", {"evaluation_strategy": "epoch"})]) == 2
    assert ("unknown settings ['evaluation_strategy'] (--evaluation-strategy is --eval-strategy here (transformers' "
            "newer name)); known: ") in capsys.readouterr().err
