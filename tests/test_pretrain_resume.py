"""Pre-training killed mid-way (SIGKILL) and resumed gives the uninterrupted run's losses and weights, bit for bit."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "bertkit.cli", *args]


@pytest.fixture(scope="module")
def tiny_setup(tiny_pretraining_data):
    """A 1,500-entry vocabulary and 32-token instances from Python's own docs (conftest.py; read-only)."""
    return tiny_pretraining_data


def _pretrain_args(root: Path, out: Path, *extra: str) -> list[str]:
    """The run's command line; a flag in ``extra`` replaces the base's (given twice, the CLI refuses it)."""
    base = {"--data": str(root / "data"), "--vocab": str(root / "vocab"), "--config-name": "tiny", "--out": str(out),
            "--max-steps": "60", "--save-steps": "10", "--logging-steps": "1", "--batch-size": "8", "--lr": "1e-3"}
    kept = [x for flag, value in base.items() if flag not in extra for x in (flag, value)]
    return _cli("pretrain", *kept, "--no-progress", *extra)


def _losses(out: Path) -> list[tuple[int, float, float]]:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r["loss"], r["lr"]) for r in rows if r["split"] == "train"]


@pytest.fixture(scope="module")
def uninterrupted(tiny_setup, tmp_path_factory) -> Path:
    """The reference for the killed runs: the same command, never interrupted (in this process, one thread)."""
    from killing import run_here

    full = tmp_path_factory.mktemp("uninterrupted") / "full"
    assert run_here(_pretrain_args(tiny_setup, full)[3:]) == 0
    return full


def test_a_checkpoint_opens_as_the_model_it_holds(tiny_setup, tmp_path):
    """A checkpoint holds the tokenizer beside the weights (as transformers' Trainer checkpoints do): it opens as
    a model and tokenizer, and the last one is the final model. A run of its own, 20 steps (two checkpoints): the
    60-step ``uninterrupted`` run is the killed runs' reference, in make test-slow."""
    from bertkit import BertForMaskedLM, BertTokenizer
    from killing import run_here

    out = tmp_path / "run"
    assert run_here(_pretrain_args(tiny_setup, out, "--max-steps", "20")[3:]) == 0
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-00000010", "step-00000020"]
    last = out / "checkpoints" / "step-00000020"
    final = out / "final"
    assert BertTokenizer.from_pretrained(last).vocab == BertTokenizer.from_pretrained(final).vocab
    ids = BertTokenizer.from_pretrained(last)("The standard library.", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        got, want = (BertForMaskedLM.from_pretrained(d).eval()(input_ids=ids).logits for d in (last, final))
    assert torch.equal(got, want)


@pytest.mark.slow
def test_killed_run_resumes_bit_for_bit(tiny_setup, uninterrupted, tmp_path):
    """One SIGKILL at whatever moment follows the step-20 checkpoint; `make test` kills at chosen moments instead
    (the test below)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    full, killed = uninterrupted, tmp_path / "killed"

    proc = subprocess.Popen(_pretrain_args(tiny_setup, killed), env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    from killing import in_progress

    while not (in_progress(killed) / "checkpoints" / "step-00000020").exists():  # the run is beside its directory
        assert proc.poll() is None, "the run finished before it could be killed"
        assert time.time() < deadline
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)  # a real kill: no handler, no cleanup
    proc.wait()
    done_before = max(s for s, _, _ in _losses(in_progress(killed)))
    assert done_before < 60

    subprocess.run(_pretrain_args(tiny_setup, killed, "--resume"), check=True, env=env, capture_output=True)
    assert _losses(killed) == _losses(full)  # every step's loss and lr, exactly
    a = (full / "final" / "model.safetensors").read_bytes()
    b = (killed / "final" / "model.safetensors").read_bytes()
    assert a == b


@pytest.mark.slow  # long; in make test-slow (make test stays under 5 minutes)
def test_killed_inside_checkpoint_writes_resumes_bit_for_bit(tiny_setup, uninterrupted, tmp_path):
    """Two SIGKILLs, each inside a checkpoint write (a half-written state.pt; after resuming, a checkpoint
    renamed into place before the old ones are pruned), then --resume: the uninterrupted run's losses and
    weights, bit for bit."""
    from bertkit.training.checkpoint import STEP_LAYOUT
    from killing import child_env, in_progress, launch_paused, run_here, torn_checkpoint_left

    env = child_env()
    full, killed = uninterrupted, tmp_path / "killed"
    for i, (where, nth) in enumerate([("state", 2), ("renamed", 2)]):
        extra = ("--resume",) if i else ()
        assert launch_paused(_pretrain_args(tiny_setup, killed, *extra)[3:], where, nth, tmp_path / "stop", env)
        assert torn_checkpoint_left(killed) == (where == "state")
        if where == "renamed":  # killed before pruning: one checkpoint more than --save-total-limit 2
            assert [p.name for p in STEP_LAYOUT.dirs(in_progress(killed))] == [
                "step-00000010", "step-00000020", "step-00000030"]
        assert not killed.exists()  # a run never finished: nothing in its place that looks complete
    assert run_here(_pretrain_args(tiny_setup, killed, "--resume")[3:]) == 0
    assert _losses(killed) == _losses(full)
    assert (full / "final" / "model.safetensors").read_bytes() == (killed / "final" / "model.safetensors").read_bytes()
    assert not torn_checkpoint_left(killed)


@pytest.mark.slow  # 5 s; make test keeps test_kill_resume_ends.py::test_a_kill_while_the_finished_run_removes_its_checkpoints_resumes
def test_a_checkpoint_whose_removal_a_kill_cut_short_is_gone_after_resuming(tiny_setup, tmp_path):
    """Killed while rotation removed step-10 (its state.pt gone, its manifest and the rest left), then resumed from
    step-30, the last: no later rotation runs, and the finished run kept the half-removed step-10 among its
    checkpoints. A resumed run removes what a kill left of a removal first; a user's directory stays."""
    from bertkit.training.checkpoint import STEP_LAYOUT
    from killing import child_env, in_progress, launch_paused, run_here

    out = tmp_path / "killed"
    args = _pretrain_args(tiny_setup, out, "--max-steps", "30")[3:]
    assert launch_paused(args, "renamed", 3, tmp_path / "stop", child_env())
    staged = in_progress(out)
    assert [p.name for p in STEP_LAYOUT.dirs(staged)] == ["step-00000010", "step-00000020", "step-00000030"]
    (staged / "checkpoints" / "step-00000010" / "state.pt").unlink()  # the removal's first unlink, then the kill
    (staged / "checkpoints" / "step-00000005").mkdir()  # a user's: no manifest proves it bertkit's
    assert run_here([*args, "--resume"]) == 0
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-00000005", "step-00000020",
                                                                        "step-00000030"]


def test_resume_with_other_settings_is_refused(tiny_setup, tmp_path, capsys):
    from bertkit.cli import main

    out = tmp_path / "run"
    args = _pretrain_args(tiny_setup, out, "--max-steps", "4", "--save-steps", "2")[3:]  # the CLI's own arguments
    assert main(args) == 0
    capsys.readouterr()
    assert main([*args, "--resume", "--weight-decay", "0.1"]) == 2
    err = capsys.readouterr().err
    assert "cannot --resume in" in err and "--weight-decay 0.01 then, 0.1 now" in err
    assert main([*args, "--resume", "--lr-scheduler-type", "cosine"]) == 2  # another schedule is another run
    err = capsys.readouterr().err
    assert "(--lr-scheduler-type 'linear' then, 'cosine' now)" in err, err
    assert main(args) == 2
    assert "pass --resume to continue it" in capsys.readouterr().err


def test_diverging_pretraining_stops_non_zero_and_saves_no_model(tiny_setup, tmp_path, capsys):
    """`pretrain --learning-rate 1e3` used to reach NaN, exit 0 and save NaN weights."""
    from bertkit.cli import main

    out = tmp_path / "diverged"
    code = main(["pretrain", "--data", str(tiny_setup / "data"), "--vocab", str(tiny_setup / "vocab"),
                 "--config-name", "tiny", "--output-dir", str(out), "--max-steps", "40", "--batch-size", "8",
                 "--learning-rate", "1e3", "--warmup-ratio", "0", "--save-steps", "1", "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2
    assert "training stopped at step" in err and ("is nan" in err or "is inf" in err)
    assert "Last good checkpoint:" in err and "--skip-nonfinite" in err
    assert not (out / "final").exists()  # no NaN model written


def test_an_update_that_leaves_weights_infinite_stops_naming_the_step_and_the_last_good_checkpoint(
        tiny_setup, tmp_path, capsys):
    """--learning-rate 1e38: step 2's loss and gradient are finite, its update overflows the weights. The step-2
    checkpoint was refused with save_pretrained's words ("BertForPreTraining holds NaN or infinite weights ... save a
    model whose weights are finite"), naming neither the step nor the step-1 checkpoint docs/command-line.md
    promises for a run that goes non-finite."""
    from bertkit.cli import main

    out = tmp_path / "overflowed"
    code = main(_pretrain_args(tiny_setup, out, "--max-steps", "3", "--lr", "1e38", "--warmup-steps", "0",
                               "--save-steps", "1")[3:])
    err = capsys.readouterr().err
    assert code == 2
    assert "training stopped at step 2: its update left" in err and "NaN or infinite" in err, err
    assert "though its loss and gradient were finite. Last good checkpoint: " in err
    assert "step-00000001" in err and "no final model was saved" in err
    assert not (out / "final").exists()


def _settings(root: Path, out: Path, **kw):
    from bertkit.settings import PretrainSettings

    base = dict(data=root / "data", vocab=root / "vocab", config_name="tiny", output_dir=out, max_steps=30,
                save_steps=10, logging_steps=1, batch_size=8, learning_rate=1e-3, progress=False)
    return PretrainSettings(**{**base, **kw})


def _weights(out: Path):
    from safetensors.torch import load_file

    return load_file(out / "final" / "model.safetensors")


@pytest.mark.parametrize("torn", [pytest.param("state.pt", marks=pytest.mark.slow), "model.safetensors"])  # the weights are in model.safetensors
def test_a_truncated_checkpoint_and_a_torn_metrics_line_fall_back_and_resume_exactly(tiny_setup, tmp_path, caplog,
                                                                                     torn):
    import torch

    from bertkit.training.pretrain import pretrain

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # bit-exact comparisons: one thread, as the resume test's OMP_NUM_THREADS=1
    try:
        out = tmp_path / "run"
        pretrain(_settings(tiny_setup, out))
        reference = _weights(out)  # the run uninterrupted, read before its newest checkpoint is damaged
        state = out / "checkpoints" / "step-00000030" / torn
        state.write_bytes(state.read_bytes()[: state.stat().st_size // 2])  # a torn write of the newest checkpoint
        with open(out / "metrics.jsonl", "a") as f:
            f.write('{"split": "train", "st')  # a kill mid-append
        with caplog.at_level("WARNING", logger="bertkit"):
            result = pretrain(_settings(tiny_setup, out, resume=True))
        assert result.step == 30
        assert "step-00000030 is damaged" in caplog.text and "falling back" in caplog.text
        assert "is torn" in caplog.text
        resumed = _weights(out)
        assert all((resumed[k] == reference[k]).all() for k in reference)  # bit for bit
    finally:
        torch.set_num_threads(threads)


@pytest.mark.slow  # 2 s; make test keeps test_a_shard_replaced_after_the_manifest_is_refused_before_training
def test_data_regenerated_at_the_same_path_does_not_resume_silently(tiny_setup, tmp_path):
    import shutil

    from bertkit.data.pretraining import create_pretraining_data
    from bertkit.tokenization import BertTokenizer
    from bertkit.training.pretrain import pretrain

    data = tmp_path / "data"
    root = tmp_path
    shutil.copytree(tiny_setup / "vocab", root / "vocab")
    tok = BertTokenizer.from_pretrained(root / "vocab")

    def make(seed: int, overwrite: bool) -> None:  # made here: overwrite replaces only what bertkit wrote
        create_pretraining_data([tiny_setup / "corpus" / "train.txt"], tok, data, max_seq_length=32,
                                max_predictions_per_seq=5, dupe_factor=1, input_format="sentences", seed=seed,
                                num_workers=1, progress=False, overwrite=overwrite)

    make(3, overwrite=False)
    pretrain(_settings(root, tmp_path / "run", max_steps=10))
    make(4, overwrite=True)  # same path, other masks
    with pytest.raises(ValueError, match="other settings or data.*'data'"):
        pretrain(_settings(root, tmp_path / "run", max_steps=10, resume=True))


def test_a_shard_replaced_after_the_manifest_is_refused_before_training(tiny_setup, tmp_path, monkeypatch, capsys):
    """Was: `pretrain` trained on a shard file replaced after the manifest recorded its sha256 (here the same shape
    and dtype, every id moved by one), since nothing checked the files once the opt-in verification was removed.
    Now opening the data checks each file once; a DataLoader worker's copy does not hash them again."""
    import pickle
    import shutil

    import numpy as np

    from bertkit.cli import main
    from bertkit.data import PretrainingDataset
    from bertkit.data import dataset as dataset_module
    from bertkit.data.shards import read_manifest

    shutil.copytree(tiny_setup / "data", tmp_path / "data")
    shutil.copytree(tiny_setup / "vocab", tmp_path / "vocab")
    shard = tmp_path / "data" / "shard-00000.input_ids.npy"
    ids = np.load(shard)
    np.save(shard, ((ids.astype(np.int64) + 1) % 1500).astype(ids.dtype))
    out = tmp_path / "run"
    assert main(_pretrain_args(tmp_path, out)[3:]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"bertkit pretrain: error: {shard} is not the file manifest.json recorded when the data was written (its "
        "sha256 differs): it was replaced or changed since, so its instances are not the manifest's; put the original "
        "file back, or write the data again into a new directory (bertkit create-pretraining-data ... --output-dir "
        "NEW_DIR) and train on that")
    assert not (out / "checkpoints").exists() and not (out / "final").exists()

    hashed: list[str] = []
    real = dataset_module.sha256_of
    monkeypatch.setattr(dataset_module, "sha256_of", lambda path: hashed.append(path.name) or real(path))
    listed = sorted(e["file"] for shard in read_manifest(tiny_setup / "data")["shards"] for e in shard["files"].values())
    first = PretrainingDataset(tiny_setup / "data")[0]
    assert sorted(hashed) == listed  # every file once
    copy = pickle.loads(pickle.dumps(PretrainingDataset(tiny_setup / "data")))
    assert len(hashed) == 2 * len(listed) and np.array_equal(copy[0]["input_ids"], first["input_ids"])


def test_a_full_disk_during_a_checkpoint_keeps_the_previous_one(tiny_setup, tmp_path, monkeypatch):
    import torch

    from bertkit.training import loop
    from bertkit.training.pretrain import pretrain

    real_save, calls = torch.save, []

    def save(obj, path, *args, **kwargs):
        calls.append(path)
        if len(calls) == 2:
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 4096 vs 2048")
        return real_save(obj, path, *args, **kwargs)

    monkeypatch.setattr(loop.torch, "save", save)
    out = tmp_path / "run"
    with pytest.raises(ValueError, match=r"No space left on device: could not write the checkpoint .*/step-00000020 ") as info:
        pretrain(_settings(tiny_setup, out))
    assert "step-00000010 is intact" in str(info.value)
    assert [p.name for p in (out / "checkpoints").iterdir()] == ["step-00000010"]  # temporary files removed
    assert torch.load(out / "checkpoints" / "step-00000010" / "state.pt", weights_only=True)["position"]["step"] == 10


@pytest.mark.parametrize("code, words", [(28, "No space left on device"), (122, "Disk quota exceeded"),
                                          (27, "File too large")])
def test_a_refused_checkpoint_write_names_the_systems_reason_and_the_directory_it_is_written_as(tmp_path, monkeypatch,
                                                                                             code, words):
    """Was: "the disk is full: ... (it needs about 0 MB, 69181 MB are free)" for a quota or a file-size limit
    (``ulimit -f``) too, naming the command's staging directory (``.run.bertkit-staging/checkpoints/...``)."""
    from bertkit.runs import output_dir
    from bertkit.training import checkpoint

    def refused(obj, path, *args, **kwargs):
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(checkpoint.torch, "save", refused)
    state = {"model": {"w": torch.zeros(250_000)}}
    with pytest.raises(ValueError) as info, output_dir(tmp_path / "run", "pretrain") as claim:
        checkpoint.save_checkpoint(claim.path, state, 20, keep=2)
    assert str(info.value).startswith(f"{words}: could not write the checkpoint {tmp_path / 'run'}/checkpoints/"
                                      "step-00000020 (it needs about 3 MB, ")
    assert "bertkit-staging" not in str(info.value)
    # no torn write, nor the checkpoints directory the failed write made: the run wrote nothing to resume, so it is gone
    assert not (tmp_path / ".run.bertkit-staging").exists() and not (tmp_path / "run").exists()


@pytest.mark.slow
def test_kill_campaign_twenty_sigkills_at_random_moments(tiny_setup, tmp_path):
    """20 SIGKILLs, each followed by --resume: most at random moments (checkpoints every 5 steps), the others
    inside a checkpoint write (a torn state.pt, or a rename before pruning): the run ends with the
    uninterrupted run's losses and weights, bit for bit."""
    import random

    from killing import MOMENTS, launch_paused

    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    args = ("--max-steps", "900", "--save-steps", "5")  # long enough to outlast 20 kills on an idle machine
    full, killed = tmp_path / "full", tmp_path / "killed"
    subprocess.run(_pretrain_args(tiny_setup, full, *args), check=True, env=env, capture_output=True)
    rng, kills, in_writes = random.Random(2026), 0, 0
    while kills < 20:
        if rng.random() < 0.4:  # inside a checkpoint write, at a chosen moment (tests/killing.py)
            where, nth = rng.choice(MOMENTS), rng.randint(1, 3)
            if not launch_paused(_pretrain_args(tiny_setup, killed, *args, "--resume")[3:], where, nth,
                                 tmp_path / "stop", env):
                break
            kills, in_writes = kills + 1, in_writes + 1
            continue
        proc = subprocess.Popen(_pretrain_args(tiny_setup, killed, *args, "--resume"), env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(rng.uniform(1.0, 4.0))  # start-up takes about a second: most kills land in training
        if proc.poll() is not None:
            break  # finished before this kill: nothing left to interrupt
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        kills += 1
    subprocess.run(_pretrain_args(tiny_setup, killed, *args, "--resume"), check=True, env=env, capture_output=True)
    assert kills == 20 and in_writes >= 5
    assert _losses(killed) == _losses(full)
    assert (full / "final" / "model.safetensors").read_bytes() == (killed / "final" / "model.safetensors").read_bytes()


def test_resuming_a_finished_run_keeps_its_last_evaluation(tiny_setup, tmp_path, capsys):
    """--resume on a run that already finished changes nothing it reported (summary.json kept its eval), nor its
    last checkpoint: it was written again, and the one it replaced was kept beside it as files bertkit "cannot prove
    it wrote" (checkpoints/step-00000020.replaced-*, a whole checkpoint more at each --resume)."""
    from bertkit.cli import main

    out = tmp_path / "run"
    args = _pretrain_args(tiny_setup, out, "--max-steps", "20", "--eval-data", str(tiny_setup / "data"),
                          "--eval-steps", "10", "--eval-instances", "16")[3:]
    assert main(args) == 0
    first = json.loads((out / "summary.json").read_text())
    assert first["steps"] == 20 and first["last_eval"]["instances"] == 16
    state = (out / "checkpoints" / "step-00000020" / "state.pt").read_bytes()
    capsys.readouterr()
    assert main([*args, "--resume"]) == 0
    assert json.loads((out / "summary.json").read_text()) == first
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-00000010", "step-00000020"]
    assert (out / "checkpoints" / "step-00000020" / "state.pt").read_bytes() == state
    assert "cannot prove" not in capsys.readouterr().err


class _Stopped(Exception):
    pass


@pytest.fixture
def one_thread():
    """A tiny model trains fastest on one thread (and the same way every time)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_a_run_resumes_from_another_directory_with_paths_relative_to_it(tiny_setup, tmp_path, monkeypatch, capsys,
                                                                        one_thread):
    """Started in runs/study with `--data data-nearby`, resumed from the directory above with `--data
    runs/study/data-nearby`: the same files, so it resumes. A path to other files (a copy of the same data) is
    still refused, naming the setting and both absolute paths."""
    import shutil

    from bertkit.cli import main
    from bertkit.training import loop

    root = tmp_path / "repo"
    run_dir = root / "runs" / "study"
    shutil.copytree(tiny_setup / "data", run_dir / "data-nearby")
    shutil.copytree(tiny_setup / "data", root / "elsewhere")
    shutil.copytree(tiny_setup / "vocab", run_dir / "vocab")

    def args(prefix: str, data: str = "data-nearby") -> list[str]:
        return ["pretrain", "--data", prefix + data, "--vocab", prefix + "vocab", "--config-name", "tiny",
                "--out", prefix + "out", "--max-steps", "6", "--save-steps", "2", "--logging-steps", "1",
                "--batch-size", "8", "--lr", "1e-3", "--no-progress"]

    real_save = loop.save_checkpoint

    def save_then_stop(out_dir, state, step, *rest, **kwargs):
        path = real_save(out_dir, state, step, *rest, **kwargs)
        if step == 4:
            raise _Stopped(path)  # as if killed right after this checkpoint
        return path

    monkeypatch.chdir(run_dir)
    with monkeypatch.context() as mp:
        mp.setattr(loop, "save_checkpoint", save_then_stop)
        with pytest.raises(_Stopped):
            main(args(""))

    monkeypatch.chdir(root)
    capsys.readouterr()
    assert main([*args("runs/study/", "../../elsewhere"), "--resume"]) == 2
    err = capsys.readouterr().err
    assert "cannot --resume in runs/study/out" in err
    assert f"--data '{(run_dir / 'data-nearby').resolve()}' then, '{(root / 'elsewhere').resolve()}' now" in err
    assert "--vocab" not in err and "--output-dir" not in err  # the same files: not named

    assert main([*args("runs/study/"), "--resume"]) == 0
    assert [s for s, _, _ in _losses(run_dir / "out")] == [1, 2, 3, 4, 5, 6]
    marker = json.loads((run_dir / "out" / ".bertkit-run.json").read_text())
    assert marker["cwd"] == str(root.resolve()) and marker["fingerprint"]["data"] == "runs/study/data-nearby"
