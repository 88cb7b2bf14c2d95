"""A model saved by every rank of a torchrun job, as sentence-transformers' and transformers' scripts save it
(``model.save_pretrained(final_dir)`` after ``trainer.train()``, unguarded): a sentence model, a cross-encoder, a
transformers model or tokenizer. The first rank to save writes the directory; a rank that finds another rank of its
job writing it waits for that write and leaves the directory as written (the weights are the same under DDP): it
does not swap the directory under the rank that wrote it; one writing a directory above or inside it waits, then
writes. sentence-transformers 6.2 and transformers end with every rank having written the same files. Was: the
later rank stopped with "FINAL/.final.bertkit-staging is in use by pid N (bertkit save)", so the job failed after
training (exit 1, seen with 2 ranks saving MiniLM), where sentence-transformers' ends with exit 0.

Rank 0's write under way is this test process inside ``staged`` (the save's own context), named as a rank of the
job; the other ranks are processes given torchrun's environment (no process group is needed to save).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bertkit._parallel import job_of
from bertkit.sentence import SentenceTransformer
from bertkit.sentence.cross_encoder import CrossEncoder
from bertkit.staging import staged

SAVE = """
import logging, sys
logging.basicConfig(level=logging.INFO, format="%(message)s")
from bertkit import AutoTokenizer, BertModel
from bertkit.sentence import SentenceTransformer
from bertkit.sentence.cross_encoder import CrossEncoder
cls = {"cross": CrossEncoder, "sentence": SentenceTransformer, "model": BertModel.from_pretrained,
       "tokenizer": AutoTokenizer.from_pretrained}[sys.argv[1]]
saved = cls(sys.argv[2]).save_pretrained(sys.argv[3])
print("saved", sys.argv[3] if sys.argv[1] == "tokenizer" else saved, flush=True)
"""
# what each kind of save writes (one of its files), and the same save made in this process
WRITES = {"sentence": "modules.json", "cross": "config.json", "model": "model.safetensors", "tokenizer": "vocab.txt"}


def _save(kind: str, model: Path, out: Path) -> None:
    from bertkit import AutoTokenizer, BertModel

    {"cross": CrossEncoder, "sentence": SentenceTransformer, "model": BertModel.from_pretrained,
     "tokenizer": AutoTokenizer.from_pretrained}[kind](model).save_pretrained(out)


def _env(job: str, rank: int) -> dict[str, str]:
    return {"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2", "TORCHELASTIC_RUN_ID": job,
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29555"}


def _rank(rank: int, job: str, kind: str, model: Path, out: Path) -> subprocess.Popen:
    env = {**os.environ, **_env(job, rank), "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src"),
           "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-c", SAVE, kind, str(model), str(out)], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


@pytest.mark.parametrize("kind", ["model", *(pytest.param(kind, marks=pytest.mark.slow)  # one waits in `make test`
                                             for kind in ("sentence", "cross", "tokenizer"))])
def test_a_rank_saving_what_another_rank_of_its_job_is_saving_waits_and_saves(kind, tmp_path, tiny_checkpoint,
                                                                              minilm_dir):
    """Also a transformers model's and tokenizer's ``save_pretrained`` (transformers' scripts' unguarded
    ``model.save_pretrained(args.output_dir)`` after ``trainer.train()``): was refused like the sentence model's,
    "OUT/.final.bertkit-staging is in use by pid N (bertkit save)", so the job stopped after training."""
    model = tiny_checkpoint(tmp_path / "model", "BertForSequenceClassification" if kind == "cross" else "BertModel",
                            tokenizer=minilm_dir, **({"labels": 1} if kind == "cross" else {}))
    out = tmp_path / "final"
    with staged(out, shared_by=job_of(_env("job-a", 0))) as stage:  # rank 0's save, under way
        _save(kind, model, stage)
        (stage / "rank0.txt").write_text("rank 0 was here")
        # another job's process is refused, as any other writer is
        other = _rank(1, "job-b", kind, model, out)
        _, refused = other.communicate(timeout=120)
        assert other.returncode == 1, refused[-2000:]
        assert f"is in use by pid {os.getpid()} (bertkit save [torchrun job job-a at 127.0.0.1:29555])" in refused
        second = _rank(1, "job-a", kind, model, out)
        waiting = ""
        while "of this process's job: waiting for it" not in waiting and (line := second.stderr.readline()):
            waiting += line
        assert f"{out} is being written by pid {os.getpid()} (bertkit save [torchrun job job-a" in waiting, waiting
        assert second.poll() is None  # it waits while rank 0 writes
    written = {p.relative_to(out): p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file()}
    assert Path(WRITES[kind]) in written and Path("rank0.txt") in written
    stdout, stderr = second.communicate(timeout=120)
    assert second.returncode == 0 and stdout == f"saved {out}\n", stderr[-2000:]
    assert "leaves it as written" in stderr
    # rank 0's files, untouched, and nothing left beside them
    assert {p.relative_to(out): p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file()} == written
    assert sorted(p.name for p in tmp_path.iterdir()) == ["final", "model"]


def test_a_rank_finding_the_staging_directory_another_rank_has_just_made_leaves_it_to_that_rank(
        tmp_path, tiny_checkpoint, minilm_dir, monkeypatch):
    """Was: between one rank's making OUT's staging directory and its locking it, another rank of the job took the
    empty directory for a kill's leftover and swapped it away; the first then stopped with FileNotFoundError, or
    wrote into the other's new staging directory, which that one's save moved into place under it ("No such file
    or directory: OUT/.out.bertkit-staging/.model.safetensors...bertkit-tmp", seen in 1 of 116 slow runs of every
    rank's save after train()). Here rank 1 saves in that moment: an empty staging directory is taken as it is,
    and a rank whose directory was taken and finished writes its own."""
    from bertkit import dir_lock
    from bertkit.dir_lock import staging_path

    model = tiny_checkpoint(tmp_path / "model", tokenizer=minilm_dir)
    out = tmp_path / "out"
    for key, value in _env("job-r", 0).items():
        monkeypatch.setenv(key, value)
    lock, rank1 = dir_lock.lock, []

    def made_not_yet_locked(directory, command):
        if Path(directory) == staging_path(out) and not rank1:
            assert Path(directory).is_dir() and not os.listdir(directory)  # this rank's, just made
            second = _rank(1, "job-r", "model", model, out)
            rank1.append((*second.communicate(timeout=120), second.returncode))
        return lock(directory, command)

    monkeypatch.setattr(dir_lock, "lock", made_not_yet_locked)
    _save("model", model, out)
    stdout, stderr, code = rank1[0]
    assert code == 0 and stdout == f"saved {out}\n", stderr[-2000:]
    assert (out / "model.safetensors").read_bytes() == (tmp_path / "model" / "model.safetensors").read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model", "out"]
    # The other order: this rank opens while another has made the staging directory and not yet locked it. The
    # directory is taken as it is (the other rank will find it held and step back), not swapped away: were it, the
    # other rank, locking it in between, would write into a directory moved from under it.
    from bertkit.staging import Stage

    fresh = tmp_path / "fresh"
    staging_path(fresh).mkdir(mode=0o700)  # a mode of its own tells it from one made again (its inode may be reused)
    stage = Stage.open(fresh, "save", {"write": "save"})
    assert stage.path == staging_path(fresh) and os.stat(stage.path).st_mode & 0o777 == 0o700 and not fresh.exists()
    stage.abort()


def test_a_lock_is_taken_while_another_process_only_probes_it(tmp_path):
    """A waiting rank polls a directory's lock with a shared lock of microseconds (``held_by_another``); a rank
    taking the lock at that moment was refused "in use by another process", so its save failed. A probe's lock is
    waited out; a holder's is still refused, naming it."""
    import fcntl
    import threading

    from bertkit import dir_lock

    directory = tmp_path / "d"
    directory.mkdir()
    (directory / dir_lock.LOCK).touch()
    probe = os.open(directory / dir_lock.LOCK, os.O_RDONLY)
    fcntl.flock(probe, fcntl.LOCK_SH | fcntl.LOCK_NB)  # a probe under way (its own open file: flock sees two)
    threading.Timer(0.05, os.close, (probe,)).start()
    dir_lock.lock(directory, "save")
    assert dir_lock.holds(directory)
    dir_lock.unlock(directory)
    held = os.open(directory / dir_lock.LOCK, os.O_RDWR)
    fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
    os.pwrite(held, b"pid 1 (bertkit save)", 0)
    with pytest.raises(dir_lock.Held, match=r"in use by pid 1 \(bertkit save\)"):
        dir_lock.lock(directory, "save")
    os.close(held)


def test_a_holder_that_has_not_yet_written_its_line_is_named_once_it_has(tmp_path):
    """A rank takes the lock of the staging directory another rank has just made, then writes its line: read in
    between, the empty file named the holder "another process", which a rank of the same job took for a stranger's
    lock, so its save failed (the slow suite's torchrun save, once, on a loaded machine). The line is waited for."""
    import fcntl
    import threading

    from bertkit import dir_lock

    directory = tmp_path / "d"
    directory.mkdir()
    held = os.open(directory / dir_lock.LOCK, os.O_RDWR | os.O_CREAT)
    fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)  # taken, its line not yet written
    threading.Timer(0.05, os.pwrite, (held, b"pid 1 (bertkit save [torchrun job j])", 0)).start()
    with pytest.raises(dir_lock.Held, match=r"in use by pid 1 \(bertkit save \[torchrun job j\]\)") as e:
        dir_lock.lock(directory, "save")
    assert e.value.holder.endswith("[torchrun job j])")
    os.close(held)


def test_a_lock_file_a_killed_rank_left_is_no_write_under_way(tmp_path, tiny_checkpoint, minilm_dir):
    """A staging directory a killed save of the job left (its lock file naming the job, held by no one: a rerun with
    the same rendezvous id and endpoint has the same name) is cleared and the save is written, not skipped as if
    another rank were writing it: the directory gets the new weights."""
    from bertkit.outputs import PARTIAL

    old = tiny_checkpoint(tmp_path / "old", tokenizer=minilm_dir, seed=0)
    new = tiny_checkpoint(tmp_path / "new", tokenizer=minilm_dir, seed=1)
    out = tmp_path / "final"
    SentenceTransformer(old).save(out)
    before = (out / "model.safetensors").read_bytes()
    left = tmp_path / ".final.bertkit-staging"
    left.mkdir()
    (left / ".bertkit-lock").write_text("pid 999999 (bertkit save [torchrun job job-a at 127.0.0.1:29555])")
    (left / PARTIAL).write_text('{"write": "save"}')
    stdout, stderr = _rank(0, "job-a", "sentence", new, out).communicate(timeout=120)
    assert stdout == f"saved {out}\n" and "leaves it as written" not in stderr, stderr[-2000:]
    after = (out / "model.safetensors").read_bytes()
    assert after != before and after == (tmp_path / "new" / "model.safetensors").read_bytes()
    assert not left.exists()


# make test-slow (2.6 s a case): make test keeps test_a_rank_saving_what_another_rank_of_its_job_is_saving_waits_and_saves,
# the same wait for rank 0's save of the job on the same directory
@pytest.mark.slow
@pytest.mark.parametrize("rank0_writes", ["inside", "around"])
def test_a_rank_saving_around_or_inside_what_another_rank_of_its_job_is_saving_waits_then_writes(
        rank0_writes, tmp_path, tiny_checkpoint, minilm_dir):
    """Ranks of one job saving nested directories at once (rank 0 ``trainer.save_model(OUT/final)``, the others
    on to the script's ``model.save_pretrained(OUT)``, unguarded): a save exchanges its whole directory, so one of
    OUT swapped OUT/final's staging away from under rank 0 (seen: rank 0 stopped with FileNotFoundError
    "OUT/final/.bertkit-partial", OUT/final left without its tokenizer and with a stray .bertkit-tmp file). Now the
    later one waits for the other, then writes: both directories whole."""
    model = tiny_checkpoint(tmp_path / "model", tokenizer=minilm_dir)
    out = tmp_path / "out"
    mine, theirs = (out / "final", out) if rank0_writes == "inside" else (out, out / "final")
    with staged(mine, shared_by=job_of(_env("job-a", 0))) as stage:  # rank 0's save, under way
        _save("model", model, stage)
        (stage / "rank0.txt").write_text("rank 0 was here")
        second = _rank(1, "job-a", "model", model, theirs)
        waiting = ""
        while "waits for it" not in waiting and (line := second.stderr.readline()):
            waiting += line
        assert f"of this process's job: {theirs} waits for it" in waiting, waiting
        assert second.poll() is None  # it waits while rank 0 writes
    stdout, stderr = second.communicate(timeout=120)
    assert second.returncode == 0 and stdout == f"saved {theirs}\n", stderr[-2000:]
    files = sorted(p.relative_to(out).as_posix() for p in out.rglob("*"))
    final = "final/" if rank0_writes == "inside" else ""
    assert files == sorted(["config.json", "model.safetensors", "final", "final/config.json",
                            "final/model.safetensors", f"{final}rank0.txt"]), files
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model", "out"]


def test_rank_0s_metrics_file_waits_for_another_ranks_save_of_its_directory(tmp_path, tiny_checkpoint, minilm_dir):
    """``trainer.save_metrics`` / ``save_state`` (rank 0) writing into output_dir while another rank's
    ``model.save_pretrained(output_dir)`` exchanges that directory: the file renamed in mid-exchange went with the old
    directory (seen: all_results.json without the eval metrics just saved, and a stray
    .all_results.json.*.bertkit-tmp left in output_dir). Now the write waits for that save, then is made and checked."""
    model = tiny_checkpoint(tmp_path / "model", tokenizer=minilm_dir)
    out = tmp_path / "out"
    out.mkdir()
    (out / "all_results.json").write_text('{"train_loss": 0.5}')
    write = ("import json, sys; from pathlib import Path; from bertkit.job_writes import write_text_beside_job; "
             "p = Path(sys.argv[1]); print('writing', flush=True); "
             "write_text_beside_job(p, lambda: json.dumps({**json.loads(p.read_text()), "
             "'eval_loss': 0.25})); print('written', flush=True)")
    env = {**os.environ, **_env("job-a", 0), "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")}
    with staged(out, shared_by=job_of(_env("job-a", 1))) as stage:  # rank 1's save of output_dir, under way
        _save("model", model, stage)
        rank0 = subprocess.Popen([sys.executable, "-c", write, str(out / "all_results.json")], env=env, text=True,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert rank0.stdout.readline() == "writing\n"
        time.sleep(1.0)
        assert rank0.poll() is None  # it waits while rank 1 saves
        assert (out / "all_results.json").read_text() == '{"train_loss": 0.5}'
    stdout, stderr = rank0.communicate(timeout=120)
    assert rank0.returncode == 0 and stdout == "written\n", stderr[-2000:]
    assert (out / "all_results.json").read_text() == '{"train_loss": 0.5, "eval_loss": 0.25}'
    assert sorted(p.name for p in out.iterdir()) == ["all_results.json", "config.json", "model.safetensors"]
