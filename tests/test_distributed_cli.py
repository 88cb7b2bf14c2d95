"""The commands under torchrun: a kill, a resume at the same world size (bit-exact) and at another one.

torchrun (``python -m torch.distributed.run --standalone``) on the CPU with gloo; a tiny model pre-trained
on Python's own documentation, as in tests/test_pretrain_resume.py. The resume in one process runs in this
process: only the runs with two processes need a launcher.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from launch_helpers import LAUNCHER, run_torchrun

HANG = 300  # seconds: only a hang takes this long (a run here takes tens of seconds on 2 busy cores)


@pytest.fixture(scope="module")
def tiny_data(tiny_pretraining_data):
    """A 1,500-entry vocabulary and 32-token instances from Python's own docs (conftest.py; read-only)."""
    return tiny_pretraining_data


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _env() -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(sys.path)}


STEPS = 20  # checkpoints every 4 steps; the kill follows the step-8 one, 12 steps before the end


def _args(root: Path, out: Path, *extra: str) -> list[str]:
    """`bertkit pretrain`'s arguments for the runs compared here."""
    return ["pretrain", "--data", str(root / "data"), "--vocab", str(root / "vocab"), "--config-name", "tiny",
            "--output-dir", str(out), "--max-steps", str(STEPS), "--save-steps", "4", "--logging-steps", "1",
            "--batch-size", "8", "--learning-rate", "1e-3", "--no-progress", "--device", "cpu", *extra]


def _pretrain(root: Path, out: Path, *extra: str) -> list[str]:
    """The command line of the run under torchrun with two processes."""
    return [*LAUNCHER, "-m", "bertkit", *_args(root, out, *extra)]


def _records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]


def _losses(out: Path) -> list[tuple[int, float]]:
    return [(r["step"], r["loss"]) for r in _records(out) if r["split"] == "train"]


def _worker_pids(launcher_pid: int) -> dict[int, int]:
    """rank -> pid of torchrun's worker processes (its children carrying RANK in their environment)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            env = (entry / "environ").read_bytes().split(b"\0")
        except (OSError, IndexError, ValueError):
            continue
        if ppid == launcher_pid:
            for var in env:
                if var.startswith(b"RANK="):
                    found[int(var[5:])] = int(entry.name)
    return found


@pytest.mark.slow  # 20-40 s: make test-slow (make test stays near five minutes on two cores)
def test_kill_a_rank_then_resume_at_the_same_and_at_another_world_size(tiny_data, tmp_path, caplog):
    """Two processes under torchrun, one killed: --resume under torchrun ends bit for bit where the uninterrupted
    run did; --resume in one process (this one: no launcher involved) continues at the same sample position."""
    from bertkit.cli import main

    full, killed = tmp_path / "full", tmp_path / "killed"
    done = run_torchrun(["-m", "bertkit", *_args(tiny_data, full)], _env(), HANG, fresh=full)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout)["steps"] == STEPS  # one JSON result, printed by rank 0 only
    assert len(list((full / "checkpoints").glob("step-*"))) == 2  # written once (rank 0), keep-last 2
    state = (full / "checkpoints" / f"step-{STEPS:08d}")
    assert (state / "config.json").is_file() and (state / "model.safetensors").is_file()  # from_pretrained layout

    proc = subprocess.Popen(_pretrain(tiny_data, killed, "--ddp-timeout", "60"), env=_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.time() + HANG
    from killing import in_progress

    while not (in_progress(killed) / "checkpoints" / "step-00000008").exists():  # the run is beside its directory
        assert proc.poll() is None, f"the run ended before it could be killed: {proc.stderr.read()[-2000:]}"
        assert time.time() < deadline
        time.sleep(0.02)
    os.kill(_worker_pids(proc.pid)[1], signal.SIGKILL)  # rank 1 dies; rank 0 must not wait for it forever
    _, err = proc.communicate(timeout=HANG)
    assert proc.returncode != 0
    steps_done = max(s for s, _ in _losses(in_progress(killed)))
    assert steps_done < STEPS and not killed.exists()  # nothing in its place until it is complete

    saved = tmp_path / "saved"  # the killed run as it stands, resumed again by one process below
    shutil.copytree(in_progress(killed), saved)

    again = run_torchrun(["-m", "bertkit", *_args(tiny_data, killed, "--resume")], _env(), HANG)
    assert again.returncode == 0, again.stderr[-3000:]
    assert _losses(killed) == _losses(full)  # every step's logged loss (averaged over the ranks), exactly
    assert (killed / "final" / "model.safetensors").read_bytes() == (full / "final" / "model.safetensors").read_bytes()

    other = killed  # the same directory (the run's record holds its settings), back as the kill left it
    shutil.rmtree(killed)
    shutil.copytree(saved, in_progress(killed).parent / f".{killed.name}.bertkit-staging")
    with caplog.at_level(logging.WARNING, logger="bertkit"):
        assert main(_args(tiny_data, other, "--resume")) == 0
    assert "resuming with 1 process(es) a run checkpointed with 2" in caplog.text
    assert "same sample position" in caplog.text
    steps = [s for s, _ in _losses(other)]
    assert steps == list(range(1, STEPS + 1))  # continued where the checkpoint was, no step repeated or skipped
    assert (other / "final" / "model.safetensors").is_file()


@pytest.mark.parametrize("suffix", [pytest.param(".jsonl", marks=pytest.mark.slow), ".safetensors"])
def test_extract_features_under_torchrun_writes_the_one_process_bytes(tmp_path, suffix, minilm_2_layers):
    """Two processes share the batches; rank 0 writes a file identical to one process's (real weights, MiniLM's
    first 2 layers, on real text: the split and the gather do not depend on the depth).

    Both writers read the states the ranks left in part files through the same code; `make test` runs the
    safetensors writer (shards, metadata), `make test-slow` the JSON lines one as well."""
    model = minilm_2_layers
    sst = Path(__file__).resolve().parents[2] / "shared" / "data" / "glue" / "SST-2" / "dev.tsv"
    lines = ([row.split("\t")[0] for row in sst.read_text(encoding="utf-8").splitlines()[1:70]] if sst.is_file()
             else [f"sentence number {i} about {'cats ' * (i % 7)}and dogs" for i in range(69)])
    lines[3] = f"{lines[3]} ||| {lines[4]}"  # a pair among the singles
    (tmp_path / "in.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")

    def args(out: Path) -> list[str]:
        return ["extract-features", "--model", str(model), "--input", str(tmp_path / "in.txt"), "--output-file",
                str(out), "--layers=-1,0", "--batch-size", "4", "--max-seq-length", "48", "--no-progress"]

    from bertkit.cli import main

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as each torchrun worker (OMP_NUM_THREADS=1): the same kernels, the same bits
    try:
        assert main(args(tmp_path / f"one{suffix}")) == 0  # one process: this one
    finally:
        torch.set_num_threads(threads)
    done = run_torchrun(["-m", "bertkit", *args(tmp_path / f"two{suffix}")], _env(), HANG)
    assert done.returncode == 0, done.stderr[-3000:]
    one, two = tmp_path / f"one{suffix}", tmp_path / f"two{suffix}"
    if suffix == ".jsonl":
        assert two.read_bytes() == one.read_bytes()
    else:  # safetensors orders its header's metadata at random per process: compare tensors and metadata (but
        from safetensors import safe_open  # the id each extraction draws for its shards)

        with safe_open(str(one), "np") as a, safe_open(str(two), "np") as b:
            meta_a, meta_b = a.metadata(), b.metadata()
            assert meta_a.pop("extraction") != meta_b.pop("extraction")
            assert meta_a == meta_b and sorted(a.keys()) == sorted(b.keys())
            for key in a.keys():
                x, y = a.get_tensor(key), b.get_tensor(key)
                assert x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes(), key
    assert oct(two.stat().st_mode & 0o777) == oct(one.stat().st_mode & 0o777) == oct(0o666 & ~_umask())
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["in.txt", f"one{suffix}", f"two{suffix}"])  # no parts


# the fine-tuning commands whose features are not their examples: SQuAD's doc-stride windows (6 a question here) and
# CoNLL's sentences longer than --max-seq-length (33 features of 21 sentences), so a global batch's features, and
# one example's, are split over the two processes
TOKEN_TASKS = {
    "squad": lambda data: ["--train-file", str(data / "squad" / "dev-v1.1.json"), "--predict-file",
                           str(data / "squad" / "dev-v1.1.json"), "--max-train-samples", "13", "--max-eval-samples",
                           "7", "--max-seq-length", "64", "--doc-stride", "32", "--max-query-length", "24"],
    "ner": lambda data: ["--data-dir", str(data / "conll2003"), "--max-train-samples", "21", "--max-eval-samples",
                         "11", "--max-seq-length", "32"],
}


@pytest.mark.slow  # a fine-tuning run in this process and one under torchrun (about 100 s on 2 busy cores)
@pytest.mark.parametrize("task", list(TOKEN_TASKS))
def test_a_token_task_fine_tuned_under_torchrun_logs_scores_and_predicts_as_one_process(
        tmp_path, minilm_2_layers, data_dir, task):
    """`finetune squad|ner` with 2 processes gives one process's logged losses (1e-5), dev scores, answers and tags
    (byte for byte; SQuAD's n-best logits within float rounding), and the same files, rank 0 alone writing them."""
    from bertkit.cli import main

    model = tmp_path / "model"  # MiniLM's first 2 layers with dropout off: the runs differ only in the split
    shutil.copytree(minilm_2_layers, model)
    config = json.loads((model / "config.json").read_text())
    config.update(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    (model / "config.json").write_text(json.dumps(config))

    def args(out: Path) -> list[str]:
        return ["finetune", task, "--model", str(model), *TOKEN_TASKS[task](data_dir), "--batch-size", "8",
                "--epochs", "1", "--eval-batch-size", "4", "--learning-rate", "1e-3", "--logging-steps", "1",
                "--no-progress", "--device", "cpu", "--output-dir", str(out)]

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as each torchrun worker (OMP_NUM_THREADS=1)
    try:
        assert main(args(tmp_path / "one")) == 0
    finally:
        torch.set_num_threads(threads)
    done = run_torchrun(["-m", "bertkit", *args(tmp_path / "two")], _env(), HANG, fresh=tmp_path / "two")
    assert done.returncode == 0, done.stderr[-3000:]
    one, two = tmp_path / "one", tmp_path / "two"
    assert sorted(p.relative_to(two) for p in two.rglob("*")) == sorted(p.relative_to(one) for p in one.rglob("*"))
    steps = [s for s, _ in _losses(one)]
    assert steps == [s for s, _ in _losses(two)] and len(steps) >= 5
    assert [v for _, v in _losses(two)] == pytest.approx([v for _, v in _losses(one)], abs=1e-5)
    reports = [json.loads((run / "report.json").read_text()) for run in (one, two)]
    scores = "scores" if task == "squad" else "dev"
    assert reports[1][scores] == reports[0][scores]
    files = [{k: Path(v) for k, v in report["files"].items()} for report in reports]
    for name in ("predictions",) if task == "squad" else ("dev", "test"):  # the answers and the tags
        assert files[1][name].read_bytes() == files[0][name].read_bytes(), name
    if task == "squad":  # each question's n best spans: the same spans, their logits within float rounding
        nbest = [json.loads(f["nbest_predictions"].read_text()) for f in files]
        assert nbest[1].keys() == nbest[0].keys()
        for qid, spans in nbest[0].items():
            assert [s["text"] for s in nbest[1][qid]] == [s["text"] for s in spans], qid
            assert [s["start_logit"] for s in nbest[1][qid]] == pytest.approx([s["start_logit"] for s in spans],
                                                                              abs=1e-4)


def test_a_launch_is_repeated_only_after_gloo_s_abort():
    """launch_helpers.run_torchrun launches again only for gloo's C++ abort (torchrun's report as CI printed it),
    never for a worker that failed with bertkit's error or any other exit code."""
    from launch_helpers import gloo_aborted

    report = ("INFO bertkit: rank 1 of 2 (local rank 1) on cpu, backend gloo\nterminate called without an active "
              "exception\n  [0]:\n    rank      : 1 (local_rank: 1)\n    exitcode  : -6 (pid: 19885)  (SIGABRT)\n")
    assert gloo_aborted(report)
    assert not gloo_aborted(report.replace("-6 (pid: 19885)  (SIGABRT)", "1 (pid: 19885)"))
    assert not gloo_aborted(report + "bertkit.errors.BertkitError: --max-steps must be positive\n")
    assert not gloo_aborted("exitcode  : -6 (pid: 1)  (SIGABRT)\n")  # an abort of another cause


# two spawned interpreters (about 3 s); the same rule for torchrun's launches is make test's in
# test_a_launch_is_repeated_only_after_gloo_s_abort, and the spawn itself runs in make test's DDP tests
# (test_sentence_matryoshka_ddp.py)
@pytest.mark.slow
def test_spawned_workers_run_again_only_after_an_abort(tmp_path):
    """launch_helpers.spawn_gloo_workers spawns again after a worker died of SIGABRT (the second try succeeds
    here), and lets a worker's own Python error through at once."""
    import torch.multiprocessing as mp

    from launch_helpers import _abort_once_worker, spawn_gloo_workers

    marker = str(tmp_path / "aborted")
    with pytest.warns(UserWarning, match="SIGABRT"):
        spawn_gloo_workers(_abort_once_worker, lambda: (marker, "abort"), 2)
    assert (tmp_path / "aborted").read_text() == "aborted once"
    assert (tmp_path / "aborted.rank0").is_file() and (tmp_path / "aborted.rank1").is_file()
    with pytest.raises(mp.ProcessRaisedException, match="a worker's own error"):
        spawn_gloo_workers(_abort_once_worker, lambda: (str(tmp_path / "other"), "raise"), 2)


@pytest.mark.parametrize("command", ["train-tokenizer", "create-pretraining-data"])
def test_a_one_process_command_under_torchrun_is_refused_before_its_sibling_holds_the_lock(
        tmp_path, monkeypatch, capsys, command):
    """Was: rank 1 of a `torchrun ... train-tokenizer` was told that its output directory "is in use" by rank 0
    (which had locked it first) instead of that the command runs in one process. The sibling is played by a
    second open of the lock file holding its flock, as rank 0's process holds it."""
    import fcntl

    from bertkit import BertTokenizer
    from bertkit.cli import main
    from bertkit.dir_lock import LOCK

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("A first sentence.\nA second one.\n\nAnother document.\n")
    BertTokenizer({t: i for i, t in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a"])}).save_pretrained(
        tmp_path / "vocab")
    out = tmp_path / "out"
    out.mkdir()
    sibling = open(out / LOCK, "w")
    sibling.write(f"pid {os.getpid()} (bertkit {command})")
    sibling.flush()
    fcntl.flock(sibling.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    args = {"train-tokenizer": [str(corpus), "--vocab-size", "200"],
            "create-pretraining-data": [str(corpus), "--vocab", str(tmp_path / "vocab")]}[command]
    try:
        code = main([command, *args, "--output-dir", str(out), "--no-progress"])
    finally:
        sibling.close()
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err, err
    assert err.strip().splitlines()[-1] == (
        f"bertkit {command}: error: bertkit {command} runs in one process: launch it without torchrun (torchrun runs "
        "pretrain, finetune and extract-features over several processes)"), err
    assert sorted(p.name for p in out.iterdir()) == [LOCK]  # nothing written
