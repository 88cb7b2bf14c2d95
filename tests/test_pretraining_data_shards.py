"""create-pretraining-data split over processes or machines (--num-shards K --shard-index i), then joined
(merge-pretraining-data): the joined directory is byte for byte what one run over the whole corpus writes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bertkit.errors import BertkitError

UNIT = 40_000  # bytes per unit of work: the demo corpus makes several units, so a split has work to share


@pytest.fixture(scope="module")
def corpus(tiny_pretraining_data):
    """Python's own documentation (train.txt, heldout.txt) and a 1,500-entry vocabulary (conftest.py; read-only)."""
    root = tiny_pretraining_data
    return root, sorted((root / "corpus").glob("*.txt"))


def _bytes(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(d.iterdir()) if not p.name.startswith(".bertkit")}


def test_parts_joined_equal_one_run_whatever_the_split(corpus, tmp_path):
    from bertkit.data.pretraining import create_pretraining_data, merge_pretraining_data
    from bertkit.data.text import plan_work_units
    from bertkit.tokenization import BertTokenizer

    root, files = corpus
    tok = BertTokenizer.from_pretrained(root / "vocab")
    units = len(plan_work_units(files, unit_bytes=UNIT))
    assert units >= 4
    kwargs = dict(max_seq_length=64, dupe_factor=1, unit_bytes=UNIT, seed=5, num_workers=0, progress=False)
    whole = create_pretraining_data(files, tok, tmp_path / "whole", **kwargs)
    reference = _bytes(tmp_path / "whole")
    assert len(whole["shards"]) == units
    for k in (2, 3, units + 1):  # more parts than units: some parts are empty, and that is fine
        parts = [tmp_path / f"k{k}" / f"part{i}" for i in range(k)]
        for i, part in reversed(list(enumerate(parts))):  # any order
            create_pretraining_data(files, tok, part, num_shards=k, shard_index=i, **kwargs)
            assert not (part / "manifest.json").exists() and (part / "part.json").is_file()
        merged = merge_pretraining_data(parts[::-1], tmp_path / f"k{k}" / "joined")
        assert _bytes(tmp_path / f"k{k}" / "joined") == reference, k
        assert merged["counts"] == whole["counts"]
    with pytest.raises(BertkitError, match=r"missing \[1\]"):
        merge_pretraining_data([tmp_path / "k3" / "part0", tmp_path / "k3" / "part2"], tmp_path / "bad")
    with pytest.raises(BertkitError, match="other config"):
        create_pretraining_data(files, tok, tmp_path / "seed9", num_shards=2, shard_index=1, **{**kwargs, "seed": 9})
        merge_pretraining_data([tmp_path / "k2" / "part0", tmp_path / "seed9"], tmp_path / "bad2")


def test_the_commands_split_and_join(corpus, tmp_path, capsys, monkeypatch):
    from bertkit.cli import main

    root, files = corpus
    common = [*map(str, files), "--vocab", str(root / "vocab"), "--max-seq-length", "64", "--dupe-factor", "1",
              "--unit-bytes", str(UNIT), "--workers", "1", "--no-progress"]
    assert main(["create-pretraining-data", *common, "--output-dir", str(tmp_path / "whole")]) == 0
    for i in range(2):
        assert main(["create-pretraining-data", *common, "--output-dir", str(tmp_path / f"p{i}"), "--num-shards", "2",
                     "--shard-index", str(i)]) == 0
    capsys.readouterr()
    assert main(["merge-pretraining-data", str(tmp_path / "p1"), str(tmp_path / "p0"),
                 "--output-dir", str(tmp_path / "joined")]) == 0
    assert json.loads(capsys.readouterr().out)["shards"] >= 4
    assert _bytes(tmp_path / "joined") == _bytes(tmp_path / "whole")
    # half a pair of flags is an error naming both
    assert main(["create-pretraining-data", *common, "--output-dir", str(tmp_path / "x"), "--num-shards", "2"]) == 2
    assert "--num-shards and --shard-index go together" in capsys.readouterr().err
    # under torchrun (its environment), each process makes its part beside the output directory
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert main(["create-pretraining-data", *common, "--output-dir", str(tmp_path / "tr")]) == 0
    assert (tmp_path / "tr.part-00001-of-00002" / "part.json").is_file()
    assert _bytes(tmp_path / "tr.part-00001-of-00002") == _bytes(tmp_path / "p1")
