"""Read-only and unwritable places: a model read from a read-only mount, outputs written to one, and PyTorch's
Inductor cache directory (made by any optimizer) that cannot be made.

Asserted: loading and inference from a read-only directory give the numbers of a writable copy and write nothing
beside it; a write that cannot happen is refused with the path and the cause in one line (a read-only mount is
named as such, not as a permission to change), leaving what was there intact; training stops before any work
when the Inductor cache cannot be made. Mounting needs root: those tests are skipped without it.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import logging
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from bertkit.cli import main
from bertkit.errors import BertkitError

WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "good", "bad", "film", "dull", "fine", "##s", "the"]
TRAIN = "text,label\n" + "a good film,pos\ndull,neg\nfine films,pos\nbad,neg\n" * 2


def snapshot(path: Path) -> dict[str, str] | None:
    if not path.exists():
        return None
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    return {str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


def _cli(*argv) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main([str(a) for a in argv])
    return code, err.getvalue().strip()


def _cli_process(*argv) -> None:
    """``bertkit argv`` in a process of its own: bertkit holds its output's lock open until the process exits, and a
    file system with a file open for writing cannot be remounted read-only."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(__file__).parents[1] / "src"),
                                                       os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-m", "bertkit", *map(str, argv)], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr


def _mount(*args: str) -> bool:
    return os.geteuid() == 0 and subprocess.run(["mount", *args], capture_output=True).returncode == 0


@contextlib.contextmanager
def read_only_view(source: Path, at: Path):
    """``source`` (a directory or a file) seen read-only at ``at`` (a read-only bind mount; root only, else the test
    is skipped)."""
    at.mkdir() if source.is_dir() else at.touch()
    if not _mount("--bind", str(source), str(at)):
        pytest.skip("a read-only bind mount needs root")
    try:
        if not _mount("-o", "remount,bind,ro", str(at)):
            pytest.skip("remounting a bind mount read-only failed here")
        yield at
    finally:
        subprocess.run(["umount", "-l", str(at)], check=True)


@contextlib.contextmanager
def tmpfs(at: Path):
    at.mkdir()
    if not _mount("-t", "tmpfs", "-o", "size=16m", "tmpfs", str(at)):
        pytest.skip("mounting a tmpfs needs root")
    try:
        yield at
    finally:
        subprocess.run(["umount", "-l", str(at)], check=True)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory, tiny_checkpoint):
    root = tmp_path_factory.mktemp("ro-models")
    (root / "train.csv").write_text(TRAIN, encoding="utf-8")
    (root / "texts.txt").write_text("a good film\nthe film is dull\nfine films ||| a bad film\n", encoding="utf-8")
    tiny_checkpoint(root / "base", tokenizer=WORDS)
    tiny_checkpoint(root / "clf", "BertForSequenceClassification", tokenizer=WORDS, labels=["neg", "pos"])
    return root


# -- PyTorch's Inductor cache -------------------------------------------------------------------------------------


def _unmakeable(tmp_path: Path, how: str) -> Path:
    """A TORCHINDUCTOR_CACHE_DIR that cannot be made: below a regular file, or on a read-only mount."""
    if how == "under a file":
        (tmp_path / "file").write_text("not a directory")
        return tmp_path / "file" / "inductor"
    ro = tmp_path / "ro"
    ro.mkdir()
    if not (_mount("-t", "tmpfs", "-o", "size=1m", "tmpfs", str(ro)) and _mount("-o", "remount,ro", str(ro))):
        pytest.skip("a read-only tmpfs needs root")
    return ro / "inductor"


@pytest.mark.parametrize("how", ["under a file", "read-only mount"])
def test_an_inductor_cache_that_cannot_be_made_stops_training_before_any_work(checkpoints, tmp_path, monkeypatch,
                                                                             how):
    """Was: with TORCHINDUCTOR_CACHE_DIR on a read-only file system, `bertkit finetune` (no --torch-compile) loaded
    the model and data, then failed where torch.optim.AdamW imports torch._dynamo, which makes that directory:
    "error: Read-only file system: /…/inductor", not saying whose directory it is or what to set (in a process
    that had imported torch._dynamo before, the same run went on). Now refused before any work, naming the
    variable, the path and the fix; nothing is written."""
    cache = _unmakeable(tmp_path, how)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(cache))
    out = tmp_path / "run"
    try:
        code, err = _cli("finetune", "classify", "--model", checkpoints / "base", "--train-file",
                         checkpoints / "train.csv", "--validation-file", checkpoints / "train.csv", "--epochs", "1",
                         "--batch-size", "4", "--no-progress", "--device", "cpu", "--output-dir", out)
        assert code == 2 and "Traceback" not in err and len(err.splitlines()) == 1, err
        assert f"PyTorch's Inductor cache directory {cache} (TORCHINDUCTOR_CACHE_DIR) cannot be created" in err
        assert "set TORCHINDUCTOR_CACHE_DIR to a directory you can write to" in err
        assert ("Read-only file system" if how == "read-only mount" else "Not a directory") in err
        assert "initialised fresh" not in err  # no model was built
        assert sorted(p.name for p in tmp_path.iterdir()) == ["file" if how == "under a file" else "ro"]

        from bertkit import BertModel
        from bertkit.training.optim import build_optimizer

        with pytest.raises(BertkitError, match="TORCHINDUCTOR_CACHE_DIR"):
            build_optimizer(BertModel.from_pretrained(checkpoints / "base"), 1e-4)
        with pytest.raises(BertkitError, match=r"cannot be written: .*writes compiled kernels there"):
            BertModel.from_pretrained(checkpoints / "base").compile_layers()  # lazy: failed at the first forward
    finally:
        if how == "read-only mount":
            subprocess.run(["umount", "-l", str(tmp_path / "ro")], check=True)


@pytest.mark.slow  # a process of its own (4 s); make test keeps test_int8.py::test_a_failed_compile_quantizes_eagerly_and_says_so_once
def test_int8_quantizes_eagerly_when_its_compile_cannot_make_the_inductor_cache(tmp_path):
    """Was: `bertkit serve --int8` compiles the activations' quantization at warm-up, and torch.compile itself
    (importing torch._dynamo) makes the Inductor cache directory: with TORCHINDUCTOR_CACHE_DIR read-only the
    server exited "error: Read-only file system: …/inductor", though a compile that fails is meant to fall back to
    the eager function (same codes, a warning). torch.compile was called outside that guard; now inside. In a
    process of its own: torch._dynamo, once imported, never makes the directory again."""
    (tmp_path / "file").write_text("not a directory")
    script = (
        "import torch\n"
        "from bertkit.quantization.kernels import _Compiled, quantize_per_token\n"
        "c = _Compiled(quantize_per_token)\n"
        "c.compile_next()\n"
        "x, inv = torch.randn(512, 1024, generator=torch.Generator().manual_seed(0)), torch.full((1024,), 0.5)\n"
        "got, want = c(x, inv, 255), quantize_per_token(x, inv, 255)\n"
        "print('eager', c.failed, all(torch.equal(a, b) for a, b in zip(got, want)))\n")
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "file" / "inductor"), OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([str(Path(__file__).parents[1] / "src"), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "eager True True", done.stderr[-2000:]
    assert "int8: compiling the activations' quantization failed (NotADirectoryError" in done.stderr, done.stderr


# -- A read-only Hugging Face cache, online ----------------------------------------------------------------------


def test_a_read_only_hub_cache_is_read_online_as_offline(checkpoints, tmp_path, monkeypatch, caplog):
    """Was: a snapshot transformers had cached (config, weights, tokenizer; no modules.json, no record of its
    absence), in a read-only cache, online: bertkit fetched modules.json first, huggingface_hub failed making its
    lock there, and from_pretrained("org/mini") raised "downloading it failed: [Errno 30] Read-only file system"
    where transformers, and bertkit offline, load the snapshot. Now it loads what the cache holds, with a warning
    naming the cache's error. (huggingface_hub's download is a stand-in failing as it does on a read-only cache.)"""
    import errno

    pytest.importorskip("huggingface_hub")
    from huggingface_hub import constants

    import bertkit
    import bertkit.hub

    snapshot = tmp_path / "hub" / "models--org--mini" / "snapshots" / ("a" * 40)
    shutil.copytree(checkpoints / "base", snapshot)
    (snapshot.parent.parent / "refs").mkdir()
    (snapshot.parent.parent / "refs" / "main").write_text("a" * 40)
    lock = tmp_path / "hub" / ".locks" / "models--org--mini" / "x.lock"

    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(lock))

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(bertkit.hub, "_hub_reachable", lambda endpoint: True)
    monkeypatch.setattr("huggingface_hub.hf_hub_download", read_only)
    monkeypatch.setattr("huggingface_hub.snapshot_download", lambda repo_id, allow_patterns, local_files_only=False:
                        str(snapshot) if local_files_only else read_only())
    ids = torch.tensor([[2, 5, 6, 8, 3]])
    with torch.no_grad():
        got = bertkit.BertModel.from_pretrained("org/mini")(ids).last_hidden_state
        want = bertkit.BertModel.from_pretrained(checkpoints / "base")(ids).last_hidden_state
    assert torch.equal(got, want)
    assert bertkit.AutoTokenizer.from_pretrained("org/mini")("a good film")["input_ids"] == [2, 5, 6, 8, 3]
    said = [r.getMessage() for r in caplog.records if "cannot be written" in r.getMessage()]
    assert said and f"Read-only file system: {lock}" in said[0] and str(snapshot) in said[0], said
    monkeypatch.setattr("huggingface_hub.hf_hub_download", lambda *a, **k: (_ for _ in ()).throw(
        OSError(errno.EIO, "Input/output error", str(lock))))  # another failure is still the download's error
    with pytest.raises(bertkit.errors.MissingFileError, match="downloading it failed: .*Input/output error"):
        bertkit.BertModel.from_pretrained("org/mini")


@pytest.mark.parametrize("switch", ["HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"])
def test_an_offline_switch_is_named_when_a_hub_id_is_not_cached(tmp_path, monkeypatch, switch):
    """Was: with HF_HUB_OFFLINE=1 (or TRANSFORMERS_OFFLINE=1, which huggingface_hub reads as the same switch) and a
    Hub id not cached, the error said "the Hub (https://huggingface.co) is not reachable from here", of a Hub that
    was never asked. Now it names the switch that is set, how to lift it, and the cache that was read; no
    connection is tried."""
    pytest.importorskip("huggingface_hub")
    from huggingface_hub import constants

    import bertkit
    import bertkit.hub

    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(switch, "1")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)  # as huggingface_hub reads either variable at import
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(bertkit.hub, "_hub_reachable", lambda endpoint: pytest.fail("offline: no connection"))
    for load in (bertkit.BertModel.from_pretrained, bertkit.AutoTokenizer.from_pretrained):
        with pytest.raises(bertkit.errors.MissingFileError) as e:
            load("org/not-cached")
        said = str(e.value)
        assert f"{switch}=1 is set (huggingface_hub's offline mode: unset it to download)" in said, said
        assert f"not in the local cache ({tmp_path / 'hub'})" in said and "not reachable" not in said, said


# -- Outputs on a read-only file system -----------------------------------------------------------------------------


def test_an_output_on_a_read_only_mount_is_named_so_and_kept(checkpoints, tmp_path):
    """Was: `bertkit quantize --overwrite` (and finetune, save_pretrained) onto a file system remounted read-only
    said "cannot write OUT: Permission denied", sending the user to chmod a directory no one could write; a
    read-only mount inside the output said so too. Now "Read-only file system", and the earlier output stays."""
    with tmpfs(tmp_path / "fs") as fs:
        out = fs / "q"
        _cli_process("quantize", "--model", checkpoints / "clf", "--output-dir", out)
        before = snapshot(out)
        assert _mount("-o", "remount,ro", str(fs))
        try:
            code, err = _cli("quantize", "--model", checkpoints / "clf", "--output-dir", out, "--overwrite")
        finally:
            assert _mount("-o", "remount,rw", str(fs))
        assert code == 2 and len(err.splitlines()) == 1, err
        assert f"cannot write {out}: Read-only file system; choose a directory you can write to" in err, err
        assert "Permission denied" not in err and snapshot(out) == before
        with read_only_view(checkpoints / "base", out / "mine") as inside:
            code, err = _cli("quantize", "--model", checkpoints / "clf", "--output-dir", out, "--overwrite")
            assert code == 2 and f"({inside} in it is read-only, and a write replaces the whole directory)" in err
            assert "Read-only file system" in err and "Permission denied" not in err, err


def test_a_bind_mount_from_the_same_file_system_is_a_mount_point_as_any(checkpoints, tmp_path):
    """Was: a bind mount from the same file system (same device: os.path.ismount says False) as a command's output
    was missed by the mount-point refusal: `bertkit quantize --output-dir MOUNT` quantized, then failed
    "Device or resource busy: /…/.MOUNT.bertkit-staging" (a file mounted over, as `predict --output-file`, the same
    after predicting, naming a temporary file), and save_pretrained into it failed so. Now the command is refused
    before any work, naming the mount point, and a save writes into it file by file, as into any mount point."""
    from bertkit import BertModel

    (tmp_path / "there").mkdir()
    (tmp_path / "there.jsonl").write_text("mine\n")
    out = tmp_path / "out"
    out.mkdir()
    if not _mount("--bind", str(tmp_path / "there"), str(out)):
        pytest.skip("a bind mount needs root")
    try:
        code, err = _cli("quantize", "--model", checkpoints / "clf", "--output-dir", out)
        assert code == 2 and f"{out} is a mount point: bertkit writes a directory beside its name" in err, err
        assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "there", "there.jsonl"]
        BertModel.from_pretrained(checkpoints / "base").save_pretrained(out)
        assert sorted(p.name for p in (tmp_path / "there").iterdir()) == ["config.json", "model.safetensors"]
    finally:
        subprocess.run(["umount", "-l", str(out)], check=True)
    with read_only_view(tmp_path / "there.jsonl", tmp_path / "out.jsonl") as mounted:
        code, err = _cli("predict", "text-classification", "--model", checkpoints / "clf", "--input",
                         checkpoints / "texts.txt", "--output-file", mounted, "--no-progress", "--overwrite")
        assert code == 2 and f"{mounted} is a mount point: bertkit writes the file beside it" in err, err
        assert mounted.read_text() == "mine\n"


def test_a_mount_inside_a_directory_stays_where_it_is_mounted(checkpoints, tmp_path, caplog):
    """Was: a save into a directory holding a mount point (a volume mounted at ``out/data``) swapped the whole
    directory, and the mount went with the directory it replaced: to ``out.replaced-XXXX/out/data``, out of the
    user's tree, with a warning that named its files as names the new save uses; ``out/data`` was left an empty
    directory. Now such a save writes into the directory file by file, as into a mount point, and a command's output
    directory holding one is refused before any work, naming it."""
    from bertkit import BertModel

    out, volume = tmp_path / "out", tmp_path / "volume"
    (out / "data").mkdir(parents=True)
    volume.mkdir()
    (volume / "corpus.txt").write_text("the volume's file")
    (out / "notes.txt").write_text("mine")
    if not _mount("--bind", str(volume), str(out / "data")):
        pytest.skip("a bind mount needs root")
    try:
        with caplog.at_level(logging.WARNING, logger="bertkit"):
            BertModel.from_pretrained(checkpoints / "base").save_pretrained(out)
        assert sorted(p.name for p in out.iterdir()) == ["config.json", "data", "model.safetensors", "notes.txt"]
        assert (out / "data" / "corpus.txt").read_text() == "the volume's file" and "replaced" not in caplog.text
        assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "volume"]
        (out / "config.json").unlink()
        (out / "model.safetensors").unlink()
        (out / "notes.txt").unlink()
        code, err = _cli("quantize", "--model", checkpoints / "clf", "--output-dir", out)
        assert code == 2 and f"{out} holds the mount point {out / 'data'}: bertkit writes a directory" in err, err
        assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "volume"]
        assert [p.name for p in out.iterdir()] == ["data"] and (out / "data" / "corpus.txt").is_file()
    finally:
        subprocess.run(["umount", "-l", str(out / "data")], check=True)


# -- The generator: random entry points and places, read-only against writable ---------------------------------


def _loads(root: Path, rng: random.Random) -> list[tuple[str, object]]:
    """Each draw: (a name, what loading from ``root`` computes), over the entry points that read a model."""
    import bertkit
    from bertkit.sentence import CrossEncoder, SentenceTransformer

    texts = [" ".join(rng.choice(WORDS[5:]) for _ in range(rng.randint(1, 9))) for _ in range(rng.randint(1, 5))]
    pairs = [(t, rng.choice(texts)) for t in texts]

    def hidden(cls, name):
        tok, model = bertkit.AutoTokenizer.from_pretrained(root / name), cls.from_pretrained(root / name).eval()
        batch = tok(texts, padding=True, return_tensors="pt")
        with torch.no_grad():
            out = model(**batch)
        kept = batch["attention_mask"][..., None]
        return (out.last_hidden_state * kept) if hasattr(out, "last_hidden_state") else out.logits

    draws = {
        "BertModel": lambda: hidden(bertkit.BertModel, "base"),
        "AutoModel": lambda: hidden(bertkit.AutoModel, "base"),
        "classifier": lambda: hidden(bertkit.AutoModelForSequenceClassification, "clf"),
        "tokenizer": lambda: bertkit.BertTokenizerFast.from_pretrained(root / "base")(texts, padding=True)["input_ids"],
        "SentenceTransformer": lambda: SentenceTransformer(str(root / "base")).encode(texts),
        "CrossEncoder": lambda: CrossEncoder(str(root / "clf")).predict(pairs),
        "pipeline": lambda: [r["score"] for r in bertkit.pipeline("text-classification", model=str(root / "clf"))(
            texts)],
    }
    chosen = rng.sample(sorted(draws), k=4)
    return [(name, draws[name]()) for name in chosen]


@pytest.mark.slow
def test_read_only_places_generator(checkpoints, tmp_path):
    """Seeded draws: models loaded through random entry points from a read-only mount give the numbers of the
    same files loaded writable, write nothing there; commands writing into a read-only file system are refused
    naming the path and "Read-only file system", the earlier output intact."""
    rng = random.Random(20261130)
    copy = tmp_path / "copy"
    shutil.copytree(checkpoints, copy)
    before = snapshot(copy)
    with read_only_view(checkpoints, tmp_path / "ro") as ro:
        for _ in range(3):
            seed = rng.randrange(1 << 30)
            got, want = _loads(ro, random.Random(seed)), _loads(copy, random.Random(seed))
            for (name, a), (_, b) in zip(got, want, strict=True):
                np.testing.assert_array_equal(np.asarray(a, dtype=float), np.asarray(b, dtype=float), err_msg=name)
        assert snapshot(copy) == before
        with tmpfs(tmp_path / "fs") as fs:
            commands = {
                "predict": lambda o, *x: ["predict", "text-classification", "--model", ro / "clf", "--input",
                                          ro / "texts.txt", "--output-file", o, "--no-progress", *x],
                "extract-features": lambda o, *x: ["extract-features", "--model", ro / "base", "--input",
                                                   ro / "texts.txt", "--output-file", f"{o}.jsonl", "--layers", "-1",
                                                   "--no-progress", *x],
                "quantize": lambda o, *x: ["quantize", "--model", ro / "clf", "--output-dir", o, *x],
                "finetune": lambda o, *x: ["finetune", "classify", "--model", ro / "base", "--train-file",
                                           ro / "train.csv", "--validation-file", ro / "train.csv", "--epochs", "1",
                                           "--batch-size", "4", "--no-progress", "--device", "cpu", "--output-dir",
                                           o, *x],
            }
            for name in rng.sample(sorted(commands), k=3):
                out = fs / name
                _cli_process(*commands[name](out))
                written = out if out.exists() else Path(f"{out}.jsonl")
                kept = snapshot(written)
                assert _mount("-o", "remount,ro", str(fs))
                try:
                    code, err = _cli(*commands[name](out, "--overwrite"))
                finally:
                    assert _mount("-o", "remount,rw", str(fs))
                assert code == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, (name, err)
                assert f"{written}" in err and "Read-only file system" in err, (name, err)
                assert snapshot(written) == kept, name
        assert snapshot(copy) == before
