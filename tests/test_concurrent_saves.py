"""Two saves of one directory at once (two processes calling ``save_pretrained(out)``): the one that swaps its
directory into place disposes of the one it replaced, which lies at the staging name meanwhile, where the other
save, starting, may lock it before finding the name held. Neither leaves anything of bertkit's behind, and the
one that steps back says why (``Held``) or saves, never a bare ``FileNotFoundError``."""

from __future__ import annotations

import os

from bertkit import BertConfig, manifests, staging
from bertkit.dir_lock import LOCK, staging_path
from bertkit.heads import BertForMaskedLM


def _model() -> BertForMaskedLM:
    config = BertConfig(vocab_size=12, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=16, max_position_embeddings=16)
    return BertForMaskedLM(config)


def test_a_lock_another_save_takes_in_the_replaced_directory_leaves_no_replaced_folder(tmp_path, monkeypatch,
                                                                                        caplog):
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine\n")
    model = _model()
    model.save_pretrained(out)
    before = sorted(os.listdir(out))
    real = manifests.remove_empty_dirs
    stage = staging_path(out)
    locked = []

    def other_save_locks_it_first(directory):
        # the other process's Stage.open: mkdir found the staging name taken, so it locks the directory there (the
        # one this save replaced, listed already) and only then finds the name held by this save
        if directory == stage and not locked:
            locked.append(directory)
            (directory / LOCK).write_text("pid 4194304 (bertkit save)")
        real(directory)

    monkeypatch.setattr(manifests, "remove_empty_dirs", other_save_locks_it_first)
    model.save_pretrained(out)

    assert locked == [stage]
    assert sorted(os.listdir(tmp_path)) == ["out"]  # no out.replaced-*, no .out.bertkit-staging
    assert sorted(os.listdir(out)) == before
    assert (out / "notes.txt").read_text() == "mine\n"
    assert "was replaced" not in caplog.text


def test_a_save_whose_staging_name_is_freed_before_it_locks_it_saves(tmp_path, monkeypatch):
    out = tmp_path / "out"
    model = _model()
    model.save_pretrained(out)
    stage = staging_path(out)
    stage.mkdir()  # the directory another save replaced, being disposed of by it: mkdir finds the name taken
    real = staging.dir_lock.lock
    calls = []

    def disposed_meanwhile(directory, command):
        if directory == stage and not calls:
            calls.append(directory)
            os.rmdir(directory)  # the other save has finished disposing of it
        return real(directory, command)

    monkeypatch.setattr(staging.dir_lock, "lock", disposed_meanwhile)
    model.save_pretrained(out)

    assert calls == [stage]
    assert sorted(os.listdir(tmp_path)) == ["out"]
    assert BertForMaskedLM.from_pretrained(out).config.hidden_size == 8
