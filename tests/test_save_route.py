"""save_pretrained to a path through a directory that does not exist before a ``..`` (``missing/../out``): as
transformers (os.makedirs) it makes that directory, so the same path loads back what was written; bertkit wrote
``out`` as if the path were text and from_pretrained("missing/../out") then said the directory does not exist.
A path through a file is refused naming it (transformers: NotADirectoryError)."""

from __future__ import annotations

import os

import pytest
import torch

from bertkit import BertConfig
from bertkit.errors import BertkitError
from bertkit.heads import BertForMaskedLM

transformers = pytest.importorskip("transformers")
TINY = dict(vocab_size=30, hidden_size=8, num_hidden_layers=1, num_attention_heads=2, intermediate_size=8)


def _tree(root) -> list[str]:
    return sorted(os.path.relpath(os.path.join(r, n), root) for r, dirs, files in os.walk(root) for n in dirs + files)


@pytest.mark.parametrize("path", ["missing/../out", "a/b/../../c", "missing/..", "./m2/../out/", "x/./y"])
def test_a_save_through_a_missing_directory_makes_what_transformers_makes_and_loads_back(path, tmp_path, monkeypatch):
    trees = {}
    for lib in ("transformers", "bertkit"):
        (tmp_path / lib).mkdir()
        monkeypatch.chdir(tmp_path / lib)
        torch.manual_seed(0)
        model = (transformers.BertForMaskedLM(transformers.BertConfig(**TINY)) if lib == "transformers"
                 else BertForMaskedLM(BertConfig(**TINY)))
        model.save_pretrained(path)
        trees[lib] = _tree(tmp_path / lib)
        if lib == "bertkit":
            loaded = BertForMaskedLM.from_pretrained(path)  # the same path
            for name, value in model.state_dict().items():
                assert torch.equal(loaded.state_dict()[name], value), name
    assert trees["bertkit"] == trees["transformers"]


def test_a_save_through_a_file_is_refused_naming_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(BertkitError, match=r"notes.txt/../out cannot be made: it goes through .*notes.txt, which is "
                                           r"a file, not a directory"):
        BertForMaskedLM(BertConfig(**TINY)).save_pretrained("notes.txt/../out")
    assert _tree(tmp_path) == ["notes.txt"]


def test_a_save_through_a_symlink_goes_where_the_system_resolves_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs" / "7").mkdir(parents=True)
    (tmp_path / "last").symlink_to("runs/7")
    BertForMaskedLM(BertConfig(**TINY)).save_pretrained("last/../out")  # the parent of runs/7
    assert (tmp_path / "runs" / "out" / "config.json").is_file() and not (tmp_path / "out").exists()
