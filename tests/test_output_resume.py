"""`bertkit predict` and `extract-features` cut short (SIGKILL in a child process, or Ctrl-C from a hook), then
--resume: the rows finished before the kill are kept, a row torn by the kill is made again, and the finished file is
byte for byte an uninterrupted run's; a plain run is refused naming --resume and --overwrite, and a resume with
another input file, setting or model is refused naming the value then and now.

Real text (SST-2 dev sentences), MiniLM's first 2 layers; chunks of 6 inputs in batches of 2 (the command's are
64 batches of at least 1,024 inputs) so that a run of 24 inputs has four chunks to be cut between.
"""

from __future__ import annotations

import csv
import json
import os
import signal
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from bertkit import partial_output
from bertkit.cli import main
from bertkit.inference import files

ROOT = Path(__file__).resolve().parents[1]
SST2 = Path(os.environ.get("BERTKIT_DATA", ROOT.parent / "shared" / "data")) / "glue" / "SST-2" / "dev.tsv"
CHUNK = {"MIN_CHUNK": 1, "CHUNK_BATCHES": 3}  # batch size 2: 6 inputs a chunk

pytestmark = pytest.mark.skipif(not SST2.is_file(), reason=f"SST-2 not found at {SST2}")


@pytest.fixture(scope="module")
def texts() -> list[str]:
    with open(SST2, encoding="utf-8", newline="") as f:
        return [row["sentence"] for row in csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE)][:24]


@pytest.fixture
def small_chunks(monkeypatch):
    for name, value in CHUNK.items():
        monkeypatch.setattr(files, name, value)


def _predict(task: str, model: Path, inputs: Path, out: Path, *flags: str) -> int:
    return main(["predict", task, "--model", str(model), "--input", str(inputs), "--output-file", str(out),
                 "--batch-size", "2", "--no-progress", *flags])


def _cut_after(monkeypatch, commits: int) -> None:
    """Ctrl-C once ``commits`` chunks are recorded."""
    real, seen = partial_output.Appender.commit, []

    def commit(self, rows, **extra):
        real(self, rows, **extra)
        seen.append(rows)
        if len(seen) == commits:
            raise KeyboardInterrupt

    monkeypatch.setattr(partial_output.Appender, "commit", commit)


def _predict_cut_short(monkeypatch, commits: int, task: str, model: Path, inputs: Path, out: Path, *flags: str) -> None:
    """A predict run Ctrl-C'd once ``commits`` chunks are recorded; the small chunks (``CHUNK``) kept for the next."""
    _cut_after(monkeypatch, commits)
    assert _predict(task, model, inputs, out, *flags) == 130  # interrupted
    monkeypatch.undo()
    for name, value in CHUNK.items():
        monkeypatch.setattr(files, name, value)


def test_predict_cut_short_resumes_to_the_bytes_of_an_uninterrupted_run(seeded_classifier, texts, tmp_path, monkeypatch,
                                                                        small_chunks, capsys):
    inputs = tmp_path / "in.txt"
    inputs.write_text("\n".join(texts) + "\n", encoding="utf-8")
    assert _predict("text-classification", seeded_classifier, inputs, tmp_path / "whole.jsonl") == 0
    out = tmp_path / "out.jsonl"
    _predict_cut_short(monkeypatch, 2, "text-classification", seeded_classifier, inputs, out)
    assert not out.exists()  # a reader never sees part of the file at its name
    kept = tmp_path / ".out.jsonl.bertkit-partial"
    assert len(kept.read_bytes().splitlines()) == 12
    capsys.readouterr()
    assert _predict("text-classification", seeded_classifier, inputs, out) == 2
    err = capsys.readouterr().err
    assert (f"the last `bertkit predict text-classification` run into {out} was cut short after 12 row(s); its rows "
            f"are in {kept}: pass --resume to continue it, or --overwrite to start again (they are removed)") in err
    with open(kept, "ab") as f:
        f.write(b'{"id": 12, "label": "posi')  # a row torn by the kill: dropped and made again
    assert _predict("text-classification", seeded_classifier, inputs, out, "--resume") == 0
    assert out.read_bytes() == (tmp_path / "whole.jsonl").read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt", "out.jsonl", "whole.jsonl"]


def test_predict_resumed_over_rows_changed_since_makes_every_row_again(seeded_classifier, texts, tmp_path, monkeypatch,
                                                                      small_chunks, caplog):
    """A recorded row changed after the kill (a byte of the partial file flipped) fails the record's sha256: every
    row is made again, and the file is still the uninterrupted run's."""
    inputs = tmp_path / "in.txt"
    inputs.write_text("\n".join(texts) + "\n", encoding="utf-8")
    assert _predict("text-classification", seeded_classifier, inputs, tmp_path / "whole.jsonl") == 0
    out = tmp_path / "out.jsonl"
    _predict_cut_short(monkeypatch, 2, "text-classification", seeded_classifier, inputs, out)
    kept = tmp_path / ".out.jsonl.bertkit-partial"
    kept.write_bytes(kept.read_bytes().replace(b'"id": 3', b'"id": 9', 1))
    with caplog.at_level("WARNING", logger="bertkit"):
        assert _predict("text-classification", seeded_classifier, inputs, out, "--resume") == 0
    assert "differs from the rows recorded when it was written: every row is made again" in caplog.text
    assert out.read_bytes() == (tmp_path / "whole.jsonl").read_bytes()


_KILLER = """
    import os, signal, sys
    from bertkit import partial_output
    from bertkit.inference import files
    files.MIN_CHUNK, files.CHUNK_BATCHES = 1, 3
    commit = partial_output.Appender.commit

    def killed(self, rows, **extra):  # SIGKILL with half a row written after the second chunk's
        commit(self, rows, **extra)
        if rows == 12:
            self.write('{"id": 12, "entit')
            self.file.flush()
            os.kill(os.getpid(), signal.SIGKILL)

    partial_output.Appender.commit = killed
    from bertkit.cli import main
    main(sys.argv[1:])
"""


def _child(script: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(script), *args], env=env, capture_output=True,
                          text=True, timeout=120)


@pytest.mark.slow  # a child process (1.6 s); the classification predict's kill by a hook stays in make test
def test_predict_token_task_killed_in_a_child_resumes_to_the_same_bytes(texts, tmp_path, minilm_2_layers,
                                                                         tiny_checkpoint, small_chunks):
    model = tiny_checkpoint(tmp_path / "ner", "BertForTokenClassification", tokenizer=minilm_2_layers,
                            labels=["O", "B-PER", "I-PER", "B-LOC", "I-LOC"])
    inputs = tmp_path / "in.jsonl"
    inputs.write_text("".join(json.dumps({"text": t, "key": f"s{i}"}) + "\n" for i, t in enumerate(texts)),
                      encoding="utf-8")
    flags = ["--id-column", "key", "--aggregation-strategy", "average"]
    assert _predict("token-classification", model, inputs, tmp_path / "whole.jsonl", *flags) == 0
    out = tmp_path / "out.jsonl"
    done = _child(_KILLER, "predict", "token-classification", "--model", str(model), "--input", str(inputs),
                  "--output-file", str(out), "--batch-size", "2", "--no-progress", *flags)
    assert done.returncode == -signal.SIGKILL, done.stderr
    assert not out.exists()
    assert (tmp_path / ".out.jsonl.bertkit-partial").read_bytes().endswith(b'{"id": 12, "entit')
    assert _predict("token-classification", model, inputs, out, "--resume", *flags) == 0
    assert out.read_bytes() == (tmp_path / "whole.jsonl").read_bytes()


def test_a_resume_with_another_input_setting_or_model_is_refused_naming_it(seeded_classifier, texts, tmp_path, monkeypatch,
                                                                          small_chunks, capsys):
    import shutil

    model = tmp_path / "model"
    shutil.copytree(seeded_classifier, model)
    inputs = tmp_path / "in.txt"
    inputs.write_text("\n".join(texts) + "\n", encoding="utf-8")
    out = tmp_path / "out.jsonl"
    _predict_cut_short(monkeypatch, 1, "text-classification", model, inputs, out)
    capsys.readouterr()
    record = tmp_path / ".out.jsonl.bertkit-partial.json"
    written = record.read_text(encoding="utf-8")
    record.write_text(json.dumps({**json.loads(written), "pid": os.getppid()}), encoding="utf-8")  # a live writer
    assert _predict("text-classification", model, inputs, out, "--resume") == 2
    assert (f"{out} is being written by another bertkit command (process {os.getppid()}, `bertkit predict "
            "text-classification`); wait for it to finish") in capsys.readouterr().err
    record.write_text(written, encoding="utf-8")
    assert _predict("text-classification", model, inputs, out, "--resume", "--max-length", "64") == 2
    assert (f"cannot --resume into {out}: its `bertkit predict text-classification` run was cut short with other "
            "settings (--max-length None then, 64 now); resume with the original settings, pass --overwrite to start "
            "again") in capsys.readouterr().err
    st = inputs.stat()
    os.utime(inputs, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    assert _predict("text-classification", model, inputs, out, "--resume") == 2
    err = capsys.readouterr().err
    assert f"cut short with another input file ('{inputs}' ({st.st_size:,} bytes, modified " in err
    assert err.count(f"{st.st_size:,} bytes") == 2 and "then," in err and "now); resume with the original input" in err
    os.utime(inputs, ns=(st.st_atime_ns, st.st_mtime_ns))
    weights = model / "model.safetensors"
    os.utime(weights, ns=(weights.stat().st_atime_ns, weights.stat().st_mtime_ns + 10**9))
    assert _predict("text-classification", model, inputs, out, "--resume") == 2
    assert "cut short with another model (model.safetensors (" in capsys.readouterr().err
    assert _predict("text-classification", model, inputs, out, "--resume", "--overwrite") == 2
    assert "--resume and --overwrite are both set" in capsys.readouterr().err
    assert _predict("text-classification", model, inputs, out, "--overwrite") == 0  # starts again
    assert len(out.read_text(encoding="utf-8").splitlines()) == 24
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt", "model", "out.jsonl"]


# -- extract-features -----------------------------------------------------------------------------------------------

_FEATURES = dict(layers=[-1, -2], batch_size=2, chunk_size=4, max_shard_bytes=600_000, progress=False)  # 4 shards


def _without_extraction(data: bytes) -> bytes:
    """A .safetensors shard's bytes with its extraction's id blanked (each extraction draws its own)."""
    if data.startswith(b'{"linex_index"'):  # a .jsonl
        return data
    header = json.loads(data[8:8 + struct.unpack("<Q", data[:8])[0]])
    return data.replace(header["__metadata__"]["extraction"].encode(), b"0" * 32)


def _features_model(path: Path):
    from bertkit.modeling import BertModel
    from bertkit.tokenization import BertTokenizer

    return BertModel.from_pretrained(path), BertTokenizer.from_pretrained(path)


@pytest.mark.parametrize("suffix", [".jsonl", ".safetensors"])
def test_extract_features_cut_short_resumes_to_the_same_bytes(minilm_2_layers, texts, tmp_path, monkeypatch, suffix):
    from bertkit import features

    model, tok = _features_model(minilm_2_layers)
    pairs = [(t, None) for t in texts]
    whole = features.extract_features(model, tok, pairs, tmp_path / f"whole{suffix}", **_FEATURES)["files"]
    assert len(whole) == (1 if suffix == ".jsonl" else 4)
    run, calls = features.run_batches, []

    def cut(*args, **kwargs):  # Ctrl-C as the third unit starts (the second shard's first)
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return run(*args, **kwargs)

    out = tmp_path / f"out{suffix}"
    monkeypatch.setattr(features, "run_batches", cut)
    with pytest.raises(KeyboardInterrupt):
        features.extract_features(model, tok, pairs, out, **_FEATURES)
    monkeypatch.undo()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("out")]
    with pytest.raises(Exception, match=r"was cut short after .*pass --resume to continue it, or --overwrite"):
        features.extract_features(model, tok, pairs, out, **_FEATURES)
    done = features.extract_features(model, tok, pairs, out, resume=True, **_FEATURES)["files"]
    assert [Path(p).name.replace("out", "whole") for p in done] == [Path(p).name for p in whole]
    for a, b in zip(done, whole):
        assert _without_extraction(Path(a).read_bytes()) == _without_extraction(Path(b).read_bytes())
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]


_FEATURES_KILLER = """
    import json, os, signal, sys
    from bertkit import features
    from bertkit.modeling import BertModel
    from bertkit.tokenization import BertTokenizer
    model_dir, out, texts, options = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), json.loads(sys.argv[4])
    run, calls = features.run_batches, []

    def killed(*args, **kwargs):  # SIGKILL as the fourth unit starts: shard 1 whole, shard 2 part made
        calls.append(1)
        if len(calls) == 4:
            os.kill(os.getpid(), signal.SIGKILL)
        return run(*args, **kwargs)

    features.run_batches = killed
    features.extract_features(BertModel.from_pretrained(model_dir), BertTokenizer.from_pretrained(model_dir),
                              [(t, None) for t in texts], out, **options)
"""


# a child process; the resume of a safetensors extraction cut short (by a hook, in this process) is make test's in
# test_extract_features_cut_short_resumes_to_the_same_bytes
@pytest.mark.slow
def test_extract_features_safetensors_killed_in_a_child_resumes_to_the_same_bytes(minilm_2_layers, texts, tmp_path):
    from bertkit import features

    model, tok = _features_model(minilm_2_layers)
    pairs = [(t, None) for t in texts]
    whole = features.extract_features(model, tok, pairs, tmp_path / "whole.safetensors", **_FEATURES)["files"]
    out = tmp_path / "out.safetensors"
    done = _child(_FEATURES_KILLER, str(minilm_2_layers), str(out), json.dumps(texts), json.dumps(_FEATURES))
    assert done.returncode == -signal.SIGKILL, done.stderr
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("out")]
    resumed = features.extract_features(model, tok, pairs, out, resume=True, **_FEATURES)["files"]
    # the metadata in one order whatever the process (safetensors writes its hash map's order)
    for a, b in zip(resumed, whole, strict=True):
        assert _without_extraction(Path(a).read_bytes()) == _without_extraction(Path(b).read_bytes())
    assert [r["line_index"] for r in features.read_features(out)] == list(range(24))


def test_a_resumed_overwrite_replaces_the_file_it_was_told_to_and_keeps_it_until_then(seeded_classifier, texts, tmp_path,
                                                                                      monkeypatch, small_chunks):
    inputs = tmp_path / "in.txt"
    inputs.write_text("\n".join(texts) + "\n", encoding="utf-8")
    out = tmp_path / "out.jsonl"
    assert _predict("text-classification", seeded_classifier, inputs, out) == 0
    whole = out.read_bytes()
    out.write_bytes(b"an earlier file\n")
    _predict_cut_short(monkeypatch, 1, "text-classification", seeded_classifier, inputs, out, "--overwrite")
    assert out.read_bytes() == b"an earlier file\n"  # replaced only when the new file is whole
    assert _predict("text-classification", seeded_classifier, inputs, out, "--resume") == 0  # as the run it continues was
    assert out.read_bytes() == whole


_RESUME_UNDER_TORCHRUN = """
    import datetime, json, sys
    import torch.distributed as dist
    from bertkit import features
    from bertkit.modeling import BertModel
    from bertkit.tokenization import BertTokenizer
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=90))  # a rank left waiting fails in 90 s
    model_dir, out, texts, options = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), json.loads(sys.argv[4])
    features.extract_features(BertModel.from_pretrained(model_dir), BertTokenizer.from_pretrained(model_dir),
                              [(t, None) for t in texts], out, **options)
    dist.destroy_process_group()
"""


@pytest.mark.slow  # a child and a torchrun of two processes (about 15 s on 2 cores)
@pytest.mark.parametrize("suffix", [".jsonl", ".safetensors"])
def test_a_torn_partial_file_resumed_under_torchrun_is_made_again_on_every_rank(minilm_2_layers, texts, tmp_path,
                                                                                suffix):
    """Was: each rank read the record of the run cut short on its own and skipped the units it names, while rank 0
    found the file torn and made them again, so rank 0 gathered rank 1's states of other units (KeyError: 2, or a
    hang). Now rank 0 proves the record and tells the others: the resumed file is the uninterrupted run's."""
    import torch

    from bertkit import features
    from launch_helpers import run_torchrun

    model, tok = _features_model(minilm_2_layers)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as each torchrun worker (OMP_NUM_THREADS=1): the same kernels, the same bits
    try:
        whole = features.extract_features(model, tok, [(t, None) for t in texts], tmp_path / f"whole{suffix}",
                                          **_FEATURES)["files"]
    finally:
        torch.set_num_threads(threads)
    out = tmp_path / f"out{suffix}"
    killed = _child(_FEATURES_KILLER, str(minilm_2_layers), str(out), json.dumps(texts), json.dumps(_FEATURES))
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    torn = partial_output.partial_path(out) if suffix == ".jsonl" else partial_output.partial_path(  # shard 1: whole
        Path(whole[0]).with_name(Path(whole[0]).name.replace("whole", "out")))
    torn.write_bytes(torn.read_bytes()[:-7])
    script = tmp_path / "resume.py"
    script.write_text(textwrap.dedent(_RESUME_UNDER_TORCHRUN), encoding="utf-8")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(sys.path)}
    done = run_torchrun([str(script), str(minilm_2_layers), str(out), json.dumps(texts),
                         json.dumps({**_FEATURES, "resume": True})], env, 240)
    assert done.returncode == 0, done.stderr[:6000]
    assert "differs from" in done.stderr  # rank 0's warning: the torn file's units were made again
    for name in (Path(p).name for p in whole):
        resumed = (tmp_path / name.replace("whole", "out")).read_bytes()
        assert _without_extraction(resumed) == _without_extraction((tmp_path / name).read_bytes()), name
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]


@pytest.mark.slow  # a child and a torchrun of two processes (about 15 s on 2 cores)
def test_a_resume_rank_0_refuses_under_torchrun_stops_every_rank_at_once(minilm_2_layers, texts, tmp_path):
    """Was: rank 0 alone claims the output; when it refused the run (here a plain re-run of a run cut short, neither
    --resume nor --overwrite), it stopped while rank 1 went on to its first gather and failed there with gloo's
    traceback of a connection closed by its peer (or waited for the group's timeout while rank 0's process lived),
    naming nothing of the cause. Now every rank stops at once, rank 1 naming rank 0's failure."""
    from launch_helpers import run_torchrun

    out = tmp_path / "out.jsonl"
    killed = _child(_FEATURES_KILLER, str(minilm_2_layers), str(out), json.dumps(texts), json.dumps(_FEATURES))
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    script = tmp_path / "rerun.py"
    script.write_text(textwrap.dedent(_RESUME_UNDER_TORCHRUN), encoding="utf-8")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(sys.path)}
    done = run_torchrun([str(script), str(minilm_2_layers), str(out), json.dumps(texts), json.dumps(_FEATURES)], env,
                        240)
    assert done.returncode != 0
    assert "--resume" in done.stderr and "taking out.jsonl on rank 0 failed on rank(s) [0]" in done.stderr, \
        done.stderr[-6000:]
    assert "timed out" not in done.stderr.lower() and "Timeout" not in done.stderr, done.stderr[-6000:]


def test_a_resume_after_a_sentence_transformers_module_changed_is_refused_naming_its_file(minilm_2_layers, texts,
                                                                                           tmp_path, monkeypatch,
                                                                                           small_chunks, capsys):
    """A sentence-transformers directory's modules are files in folders of their own (1_Pooling/config.json,
    2_Dense/model.safetensors): the model a resume had to share was its top-level files only, so a run cut short with
    mean pooling resumed with CLS pooling, its first rows one model's embeddings and the rest another's, without a
    word. The modules' files are the model's too now: such a resume is refused naming the file."""
    from sentence_helpers import st_directory

    model = st_directory(minilm_2_layers, tmp_path / "st", max_seq_length=32)
    inputs = tmp_path / "in.txt"
    inputs.write_text("\n".join(texts) + "\n", encoding="utf-8")
    out = tmp_path / "out.jsonl"
    _predict_cut_short(monkeypatch, 1, "sentence-embedding", model, inputs, out)
    pooling = model / "1_Pooling" / "config.json"
    pooling.write_text(pooling.read_text().replace('"pooling_mode_cls_token": false', '"pooling_mode_cls_token": true')
                       .replace('"pooling_mode_mean_tokens": true', '"pooling_mode_mean_tokens": false'))
    capsys.readouterr()
    assert _predict("sentence-embedding", model, inputs, out, "--resume") == 2
    assert "cut short with another model (1_Pooling/config.json (" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == [".out.jsonl.bertkit-partial", ".out.jsonl.bertkit-partial.json",
                                                          "in.txt", "st"]
