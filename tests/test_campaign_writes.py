"""The reliability campaign for writes: every save and every command's output is staged, then swapped.

Each probe puts a fault at every write step of a save (``killing.run_with_fault``: a SIGKILL, or the call failing
as a full disk fails it), or runs it on a full or read-only file system, and asserts:

- what is at the target is the earlier output or the new one, whole, byte for byte: never a mix that loads, never
  a half-written directory that looks complete, never a user's file missing;
- a full or read-only file system is one ``WriteError`` naming the output and the fix (on the command line, one
  line, exit 2), and nothing changed;
- the next write after a kill (the same command, ``--overwrite`` where the killed one had finished) succeeds and
  leaves nothing of bertkit's beside its output: bertkit's own leftovers are recognised as its own.
"""

from __future__ import annotations

import contextlib
import functools
import io
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest

from bertkit.cli import main
from bertkit.errors import BertkitError, WriteError
from killing import NEVER_FULL, run_with_fault, write_steps

WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "good", "bad", "film", "dull", "fine", "##s", "the"]
EXCLUDED = {".bertkit-lock", ".bertkit-partial"}  # a lock's line names its holder's pid; neither is an output


def snapshot(directory: Path) -> dict[str, bytes] | None:
    """Every file under ``directory`` (bertkit's lock and in-progress mark aside), or None when there is none."""
    if not directory.exists():
        return None
    return {p.relative_to(directory).as_posix(): p.read_bytes() for p in sorted(directory.rglob("*"))
            if p.is_file() and p.name not in EXCLUDED}


def leftovers(directory: Path) -> list[str]:
    """bertkit's staging directories, replaced directories and temporary files beside ``directory``."""
    return sorted(p.name for p in directory.parent.iterdir()
                  if p.name.startswith(f".{directory.name}.") or p.name.startswith(f"{directory.name}.replaced-"))


@pytest.fixture
def probe_dir(tmp_path):
    """Where a probe writes: a directory in memory (under /dev/shm) where there is one, else ``tmp_path``. A probe
    writes its save some fifty times and every write fsyncs each file before renaming it, about 8 ms a file on this
    machine's virtual disk and nothing on a tmpfs; a SIGKILL leaves the page cache as it is, so what a probe sees
    does not depend on the medium. Removed after the test (a probe's files are a few hundred kB)."""
    if not (os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK)):
        yield tmp_path
        return
    directory = Path(tempfile.mkdtemp(prefix="bertkit-probe-", dir="/dev/shm"))
    try:
        yield directory
    finally:
        shutil.rmtree(directory)


@pytest.fixture(scope="module")
def models(tmp_path_factory, tiny_checkpoint):
    root = tmp_path_factory.mktemp("models")
    corpus = root / "corpus.txt"
    corpus.write_text("".join(f"the film is good {i}.\na bad film {i}.\nthe films are fine.\n\n" for i in range(30)))
    calibration = root / "calibration.txt"  # a few lines: a fault at each of the ~50 steps quantizes ~100 times
    calibration.write_text("a good film\nthe film is bad\nfine films\n")
    return {"corpus": corpus, "calibration": calibration, **{name: tiny_checkpoint(root / name, head, tokenizer=WORDS, seed=seed, labels=labels)
            for name, head, seed, labels in (("a", "BertModel", 0, None), ("b", "BertModel", 1, None),
                                             ("clf_a", "BertForSequenceClassification", 0, ["neg", "pos"]),
                                             ("clf_b", "BertForSequenceClassification", 1, ["neg", "pos"]))}}


def _cli(*argv) -> None:
    """``bertkit argv`` in this process, raising its one-line error (stderr's last line) if it fails."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main([str(a) for a in argv])
    if code != 0:
        raise BertkitError(f"exit {code}: {err.getvalue().strip().splitlines()[-1]}")


def _sentence(models, name: str, max_seq_length: int):
    from bertkit.sentence import SentenceTransformer

    model = SentenceTransformer(models[name])
    model.max_seq_length = max_seq_length
    return model


def _saves(models) -> dict[str, tuple[Callable[[Path], None] | None, Callable[[Path], None]]]:
    """Each probe: (what is at the target before, or None: nothing), the write."""
    from bertkit import BertModel, BertTokenizer
    from bertkit.sentence import CrossEncoder

    model_a, model_b = BertModel.from_pretrained(models["a"]), BertModel.from_pretrained(models["b"])
    sentence_a, sentence_b = _sentence(models, "a", 16), _sentence(models, "b", 24)
    cross_a, cross_b = CrossEncoder(models["clf_a"]), CrossEncoder(models["clf_b"])
    tokenizer = BertTokenizer(WORDS + ["new"])

    def data(seed, *flags):
        return lambda out: _cli("create-pretraining-data", models["corpus"], "--vocab", models["a"] / "vocab.txt",
                                "--output-dir", out, "--max-seq-length", "16", "--dupe-factor", "1", "--seed", seed,
                                "--num-workers", "1", "--no-progress", *flags)

    def quantize(model, *flags):
        return lambda out: _cli("quantize", "--model", models[model], "--output-dir", out, "--calibration-file",
                                models["calibration"], *flags)

    def with_note(write):
        def before(out):
            write(out)
            (out / "README.md").write_text("the user's notes")
        return before

    return {
        "save_pretrained, new directory": (None, model_b.save_pretrained),
        "save_pretrained over an earlier save and a user's file": (with_note(model_a.save_pretrained),
                                                                   model_b.save_pretrained),
        "tokenizer.save_pretrained into a model directory": (lambda out: shutil.copytree(models["a"], out),
                                                            tokenizer.save_pretrained),
        "SentenceTransformer.save, new directory": (None, sentence_b.save),
        "SentenceTransformer.save over an earlier save": (with_note(sentence_a.save), sentence_b.save),
        "CrossEncoder.save over an earlier save": (cross_a.save, cross_b.save),
        "bertkit quantize --overwrite": (quantize("clf_a"), quantize("clf_b", "--overwrite")),
        "bertkit quantize, new directory": (None, quantize("clf_b")),
        "bertkit create-pretraining-data --overwrite": (data(1), data(2, "--overwrite")),
        "bertkit create-pretraining-data --resume": (None, data(2, "--resume")),
    }


SAVES = ["save_pretrained over an earlier save and a user's file", "bertkit quantize --overwrite",
         *(pytest.param(name, marks=pytest.mark.slow) for name in (  # the same staging as the ones above
             "save_pretrained, new directory", "SentenceTransformer.save over an earlier save", "SentenceTransformer.save, new directory", "tokenizer.save_pretrained into a model directory", "CrossEncoder.save over an earlier save",
             "bertkit quantize, new directory", "bertkit create-pretraining-data --overwrite"))]


# The saves a fault may leave cut short for --resume, and the save that resumes each.
RESUMED = {"bertkit create-pretraining-data --overwrite": lambda saves: saves["bertkit create-pretraining-data --resume"][1]}


@pytest.fixture(scope="module")
def saves(models):
    return _saves(models)


def _leftover_kind(out: Path, state: dict[str, bytes] | None) -> tuple:
    """What the next write's clean-up depends on: the output, and what is beside it (a staging directory still
    marked as one is removed whole, whatever it holds; one holding a replaced directory, by its content)."""
    staging = out.parent / f".{out.name}.bertkit-staging"
    marked = (staging / ".bertkit-partial").exists()
    inside = None if marked or not staging.exists() else str(snapshot(staging))
    return str(state), tuple(leftovers(out)), marked, inside, (out / ".bertkit-partial").exists()


def _reset(out: Path, before: dict[str, bytes] | None) -> None:
    shutil.rmtree(out.parent)
    out.parent.mkdir()
    for rel, data in (before or {}).items():
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        (out / rel).write_bytes(data)


def _with_faults(saves: list) -> list:
    """Each save with a kill and a full disk at every step; `bertkit quantize --overwrite` in `make test-slow` only
    (about 100 quantizations, 12 s): it stages its output as the save_pretrained cases do, and the regression it
    guards (the earlier output removed before the new one was written) is
    test_quantize_overwrite_on_a_full_disk_keeps_the_earlier_output's, in `make test`. The full disk at every step
    runs in `make test-slow` too (4 s a save): make test keeps the full-disk checks of the same staged writes,
    test_quantize_overwrite_on_a_full_disk_keeps_the_earlier_output,
    test_finetune_on_a_full_disk_is_one_line_and_leaves_no_output and
    test_a_full_disk_refusing_the_lock_leaves_the_directory_free_for_the_next_write."""
    cases = []
    for save in saves:
        name, marks = (save.values[0], list(save.marks)) if hasattr(save, "values") else (save, [])
        for fault in ("kill", "full"):
            slow = [pytest.mark.slow] if name == "bertkit quantize --overwrite" or fault == "full" else []
            cases.append(pytest.param(name, fault, marks=marks or slow))
    return cases


@pytest.mark.parametrize(("name", "fault"), _with_faults(SAVES))
def test_a_fault_at_every_write_step_leaves_the_earlier_output_or_the_new_one(saves, probe_dir, name, fault):
    """Was: `SentenceTransformer.save` killed after modules.json left a directory that loads with another
    max_seq_length; `save_pretrained` killed between its files left new weights beside the old config; `bertkit
    quantize --overwrite` removed the earlier output before writing the new one (a kill or a full disk: neither
    left), and a full disk in its safetensors write was a traceback."""
    make, write = saves[name]
    out = probe_dir / "work" / "out"
    out.parent.mkdir()
    if make is not None:  # by a process of its own, gone since, as the earlier output's maker is
        assert run_with_fault(lambda: make(out))[0] == "ok"
    before = snapshot(out)
    _reset(out, before)  # each run starts from the same files (the maker's lock file is the one left out)
    steps = write_steps(lambda: write(out))
    names = run_with_fault.names
    after = snapshot(out)
    assert after is not None and after != before and not leftovers(out)
    assert steps >= 8, steps
    recovered = set()
    for step in range(1, steps + 1):
        if fault == "full" and names[step - 1].startswith(NEVER_FULL):
            continue  # a removal: no full disk fails it
        _reset(out, before)
        outcome, _, error = run_with_fault(lambda: write(out), fault, step)
        state = snapshot(out)
        assert state in (before, after), (step, sorted(state or []), sorted(before or []), sorted(after))
        if fault == "full":  # one clear error naming the output; nothing changed, nothing left beside it
            if outcome == "ok":  # the writer expected this one to fail (a mkdir of a directory already there)
                assert state == after, step
                continue
            # a run that can be resumed (create-pretraining-data) keeps the units it finished in its staging
            kept = [f".{out.name}.bertkit-staging"] if name in RESUMED else []
            assert outcome == "raised" and state == before and leftovers(out) in ([], kept), (step, error)
            assert error.startswith(("WriteError: no space left on the device while writing",
                                     "BertkitError: exit 2: bertkit ")) and str(out) in error, (step, error)
            assert "no space left on the device while writing" in error, (step, error)
            if leftovers(out):  # --resume, once there is space, completes it to the uninterrupted run's output
                assert run_with_fault(functools.partial(RESUMED[name](saves), out))[0] == "ok", step
                assert snapshot(out) == after and not leftovers(out), step
            continue
        assert outcome == "killed"
        # the next write (a command --overwrite, where the killed one had finished) takes bertkit's leftovers for
        # its own: it succeeds and leaves nothing beside the output (tried once per kind of state a kill leaves)
        if (key := _leftover_kind(out, state)) in recovered:
            continue
        recovered.add(key)
        again = saves["bertkit quantize --overwrite"][1] if name == "bertkit quantize, new directory" else write
        outcome, _, error = run_with_fault(functools.partial(again, out))
        assert outcome == "ok", (step, error)
        assert snapshot(out) == after and not leftovers(out), step


@pytest.mark.slow  # a campaign (8 s); make test keeps the kill-and-resume cases of test_kill_resume_ends
def test_a_checkpoint_at_every_write_step_keeps_a_whole_one_to_resume(probe_dir, tiny_model):
    """A checkpoint write and the rotation after it, killed at every step: the newest whole checkpoint is the
    earlier one or the new one, never a torn one; the user's note in the rotated checkpoint stays."""
    import torch

    from bertkit.training.checkpoint import STEP_LAYOUT, remove_torn_writes, save_checkpoint
    from bertkit.training.resume_point import checkpoint_to_resume

    model = tiny_model("BertModel", seed=0)
    fingerprint = {"run": 1}

    def state(step):
        return {"model": {"w": torch.full((4,), float(step))}, "optimizer": {}, "scheduler": {}, "scaler": {},
                "position": {"step": step}, "fingerprint": fingerprint, "rank_rng": [], "world_size": 1,
                "windows": []}

    out = probe_dir / "run"
    save_checkpoint(out, state(1), 1, keep=1, model=model)
    (STEP_LAYOUT.path(out, 1) / "notes.txt").write_text("mine")
    template = probe_dir / "template"
    shutil.copytree(out, template)

    def write():
        save_checkpoint(out, state(2), 2, keep=1, model=model)

    steps = write_steps(write)
    assert steps >= 8
    for step in range(1, steps + 1):
        shutil.rmtree(out)
        shutil.copytree(template, out)
        assert run_with_fault(write, "kill", step)[0] == "killed"
        path, resumed = checkpoint_to_resume(out, fingerprint, STEP_LAYOUT, True)
        assert (path.name, resumed["position"]["step"]) in (("step-00000001", 1), ("step-00000002", 2)), step
        assert (STEP_LAYOUT.path(out, 1) / "notes.txt").read_text() == "mine"
        remove_torn_writes(out, STEP_LAYOUT)
        assert run_with_fault(write)[0] == "ok"
        assert [p.name for p in STEP_LAYOUT.dirs(out)] == ["step-00000001", "step-00000002"]
        assert sorted(p.name for p in STEP_LAYOUT.path(out, 1).iterdir()) == ["notes.txt"]
        assert not [p for p in (out / "checkpoints").iterdir() if p.name.startswith(".")], step


# -- Real file systems: full, read-only ------------------------------------------------------------------------


@contextlib.contextmanager
def _tmpfs(path: Path, size: str):
    """A small tmpfs at ``path`` (root only: skipped where it cannot be mounted)."""
    path.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                             capture_output=True).returncode == 0 if os.geteuid() == 0 else False
    if not mounted:
        pytest.skip("mounting a small tmpfs needs root")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=True)


def _fill(fs: Path, leave: int) -> None:
    st = os.statvfs(fs)
    (fs / "filler").write_bytes(b"x" * max(0, st.f_bavail * st.f_frsize - leave))


def test_quantize_overwrite_on_a_full_disk_keeps_the_earlier_output(models, tmp_path, capsys):
    """Was: `bertkit quantize --overwrite` on a disk with room for one output removed the earlier output, then
    failed writing the new one with safetensors' traceback: neither was left."""
    from bertkit.quantization import load_int8

    with _tmpfs(tmp_path / "fs", "400k") as fs:
        out = fs / "q"
        assert main(["quantize", "--model", str(models["clf_a"]), "--output-dir", str(out)]) == 0
        before = snapshot(out)
        _fill(fs, 40_000)  # room for the files of one output, not for two
        capsys.readouterr()
        code = main(["quantize", "--model", str(models["clf_b"]), "--output-dir", str(out), "--overwrite"])
        err = capsys.readouterr().err
        assert code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
        assert f"no space left on the device while writing {out}" in err and "free some space" in err
        assert snapshot(out) == before and not leftovers(out)
        load_int8(out)  # the earlier output, still loadable
        (fs / "filler").unlink()
        assert main(["quantize", "--model", str(models["clf_b"]), "--output-dir", str(out), "--overwrite"]) == 0
        assert snapshot(out) != before and not leftovers(out)


def test_finetune_on_a_full_disk_is_one_line_and_leaves_no_output(models, tmp_path, capsys):
    """Was: a full disk in the fine-tuned model's safetensors write ended in a traceback. Now one line, and the
    unfinished run is kept beside the output directory for --resume, which finishes it once there is room."""
    train = tmp_path / "train.csv"
    train.write_text("text,label\n" + "a good film,pos\ndull,neg\nfine film,pos\nbad,neg\n" * 2, encoding="utf-8")
    args = ["finetune", "classify", "--model", str(models["clf_a"]), "--train-file", str(train),
            "--validation-file", str(train), "--num-train-epochs", "1", "--batch-size", "4", "--no-progress",
            "--device", "cpu", "--save-strategy", "no"]
    with _tmpfs(tmp_path / "fs", "2m") as fs:
        _fill(fs, 110_000)  # room for the run's log and plot (about 50 kB), not for its model (about 100 kB)
        code = main([*args, "--output-dir", str(fs / "run")])
        err = capsys.readouterr().err
        assert code == 2 and "Traceback" not in err, err
        assert f"no space left on the device while writing {fs / 'run'}" in err.strip().splitlines()[-1]
        assert sorted(p.name for p in fs.iterdir()) == [".run.bertkit-staging", "filler"]  # no output yet
        (fs / "filler").unlink()
        assert main([*args, "--output-dir", str(fs / "run"), "--resume"]) == 0
        assert (fs / "run" / "best" / "model.safetensors").is_file() and not leftovers(fs / "run")


def test_a_full_disk_refusing_the_lock_leaves_the_directory_free_for_the_next_write(models, tmp_path, monkeypatch):
    """Was: a disk too full for the lock's one line (the first byte a save writes) failed the save, and the lock
    stayed registered as this process's: every later save of that directory in the process (once there was room)
    was refused as "the output directory of this process's `bertkit ` run already", and a Trainer's claim of its
    output directory failed with a bare OSError, leaving its lock file in the user's directory."""
    import errno

    from bertkit import BertModel
    from bertkit.runs import output_dir

    def full(*args):
        raise OSError(errno.ENOSPC, "No space left on device")

    model = BertModel.from_pretrained(models["a"])
    out, mine = tmp_path / "out", tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("the user's notes")
    with monkeypatch.context() as disk:
        disk.setattr(os, "pwrite", full)
        with pytest.raises(WriteError, match=f"no space left on the device while writing {out}: "):
            model.save_pretrained(out)
        with pytest.raises(WriteError, match=f"no space left on the device while writing {mine}: "):
            with output_dir(mine, "Trainer", in_place=True):
                pass
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine"] and os.listdir(mine) == ["notes.txt"]
    model.save_pretrained(out)  # room again: the same process writes it
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"] and not leftovers(out)
    assert (out / "model.safetensors").read_bytes() == (models["a"] / "model.safetensors").read_bytes()


@pytest.mark.parametrize("how", ["read-only file system", "no write permission"])
def test_a_read_only_directory_is_one_clear_error_and_changes_nothing(models, tmp_path, capsys, how):
    """Was: `SentenceTransformer.save` and `save_pretrained` into a read-only directory ended in the OSError of
    whichever file they reached; the command line named the system's words only. Now one WriteError (still an
    OSError) naming the output and the fix."""
    from bertkit import BertModel

    if how == "read-only file system":
        if os.geteuid() != 0:
            pytest.skip("mounting a read-only tmpfs needs root")
        context = _tmpfs(tmp_path / "fs", "1m")
    else:
        if os.geteuid() == 0:
            pytest.skip("root writes through any permission")
        (tmp_path / "fs").mkdir()
        context = contextlib.nullcontext(tmp_path / "fs")
    with context as place:
        assert run_with_fault(lambda: _cli("quantize", "--model", models["clf_a"], "--output-dir", place / "q"))[0] \
            == "ok"  # by a process of its own, gone since
        before = snapshot(place / "q")
        if how == "read-only file system":
            subprocess.run(["mount", "-o", "remount,ro", str(place)], check=True)
        else:
            for p in [place, *place.rglob("*")]:
                p.chmod(0o555 if p.is_dir() else 0o444)
        try:
            for write in (lambda: _sentence(models, "a", 16).save(place / "sentence"),
                          lambda: BertModel.from_pretrained(models["a"]).save_pretrained(place / "float")):
                with pytest.raises(WriteError, match=r"cannot write .*; choose a directory you can write to") as e:
                    write()
                assert isinstance(e.value, OSError) and e.value.errno in (30, 13)
            code = main(["quantize", "--model", str(models["clf_b"]), "--output-dir", str(place / "q"),
                         "--overwrite"])
            err = capsys.readouterr().err
            assert code == 2 and len(err.strip().splitlines()) == 1, err
            assert f"cannot write {place / 'q'}" in err and "choose a directory you can write to" in err
            assert snapshot(place / "q") == before and sorted(p.name for p in place.iterdir()) == ["q"]
        finally:
            if how == "read-only file system":
                subprocess.run(["mount", "-o", "remount,rw", str(place)], check=True)
            else:
                for p in [place, *place.rglob("*")]:
                    p.chmod(0o755 if p.is_dir() else 0o644)


@pytest.mark.parametrize("empty", [False, True], ids=["with-files", "empty"])
def test_a_directory_a_save_replaces_keeps_its_permissions_and_owner(tiny_model, tmp_path, empty):
    """Was: the directory swapped in had the process's default mode and owner: a private 0700 directory became
    readable by all (0755), a team's setgid directory lost its bit, and root's save took a user's directory."""
    mine = tmp_path / "mine"
    mine.mkdir()
    if not empty:
        (mine / "private").mkdir()
        (mine / "private" / "notes.txt").write_bytes(b"mine")
    for d in [mine, *mine.iterdir()]:
        d.chmod(0o2700)
        if os.geteuid() == 0:
            os.chown(d, 4321, 8765)
    before = {d: os.stat(d) for d in [mine, *mine.iterdir()]}
    tiny_model().save_pretrained(mine)
    for d, was in before.items():
        now = os.stat(d)
        assert oct(now.st_mode & 0o7777) == oct(0o2700) and (now.st_uid, now.st_gid) == (was.st_uid, was.st_gid), d
        assert now.st_ino != was.st_ino  # swapped in, not written in place
    assert snapshot(mine).keys() == {"config.json", "model.safetensors", *([] if empty else ["private/notes.txt"])}


@pytest.mark.parametrize("where", [".", "sub"], ids=["the-directory", "a-directory-in-it"])
def test_a_directory_its_owner_made_read_only_is_not_swapped_out_by_a_save(tiny_model, tmp_path, where):
    """Was: in a writable parent the save was staged beside the read-only directory and swapped in, replacing the
    user's config.json (a save into it in place fails), leaving the directory writable, then raised a WriteError
    saying nothing was replaced; with a read-only directory inside it, the swap was made, the old directory could not
    be removed, and every later save failed the same way, each saying nothing was replaced."""
    if os.geteuid() == 0:
        pytest.skip("root writes through any permission")
    mine = tmp_path / "mine"
    (mine / "sub").mkdir(parents=True)
    (mine / where / "config.json").write_bytes(b'{"mine": true}')
    (mine / where / "config.json").chmod(0o444)
    (mine / where).chmod(0o555)
    said = f"cannot write {mine}{'' if where == '.' else f' ({mine / where} in it is read-only'}"
    try:
        for _ in range(2):
            with pytest.raises(WriteError, match=re.escape(said)):
                tiny_model().save_pretrained(mine)
            assert snapshot(mine) == {f"{where}/config.json".removeprefix("./"): b'{"mine": true}'}
            assert (mine / where).stat().st_mode & 0o777 == 0o555
            assert sorted(p.name for p in tmp_path.iterdir()) == ["mine"]
    finally:
        (mine / where).chmod(0o755)


def test_a_mount_point_is_saved_into_file_by_file_and_refused_as_a_commands_output(models, tmp_path, capsys):
    """A mount point cannot be swapped: a save into it replaces its files one by one (each whole, as before), and a
    command's output directory there is refused by name, pointing at a directory inside it."""
    from bertkit import BertModel

    with _tmpfs(tmp_path / "fs", "1m") as fs:
        BertModel.from_pretrained(models["a"]).save_pretrained(fs)
        assert sorted(p.name for p in fs.iterdir()) == ["config.json", "model.safetensors"]
        code = main(["quantize", "--model", str(models["clf_a"]), "--output-dir", str(fs), "--overwrite"])
        err = capsys.readouterr().err
        assert code == 2 and f"{fs} is a mount point" in err and str(fs / "out") in err, err
        assert sorted(p.name for p in fs.iterdir()) == ["config.json", "model.safetensors"]


def test_ctrl_c_right_after_the_swap_removes_nothing_of_the_directory_it_replaced(tiny_model, tmp_path, monkeypatch):
    """Ctrl-C between the exchange and the lock's move: the staging name holds the replaced directory, unmarked.
    Was: the save's clean-up cleared it as its own staging directory, and a user's file a file system without hard
    links could not have linked into the new directory was gone; now it is left for the next write to carry back."""
    from bertkit import dir_lock

    out = tmp_path / "out"
    tiny_model().save_pretrained(out)
    (out / "notes.txt").write_text("the user's notes")

    def no_hard_links(src, dst, *args, **kwargs):
        raise OSError(1, "Operation not permitted")

    def interrupted(old, new):
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "link", no_hard_links)
    monkeypatch.setattr(dir_lock, "moved", interrupted)
    with pytest.raises(KeyboardInterrupt):
        tiny_model(seed=1).save_pretrained(out)
    monkeypatch.undo()
    assert (tmp_path / ".out.bertkit-staging" / "notes.txt").read_text() == "the user's notes"
    tiny_model(seed=2).save_pretrained(out)  # the next write of the name carries it back
    assert (out / "notes.txt").read_text() == "the user's notes" and sorted(os.listdir(tmp_path)) == ["out"]


def test_a_save_while_another_process_disposes_of_the_directory_it_replaced_is_refused(tiny_model, tmp_path):
    """Another process's save has just swapped its directory in (its lock moved with it into ``out``) and is
    disposing of the one it replaced, which lies at the staging name, unlocked. Was: a second save took that for a
    kill's leftover and disposed of it too: both ended in "No such file or directory", out.replaced-* directories
    were left, or "out is the output directory of this process's run". Now refused naming the holder, untouched."""
    import sys

    out, staging = tmp_path / "out", tmp_path / ".out.bertkit-staging"
    tiny_model().save_pretrained(out)
    staging.mkdir()
    (staging / "config.json").write_text("the replaced directory's")
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from pathlib import Path; from bertkit import "
                               "dir_lock; dir_lock.lock(Path(sys.argv[1]), 'save'); print('ready', flush=True); "
                               "time.sleep(60)", str(out)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "ready"
        with pytest.raises(BertkitError, match=rf"^{re.escape(str(out))} is in use by pid {holder.pid} \(bertkit save\)"):
            tiny_model(seed=1).save_pretrained(out)
    finally:
        holder.kill()
        holder.wait()
    assert sorted(os.listdir(staging)) == ["config.json"] and sorted(os.listdir(tmp_path)) == sorted(["out", staging.name])


def test_an_evaluator_row_a_full_disk_cuts_short_is_not_left_torn(tmp_path):
    """Was: on a full disk an evaluator's results row was written in part (the room left on the file's last page),
    raised a bare OSError, and the next call, once there was room, appended its row to the torn one."""
    from bertkit.sentence.evaluation.base import write_results_csv

    headers = ["epoch", "steps", *(f"metric_{i}" for i in range(20))]

    def row(i):
        return [0, i, *([0.123456789] * 20)]

    with _tmpfs(tmp_path / "fs", "64k") as fs:
        path = fs / "results.csv"
        write_results_csv(path, headers, row(0))
        _fill(fs, 0)  # the file's page has room for some 15 rows, the disk for no page more
        with pytest.raises(WriteError, match=f"no space left on the device while writing {path}: "):
            for i in range(1, 100):
                write_results_csv(path, headers, row(i))
        (fs / "filler").unlink()
        write_results_csv(path, headers, row(100))
        lines = path.read_bytes().decode().split("\r\n")
        assert lines[-1] == "" and [len(line.split(",")) for line in lines[:-1]] == [22] * (i + 2)
        assert [line.split(",")[1] for line in lines[1:-1]] == [str(n) for n in (*range(i), 100)]
