"""create-pretraining-data cut short (SIGKILL at a unit boundary or mid-unit, Ctrl-C), then --resume: only the
units not finished are made, a torn or changed shard is made again, and the output is byte for byte an
uninterrupted run's, whatever the number of workers; a resume with other settings, input files or tokenizer is
refused naming the value and the fix, and so is one whose plan of work units differs.

Real text: six articles of the shared corpus cut into three work units; tokenizer: the MiniLM vocabulary.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from bertkit.cli import main
from bertkit.data import pretraining
from bertkit.errors import BertkitError
from bertkit.tokenization import BertTokenizer

ROOT = Path(__file__).resolve().parents[1]
CORPUS = Path(os.environ.get("BERTKIT_DATA", "/work/shared/data")) / "corpus" / "wikipedia"
MODEL = Path(os.environ.get("BERTKIT_TEST_MODEL", ROOT / "models" / "minilm"))
CONFIG = {"max_seq_length": 64, "dupe_factor": 1, "unit_bytes": 30_000, "seed": 3}
FLAGS = ["--max-seq-length", "64", "--dupe-factor", "1", "--unit-bytes", "30000", "--seed", "3", "--no-progress"]

pytestmark = [
    pytest.mark.skipif(not CORPUS.is_dir(), reason="shared corpus not present"),
    pytest.mark.skipif(not (MODEL / "vocab.txt").is_file(), reason=f"no vocab.txt in {MODEL}"),
]


@pytest.fixture(scope="module")
def tok() -> BertTokenizer:
    return BertTokenizer.from_pretrained(MODEL)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> list[str]:
    """Copies (their modification times are the tests' to change) of six articles: three work units."""
    root = tmp_path_factory.mktemp("corpus")
    files = []
    for path in sorted(CORPUS.glob("*.md"))[:6]:
        (root / path.name).write_bytes(path.read_bytes())
        files.append(str(root / path.name))
    return files


@pytest.fixture(scope="module")
def reference(tok, corpus, tmp_path_factory) -> dict[str, str]:
    out = tmp_path_factory.mktemp("reference") / "out"
    result = pretraining.create_pretraining_data(corpus, tok, out, num_workers=0, progress=False, **CONFIG)
    assert len(result["shards"]) == 3
    return _contents(out)


def _contents(directory: Path) -> dict[str, str]:
    """Every file but bertkit's bookkeeping (the lock, the run's own manifest), by name: its sha256."""
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.iterdir())
            if not p.name.startswith(".bertkit-")}


def _staging(out: Path) -> Path:
    return out.parent / f".{out.name}.bertkit-staging"


def _interrupted(monkeypatch, tok, corpus, out: Path, at_unit: int) -> None:
    """A run in this process stopped by Ctrl-C as it starts unit ``at_unit``."""
    real = pretraining._Job.run

    def run(job, unit):
        if unit.index == at_unit:
            raise KeyboardInterrupt
        return real(job, unit)

    with monkeypatch.context() as m:
        m.setattr(pretraining._Job, "run", run)
        with pytest.raises(KeyboardInterrupt):
            pretraining.create_pretraining_data(corpus, tok, out, num_workers=0, progress=False, **CONFIG)


def _counting(monkeypatch) -> list[int]:
    made: list[int] = []
    real = pretraining._Job.run

    def run(job, unit):
        made.append(unit.index)
        return real(job, unit)

    monkeypatch.setattr(pretraining._Job, "run", run)
    return made


def test_ctrl_c_then_resume_makes_only_the_rest_and_the_same_bytes(monkeypatch, tok, corpus, reference, tmp_path):
    out = tmp_path / "out"
    _interrupted(monkeypatch, tok, corpus, out, at_unit=2)
    assert not out.exists()
    kept = sorted(p.name for p in _staging(out).iterdir())
    assert "shard-00001.type_start.npy" in kept and not any(n.startswith("shard-00002") for n in kept)
    with pytest.raises(BertkitError, match="was cut short; .*pass --resume to continue it, or --overwrite"):
        pretraining.create_pretraining_data(corpus, tok, out, num_workers=0, progress=False, **CONFIG)
    made = _counting(monkeypatch)
    pretraining.create_pretraining_data(corpus, tok, out, num_workers=0, progress=False, resume=True, **CONFIG)
    assert made == [2]
    assert _contents(out) == reference
    assert not _staging(out).exists() and not (out / "units").exists()


def test_a_torn_or_changed_shard_is_made_again(monkeypatch, tok, corpus, reference, tmp_path):
    out = tmp_path / "out"
    _interrupted(monkeypatch, tok, corpus, out, at_unit=2)
    torn = _staging(out) / "shard-00001.input_ids.npy"
    torn.write_bytes(torn.read_bytes()[:100])  # half a file under its final name: its recorded sha256 differs
    made = _counting(monkeypatch)
    pretraining.create_pretraining_data(corpus, tok, out, num_workers=0, progress=False, resume=True, **CONFIG)
    assert made == [1, 2]
    assert _contents(out) == reference


def test_resume_refuses_other_input_tokenizer_or_settings(monkeypatch, tok, corpus, tmp_path):
    out = tmp_path / "out"
    _interrupted(monkeypatch, tok, corpus, out, at_unit=1)
    run = {"num_workers": 0, "progress": False, "resume": True}
    with pytest.raises(BertkitError, match=r"its `bertkit create-pretraining-data` run had other settings \(--seed 3 "
                                           r"then, 4 now\); resume with the original settings, pass --overwrite"):
        pretraining.create_pretraining_data(corpus, tok, out, **run, **{**CONFIG, "seed": 4})
    uncased = BertTokenizer.from_pretrained(MODEL, do_lower_case=False)
    with pytest.raises(BertkitError, match=r"run used another tokenizer \(do_lower_case True then, False now\); "
                                           r"resume with the original tokenizer \(--vocab\), pass --overwrite"):
        pretraining.create_pretraining_data(corpus, uncased, out, **run, **CONFIG)
    # google's word length (tokenization.py: 200): a word of 101 to 200 characters is pieces, where 100 makes one [UNK]
    google_words = BertTokenizer.from_pretrained(MODEL, max_input_chars_per_word=200)
    with pytest.raises(BertkitError, match=r"run used another tokenizer \(max_input_chars_per_word None then, 200 "
                                           r"now\); resume with the original tokenizer"):
        pretraining.create_pretraining_data(corpus, google_words, out, **run, **CONFIG)
    with pytest.raises(BertkitError, match=r"read other input files \(6 file\(s\): .* then, 5 file\(s\)"):
        pretraining.create_pretraining_data(corpus[:5], tok, out, **run, **CONFIG)
    changed = Path(corpus[0])
    st = changed.stat()
    os.utime(changed, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    try:
        with pytest.raises(BertkitError) as e:
            pretraining.create_pretraining_data(corpus, tok, out, **run, **CONFIG)
    finally:
        os.utime(changed, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert f"run read input file {changed} as it was then ({st.st_size:,} bytes, modified " in str(e.value)
    assert "it changed since" in str(e.value) and "resume with the original file, pass --overwrite" in str(e.value)
    plan_file = _staging(out) / "units" / "plan.json"
    plan = json.loads(plan_file.read_text())
    plan["units"] = {"count": 4, "sha256": "0" * 64}  # as a bertkit version that cuts the corpus otherwise wrote it
    plan_file.write_text(json.dumps(plan))
    with pytest.raises(BertkitError, match=r"run cut the corpus into other work units \(4 units then, 3 now: another "
                                           r"bertkit version\); finish it with the bertkit version that started it, "
                                           r"pass --overwrite to start again"):
        pretraining.create_pretraining_data(corpus, tok, out, **run, **CONFIG)
    assert (_staging(out) / "shard-00000.input_ids.npy").is_file()  # a refused resume keeps the run it refused
    with pytest.raises(BertkitError, match="resume and overwrite are both set"):
        pretraining.create_pretraining_data(corpus, tok, out, **run, overwrite=True, **CONFIG)


_CHILD = textwrap.dedent("""
    import io, os, signal, sys
    from pathlib import Path
    import numpy as np
    from bertkit.data import pretraining, unit_records

    where, k = sys.argv[1], int(sys.argv[2])
    real_record, real_save = unit_records.record, pretraining.save_shard

    def record(out, index, result):
        real_record(out, index, result)
        if where == "boundary" and index == k:  # unit k finished and recorded, the next not started
            os.kill(os.getpid(), signal.SIGKILL)

    def save_shard(out, name, arrays):
        if where == "mid" and name == f"shard-{k:05d}":  # two of its files written, the third torn
            items = list(arrays.items())
            real_save(out, name, dict(items[:2]))
            buf = io.BytesIO()
            np.save(buf, items[2][1])
            with open(Path(out) / f"{name}.{items[2][0]}.npy", "wb") as f:
                f.write(buf.getvalue()[: len(buf.getvalue()) // 2])
            os.kill(os.getpid(), signal.SIGKILL)
        return real_save(out, name, arrays)

    unit_records.record, pretraining.save_shard = record, save_shard
    from bertkit.cli import main
    sys.exit(main(sys.argv[3:]))
""")


@pytest.mark.parametrize(("where", "workers", "made"), [
    ("boundary", "2", [1, 2]),
    # a shard torn mid-unit is also made again in test_a_torn_or_changed_shard_is_made_again, in process
    pytest.param("mid", "1", [1, 2], marks=pytest.mark.slow),
])
def test_sigkill_then_resume_gives_an_uninterrupted_runs_bytes(monkeypatch, corpus, reference, tmp_path, where,
                                                                workers, made):
    """Killed after unit 0's record (boundary) or inside unit 1's shard writes (mid), then resumed with another
    number of workers: the resume makes units 1 and 2 (a torn unit's files are not trusted)."""
    out = tmp_path / "out"
    args = ["create-pretraining-data", *corpus, "--vocab", str(MODEL), "--output-dir", str(out), *FLAGS]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    child = subprocess.run([sys.executable, "-c", _CHILD, where, "0" if where == "boundary" else "1", *args,
                            "--num-workers", "1"], env=env, capture_output=True, text=True, timeout=120)
    assert child.returncode == -9, child.stderr
    assert (_staging(out) / "units" / "shard-00000.json").is_file()
    assert not (_staging(out) / "units" / "shard-00001.json").exists()
    if workers == "1":  # in this process: count the units it makes
        counted = _counting(monkeypatch)
    assert main([*args, "--resume", "--num-workers", workers]) == 0
    if workers == "1":
        assert counted == made
    assert _contents(out) == reference


def test_resume_and_overwrite_together_are_refused_on_the_command_line(corpus, tmp_path, capsys):
    assert main(["create-pretraining-data", *corpus, "--vocab", str(MODEL), "--output-dir", str(tmp_path / "o"),
                 "--resume", "--overwrite"]) == 2
    assert "--resume and --overwrite are both set" in capsys.readouterr().err


def test_a_corpus_refused_in_its_last_unit_leaves_nothing_and_the_corrected_run_is_not_refused(tok, corpus, reference,
                                                                                               tmp_path, capsys):
    """Bytes that are not UTF-8 in the last work unit: the two finished units were kept for --resume, which the
    corrected file (changed since it was read) then refused, as a plain run refused the kept run: --overwrite was the
    only way on. The input's own error leaves nothing now, and the corrected run makes the reference's bytes."""
    files = [str(tmp_path / Path(f).name) for f in corpus]
    for copy, original in zip(files, corpus):
        Path(copy).write_bytes(Path(original).read_bytes())
    good = Path(files[-1]).read_bytes()
    Path(files[-1]).write_bytes(good + b"\nA last line \xff of bad bytes.\n")
    out = tmp_path / "out"
    argv = ["create-pretraining-data", *files, "--vocab", str(MODEL), "--output-dir", str(out), *FLAGS,
            "--num-workers", "1"]
    assert main(argv) == 2
    assert "is not valid UTF-8" in capsys.readouterr().err
    assert not out.exists() and not _staging(out).exists()
    Path(files[-1]).write_bytes(good)
    assert main(argv) == 0, capsys.readouterr().err
    made = _contents(out)  # the manifest names the copies' paths
    assert made.pop("manifest.json") and made == {k: v for k, v in reference.items() if k != "manifest.json"}


@pytest.mark.slow
def test_a_script_without_a_main_guard_is_told_so_not_left_waiting(corpus, tmp_path):
    """Was a hang: each spawned worker runs the script again, and died there (on the output directory its parent
    held) before reading its arguments, the tokenizer among them; the parent, writing them into the pipe the worker
    starts from, waited for ever once they passed the pipe's 64 KiB (MiniLM's vocabulary does)."""
    script = tmp_path / "make.py"
    script.write_text("import sys\nfrom bertkit.data import create_pretraining_data\n"
                      "from bertkit.tokenization import BertTokenizer\n"
                      f"create_pretraining_data(sys.argv[1:], BertTokenizer.from_pretrained({str(MODEL)!r}), "
                      f"{str(tmp_path / 'out')!r}, num_workers=2, progress=False, **{CONFIG!r})\n", encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    done = subprocess.run([sys.executable, str(script), *corpus], capture_output=True, text=True, timeout=90, env=env)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1] == (
        "bertkit.errors.BertkitError: a worker process ended before its work was done (num_workers=2). Workers start "
        "by running the calling script again: in a script, call this under `if __name__ == \"__main__\":` (or pass "
        "num_workers=1). Otherwise the machine may have killed it for memory: pass fewer workers")
    assert "this worker process is running the calling script again" in done.stderr  # the worker's own, not the lock's
    assert "is in use by pid" not in done.stderr


def test_workers_get_their_arguments_from_a_file_not_the_pipe_they_start_from(monkeypatch, tok):
    """The cheap half of the test above: what starts a worker stays small (a path), however large the job."""
    import pickle

    from bertkit import _parallel

    made = []

    class Recorder:
        def __init__(self, workers, **kwargs):
            made.append(kwargs)

        def shutdown(self, **kwargs):
            pass

    monkeypatch.setattr(_parallel, "ProcessPoolExecutor", Recorder)
    job = pretraining._Job(pretraining.PretrainingConfig(), tok, "out")
    with _parallel.spawn_pool(2, 4, pretraining._init_worker, (job,)):
        start = pickle.dumps(made[0]["initargs"])
        assert len(pickle.dumps(job)) > 1 << 16 > 50 * len(start)
        with open(made[0]["initargs"][0], "rb") as f:
            initializer, initargs = pickle.load(f)
        assert initializer is pretraining._init_worker and initargs[0].tables.mask_id == tok.mask_token_id
    assert not os.path.exists(made[0]["initargs"][0])
