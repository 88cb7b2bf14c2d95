"""What an earlier bertkit wrote, read by this one: a run directory whose manifest predates a setting added since
--resumes as the run it is (the setting at its default), and refuses a changed one by name."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest
import torch

from bertkit.cli import main

WORDS = ["the", "a", "said", "peter", "maria", "paris", "rome"]


@pytest.fixture(scope="module")
def setup(tmp_path_factory, tiny_checkpoint) -> Path:
    """A tiny encoder and 8 CoNLL sentences: 2 steps of batch 4."""
    root = tmp_path_factory.mktemp("older-runs")
    tiny_checkpoint(root / "model", tokenizer=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS],
                    max_position_embeddings=64)
    lines = []
    for i in range(8):
        lines += [f"{WORDS[(i + j) % 7]} X X {'B-PER' if WORDS[(i + j) % 7] in ('peter', 'maria') else 'O'}"
                  for j in range(4)] + [""]
    (root / "conll").mkdir()
    for split in ("train", "valid", "test"):
        (root / "conll" / f"{split}.txt").write_text("\n".join(lines) + "\n")
    return root


def _run(root: Path, out: Path, *extra: str) -> tuple[int, str]:
    err, threads = io.StringIO(), torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            code = main(["finetune", "ner", "--data-dir", str(root / "conll"), "--model", str(root / "model"),
                         "--output-dir", str(out), "--max-steps", "2", "--batch-size", "4", "--max-seq-length", "32",
                         "--learning-rate", "1e-3", "--no-progress", "--device", "cpu", *extra])
    except SystemExit as e:
        code = e.code
    finally:
        torch.set_num_threads(threads)
    return code, err.getvalue()


def test_resume_of_a_run_from_before_a_setting_existed(setup, tmp_path):
    """--eval-delay came after the run (bertkit of 2026-11-28 wrote no eval_delay): the resume was refused with
    '--eval-delay None then, 0 now' though nothing had changed; now the missing entry reads as the default 0."""
    out = tmp_path / "run"
    assert _run(setup, out)[0] == 0
    marker = out / ".bertkit-run.json"
    record = json.loads(marker.read_text())
    assert record["fingerprint"]["eval_delay"] == 0
    del record["fingerprint"]["eval_delay"]
    marker.write_text(json.dumps(record))
    report = json.loads((out / "report.json").read_text())

    code, err = _run(setup, out, "--eval-delay", "1", "--resume")
    assert code != 0 and "--eval-delay 0 then, 1.0 now" in err, err
    code, err = _run(setup, out, "--resume")
    assert code == 0, err
    assert "other settings" not in err
    again = json.loads((out / "report.json").read_text())
    assert (again["dev"], again["test"], again["steps"]) == (report["dev"], report["test"], report["steps"])


# model_config as a pre-training checkpoint of bertkit until 2026-11-28 recorded it (config.json's _name_or_path
# kept, its architectures dropped), and the fine-tuning fingerprint before labels and train_data were recorded
OLD_CONFIG = {"_name_or_path": "nreimers/MiniLM-L6-H384-uncased", "gradient_checkpointing": False,
              "transformers_version": "4.8.2", "use_cache": True, "vocab_size": 30522, "hidden_size": 384,
              "num_hidden_layers": 1, "num_attention_heads": 12, "intermediate_size": 1536, "hidden_act": "gelu",
              "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1, "max_position_embeddings": 512,
              "type_vocab_size": 2, "initializer_range": 0.02, "layer_norm_eps": 1e-12, "pad_token_id": 0,
              "position_embedding_type": "absolute", "model_type": "bert"}


def test_pretraining_checkpoint_of_an_earlier_config_form_resumes(tmp_path):
    """The same model, its config recorded in the earlier form: refused before as other settings
    ('model_config._name_or_path': ('nreimers/...', None), 'model_config.architectures': (None, ['BertModel']))."""
    from bertkit.config import BertConfig
    from bertkit.training.resume_point import refuse_other_run

    (tmp_path / "config.json").write_text(json.dumps({**OLD_CONFIG, "architectures": ["BertModel"]}))
    now = {"model_config": BertConfig.from_pretrained(tmp_path).to_dict(), "max_steps": 4, "nsp": True}
    refuse_other_run(tmp_path, now, {"model_config": OLD_CONFIG, "max_steps": 4, "nsp": True})
    with pytest.raises(Exception, match=r"other settings or data .*'model_config.hidden_size': \(256, 384\)"):
        refuse_other_run(tmp_path, now, {"model_config": {**OLD_CONFIG, "hidden_size": 256, "num_attention_heads": 4},
                                         "max_steps": 4, "nsp": True})


def test_trainer_checkpoint_of_an_earlier_config_form_resumes(tmp_path):
    """The Trainer's fingerprint holds the model's config too (trainer.model): a checkpoint of bertkit.Trainer of
    2026-11-28 was refused ('trainer.model._name_or_path': ('nreimers/...', None)); it resumed there to the
    uninterrupted run's weights bit for bit once compared as the model it describes."""
    from bertkit.config import BertConfig
    from bertkit.training.resume_point import refuse_other_run

    (tmp_path / "config.json").write_text(json.dumps({**OLD_CONFIG, "architectures": ["BertModel"]}))
    trainer = {"examples": 32, "train_data": "4f1c", "world_size": 1}
    now = {"train": {"seed": 1}, "trainer": {**trainer, "model": BertConfig.from_pretrained(tmp_path).to_dict()}}
    refuse_other_run(tmp_path, now, {"train": {"seed": 1}, "trainer": {**trainer, "model": OLD_CONFIG}}, 1)
    with pytest.raises(Exception, match=r"'trainer.model.num_hidden_layers': \(2, 1\)"):
        refuse_other_run(tmp_path, now, {"train": {"seed": 1},
                                         "trainer": {**trainer, "model": {**OLD_CONFIG, "num_hidden_layers": 2}}})


def test_finetuning_checkpoint_without_labels_and_data_is_refused_as_older(tmp_path):
    """A checkpoint written before labels and train_data were recorded cannot be checked against the data: refused
    naming state.pt, the earlier bertkit and the fix (before: 'written by a run with other settings or data ...
    labels: (None, [...])', a fix of resuming with the settings it already had)."""
    from bertkit.training.resume_point import refuse_other_run

    train = {"learning_rate": 1e-4, "seed": 1}
    saved = {"train": train, "model": "m1", "task": "sst-2"}
    with pytest.raises(Exception) as e:
        refuse_other_run(tmp_path, {**saved, "train_data": "b0771123", "labels": ["0", "1"]}, saved)
    message = str(e.value)
    assert "state.pt was written by an earlier bertkit, which did not record labels, train_data" in message
    assert "finish the run with the bertkit version that started it, or start it again (--overwrite" in message
    with pytest.raises(Exception, match=r"other settings or data .*'task': \('sst-2', 'cola'\)"):
        refuse_other_run(tmp_path, {**saved, "task": "cola", "train_data": "b0771123"}, saved)
    # the sentence trainers' loss settings, recorded since 2026-11-29 20:05
    with pytest.raises(Exception, match=r"earlier bertkit, which did not record loss; .* where they differ"):
        refuse_other_run(tmp_path, {**saved, "loss": {"MultipleNegativesRankingLoss": {"scale": 20.0}}}, saved)
    # and their model's modules, recorded from format 3 (2026-12-02): a format-2 checkpoint without them is an older
    # bertkit's; in a format-3 one, an absent entry is one not set then
    modules = {"0": {"Transformer": {}}, "1": {"Pooling": {"modes": ["mean"]}}}
    with pytest.raises(Exception, match=r"earlier bertkit, which did not record modules; .* where they differ"):
        refuse_other_run(tmp_path, {**saved, "modules": modules}, saved, 2)
    with pytest.raises(Exception, match=r"other settings or data .*'modules': \(None, \{"):
        refuse_other_run(tmp_path, {**saved, "modules": modules}, saved, 3)


def test_checkpoints_record_their_format_and_a_newer_one_is_refused(tmp_path):
    """state.pt carries its format (3); one of a newer bertkit is refused naming the file and the fix, and in a
    format-3 checkpoint an absent entry is one not set then (another setting), not an earlier bertkit's."""
    from bertkit.training.checkpoint import STATE_FORMAT, read_state, save_checkpoint
    from bertkit.training.resume_point import refuse_other_run

    state = {"model": {"w": torch.ones(2)}, "optimizer": {}, "scheduler": {}, "scaler": {}, "position": {"step": 1},
             "fingerprint": {"task": "sst-2"}, "rank_rng": [], "world_size": 1, "windows": [{}]}
    path = save_checkpoint(tmp_path, state, 1, keep=2)
    assert torch.load(path / "state.pt", weights_only=True)["format"] == STATE_FORMAT == 3
    assert read_state(path)["fingerprint"] == {"task": "sst-2"}
    with pytest.raises(Exception, match=r"other settings or data .*'labels': \(None, \['0', '1'\]\)"):
        refuse_other_run(path, {"task": "sst-2", "labels": ["0", "1"]})
    torch.save({**state, "format": 4}, path / "state.pt")
    with pytest.raises(Exception, match=r"state.pt is of checkpoint format 4, written by a newer bertkit \(this one "
                                        r"reads formats 1 to 3\): resume it with that version, or upgrade"):
        read_state(path)


def _pretrain_args(root: Path, out: Path) -> list[str]:
    return ["pretrain", "--data", str(root / "data"), "--vocab", str(root / "vocab"), "--config-name", "tiny",
            "--out", str(out), "--max-steps", "6", "--save-steps", "2", "--logging-steps", "1", "--batch-size", "8",
            "--lr", "1e-3", "--no-progress"]


def _killed_before_step(args: list[str], step: int) -> None:
    """``bertkit args`` in a forked child that exits hard as its ``step``-th optimiser step begins."""
    import os

    from killing import run_here

    pid = os.fork()
    if pid == 0:
        from torch.optim.optimizer import register_optimizer_step_pre_hook

        calls = [0]

        def stop(*_: object) -> None:
            calls[0] += 1
            if calls[0] == step:
                os._exit(9)

        register_optimizer_step_pre_hook(stop)
        run_here(args)
        os._exit(0)
    assert os.waitpid(pid, 0)[1] >> 8 == 9


def _as_written_earlier(run: Path, rng) -> list[str]:
    """The killed run's files rewritten into forms earlier bertkit versions wrote, chosen by ``rng``: its manifest
    without settings added since (those at their defaults), checkpoints without a format mark, logging state or
    with the earlier model_config form. Returns what was changed."""
    from bertkit.settings import PretrainSettings, fingerprint_defaults
    from killing import in_progress

    changed, stage = [], in_progress(run)
    partial = stage / ".bertkit-partial"
    record = json.loads(partial.read_text())
    defaults = fingerprint_defaults(PretrainSettings)
    at_default = sorted(k for k, v in record["fingerprint"].items() if k in defaults and v == defaults[k])
    for name in rng.sample(at_default, rng.randint(1, 4)):
        del record["fingerprint"][name]
        changed.append(f"manifest without {name}")
    partial.write_text(json.dumps(record))
    for state_file in sorted(stage.glob("checkpoints/step-*/state.pt")):
        state = torch.load(state_file, weights_only=True)
        for key in ("format", "last_step", "records", "optimizer_parameters"):
            if rng.random() < 0.7:
                state.pop(key, None)
                changed.append(f"{state_file.parent.name} without {key}")
        if rng.random() < 0.7:
            config = dict(state["fingerprint"]["model_config"])
            config.pop("architectures", None)
            state["fingerprint"]["model_config"] = {"_name_or_path": "bert-tiny", **config}
            changed.append(f"{state_file.parent.name}'s earlier model_config")
        torch.save(state, state_file)
    return changed


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1])
def test_a_killed_pretraining_run_in_an_earlier_form_resumes_to_the_same_weights(tiny_pretraining_data, tmp_path,
                                                                                    seed):
    """A pre-training run killed by an earlier bertkit (its manifest and checkpoints in the forms bertkit wrote on
    2026-11-26 to -29), resumed by this one, ends with the uninterrupted run's weights and losses: it was refused
    ('--eval-delay None then, 0 now'; 'model_config._name_or_path': (..., None))."""
    import random

    from safetensors.torch import load_file

    from killing import run_here

    rng = random.Random(seed)
    full, killed = tmp_path / "full", tmp_path / "killed"
    assert run_here(_pretrain_args(tiny_pretraining_data, full)) == 0
    _killed_before_step(_pretrain_args(tiny_pretraining_data, killed), rng.choice([3, 5]))
    changed = _as_written_earlier(killed, rng)
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        assert run_here([*_pretrain_args(tiny_pretraining_data, killed), "--resume"]) == 0, (changed, err.getvalue())
    a, b = (load_file(str(d / "final" / "model.safetensors")) for d in (full, killed))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), changed
    losses = [[json.loads(x)["loss"] for x in (d / "metrics.jsonl").read_text().splitlines() if '"train"' in x]
              for d in (full, killed)]
    assert losses[0] == losses[1] and len(losses[0]) == 6, changed


def test_tokenizer_digest_of_a_sentence_checkpoint_is_the_one_earlier_versions_took(tmp_path, tiny_checkpoint):
    """model_input_names became a tokenizer attribute on 2026-11-30, and the sentence trainers' checkpoints hash the
    tokenizer's state: every earlier checkpoint was refused ('trainer.train_data.tokenizer': ('60b02a...',
    '87041...')). At its default the attribute is left out (the digest earlier versions took, where a checkpoint of
    2026-11-29 resumed to the uninterrupted run's weights bit for bit); set otherwise, the digest changes."""
    import hashlib
    import pickle

    from bertkit.sentence import SentenceTransformer
    from bertkit.sentence.data import tokenizer_fingerprint

    tiny_checkpoint(tmp_path / "m", tokenizer=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS])
    model = SentenceTransformer(tmp_path / "m", device="cpu")
    state = {k: v for k, v in model.tokenizer.__getstate__().items() if k != "model_input_names"}
    earlier = hashlib.blake2b(pickle.dumps(sorted(state.items()), protocol=4), digest_size=16).hexdigest()
    assert tokenizer_fingerprint(model) == earlier
    model.tokenizer.model_input_names = ["input_ids", "attention_mask"]
    assert tokenizer_fingerprint(model) != earlier


def test_a_directory_recorded_by_bertkit_before_manifests_is_named_as_such(tmp_path):
    """bertkit until 2026-11-26 recorded a run's files by name only (a registry, no sha256). Its int8 directory is
    refused at load with the fix `bertkit quantize ... --overwrite`, which was then refused as 'not a run marker this
    bertkit wrote (damaged, or from another version)'; it now names the earlier bertkit, what it cannot prove, and
    the fixes, and still removes nothing."""
    from bertkit.runs import output_dir

    run = tmp_path / "q"
    run.mkdir()
    (run / "config.json").write_text("{}")
    (run / ".bertkit-run.json").write_text(json.dumps(
        {"command": "quantize", "fingerprint": {}, "cwd": str(tmp_path), "started": 1796063892.7, "finished": True,
         "pid": 25541, "files": ["config.json"]}))
    with pytest.raises(Exception) as e, output_dir(run, "quantize", overwrite=True):
        pass
    assert (f"{run / '.bertkit-run.json'} is the record of a `bertkit quantize` run by a bertkit before 2026-11-26, "
            "which listed its files without their sha256") in str(e.value)
    assert f"finish the run with the version that started it, or remove {run} yourself" in str(e.value)
    assert (run / "config.json").read_text() == "{}"


def test_manifests_record_their_format_and_a_newer_one_is_refused(tmp_path):
    """A run's manifest carries its format (2), so that the next change to it is read or refused by name: one of a
    newer bertkit is refused, its files left as they are."""
    from bertkit.runs import output_dir

    with output_dir(tmp_path / "run", "pretrain") as claim:
        (claim.path / "summary.json").write_text("{}")
    manifest = tmp_path / "run" / ".bertkit-run.json"
    record = json.loads(manifest.read_text())
    assert record["format"] == 2 and list(record["files"]) == ["summary.json"]
    manifest.write_text(json.dumps({**record, "format": 3}))
    with pytest.raises(Exception, match=r"\.bertkit-run\.json is a manifest of format 3, written by a newer bertkit "
                                        r"\(this one reads formats up to 2\), so it removes and replaces nothing"):
        with output_dir(tmp_path / "run", "pretrain", overwrite=True):
            pass
    assert (tmp_path / "run" / "summary.json").read_text() == "{}"


def _finished_then_resumed(argv: list[str], recorded: dict, resumed: tuple[str, ...] = (),
                           unrecorded: tuple[str, ...] = ()) -> None:
    """A finished run of ``argv`` whose marker records ``recorded`` over today's fingerprint, without the entries
    ``unrecorded`` (what an earlier bertkit wrote), then claimed by ``argv resumed --resume`` as the command line claims
    it: raises where --resume is refused."""
    from bertkit import settings as st
    from bertkit.cli import COMMANDS, _claim, build_parser, build_settings, normalize_argv
    from bertkit.runs import output_dir

    def settings(words: list[str]):
        args = build_parser().parse_args(normalize_argv(words))
        return build_settings(COMMANDS[" ".join(words[:2]) if words[0] == "finetune" else words[0]].settings, args)

    s = settings(argv)
    name = " ".join(argv[:2]) if argv[0] == "finetune" else argv[0]
    marker = {k: v for k, v in {**st.resume_fingerprint(s), **recorded}.items() if k not in unrecorded}
    with output_dir(s.output_dir, name, marker) as claim:
        (claim.path / "summary.json").write_text("{}")
    with _claim(name, settings([*argv, *resumed, "--resume"]), None):
        pass


@pytest.mark.parametrize("eval_data", [False, True])
def test_resume_of_a_pretraining_run_that_recorded_epoch_with_nothing_to_score(tmp_path, monkeypatch, eval_data):
    """Unset, eval_strategy was "epoch" for a pre-training run without --eval-data, which scored nothing; it is "no"
    now, and such a run's --resume read as "--eval-strategy 'epoch' then, 'no' now". The recorded "epoch" reads as
    what it did; with --eval-data it evaluated, and the change is still refused."""
    from bertkit.errors import BertkitError

    monkeypatch.chdir(tmp_path)
    argv = ["pretrain", "--data", "d", "--vocab", "v", "--max-steps", "2", "--output-dir", "out",
            *(["--eval-data", "e", "--eval-strategy", "no"] if eval_data else [])]
    if not eval_data:
        _finished_then_resumed(argv, {"eval_strategy": "epoch"})
        return
    with pytest.raises(BertkitError, match="--eval-strategy 'epoch' then, 'no' now"):
        _finished_then_resumed(argv, {"eval_strategy": "epoch"})


@pytest.mark.parametrize("labelled", [False, True])
def test_resume_of_a_swag_run_that_recorded_epoch_on_a_test_file(tmp_path, monkeypatch, labelled):
    """Unset, eval_strategy was "epoch" for SWAG on test.csv (no labels, nothing scored); it is "no" now. The recorded
    "epoch" reads as "no" on an unlabelled file, and stays a change on a labelled one (it was scored each epoch)."""
    from bertkit.errors import BertkitError

    monkeypatch.chdir(tmp_path)
    header = "video-id,fold-ind,startphrase,sent1,sent2,gold-source,ending0,ending1,ending2,ending3"
    Path("test.csv").write_text(f"{header}{',label' if labelled else ''}\nv,1,a b,a,b,gold,c,d,e,f"
                                f"{',0' if labelled else ''}\n")
    argv = ["finetune", "swag", "--train-file", "test.csv", "--predict-file", "test.csv", "--model", "m",
            "--output-dir", "out", "--eval-strategy", "no"]
    if not labelled:
        _finished_then_resumed(argv, {"eval_strategy": "epoch"})
        return
    with pytest.raises(BertkitError, match="--eval-strategy 'epoch' then, 'no' now"):
        _finished_then_resumed(argv, {"eval_strategy": "epoch"})


def test_resume_of_a_squad_run_an_earlier_bertkit_recorded_as_epoch(tmp_path, monkeypatch):
    """Until 2026-11-30 a SQuAD run's loop scored nothing, and unset eval_strategy was recorded as "epoch"; it is "no"
    now, and --resume of such a run (killed, or finished) was refused: "--eval-strategy 'epoch' then, 'no' now". That
    "epoch" reads as the "no" it acted as; asking for epoch now is a change (the loop would score each epoch), and so
    is a later run's "epoch" (it was asked for, and scored) resumed without it."""
    from bertkit.errors import BertkitError

    monkeypatch.chdir(tmp_path)
    argv = ["finetune", "squad", "--predict-file", "dev.json", "--model", "m"]
    earlier = {"eval_strategy": "epoch"}
    _finished_then_resumed([*argv, "--out", "a"], earlier, unrecorded=("eval_strategy_scores",))
    with pytest.raises(BertkitError, match="--eval-strategy 'no' then, 'epoch' now"):
        _finished_then_resumed([*argv, "--out", "b"], earlier, ("--eval-strategy", "epoch"), ("eval_strategy_scores",))
    with pytest.raises(BertkitError, match="--eval-strategy 'epoch' then, 'no' now"):
        _finished_then_resumed([*argv, "--out", "c"], earlier)  # recorded since: asked for, and scored
    _finished_then_resumed([*argv, "--out", "d", "--eval-strategy", "epoch"], {})  # today's own epoch resumes
