"""--resume of a fine-tuning run whose training file changed since the kill: refused, naming what changed, not
continued under the new file's label ids (a renamed class swaps them, and the checkpoint's head carried on under
the other names)."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import FILM_WORDS

TEXTS = [
    "a good film",
    "a bad film",
    "fine films",
    "dull films",
    "a fine film",
    "a dull film",
    "good films",
    "bad films",
]


def _files(root: Path, labels: list[str]) -> None:
    rows = "".join(f"{t},{label}\n" for t, label in zip(TEXTS, labels * 4))
    (root / "train.csv").write_text("text,label\n" + rows)
    (root / "dev.csv").write_text("text,label\n" + rows)


def _interrupted_run(root: Path, tiny_checkpoint, monkeypatch) -> dict:
    """A classify run stopped (Ctrl-C) right after its first checkpoint; its settings, for --resume."""
    import bertkit.training.loop as loop
    from bertkit.training import classify

    tiny_checkpoint(root / "model", tokenizer=FILM_WORDS, num_attention_heads=2)
    _files(root, ["pos", "neg"])
    settings = dict(
        model_name_or_path=root / "model",
        output_dir=root / "out",
        train_file=root / "train.csv",
        validation_file=root / "dev.csv",
        max_steps=4,
        save_steps=1,
        batch_size=4,
        progress=False,
        learning_rate=(1e-3,),
        device="cpu",
        max_seq_length=16,
    )
    save = loop.save_checkpoint

    def save_then_stop(*args, **kwargs):
        save(*args, **kwargs)
        raise KeyboardInterrupt

    from bertkit.settings import ClassifySettings

    with monkeypatch.context() as m:
        m.setattr(loop, "save_checkpoint", save_then_stop)
        with pytest.raises(KeyboardInterrupt):
            classify.finetune_classify(ClassifySettings(**settings))
    assert [p.name for p in (root / "out").rglob("step-*")] == ["step-00000001"]
    return settings


# Edits a user makes to the training file between the kill and --resume, each to a fresh copy of the interrupted run:
# the label column's classes (renamed with or without a change of order, one added, cased otherwise) or its rows.
EDITS = {
    "unchanged": lambda labels: labels,
    "renamed, same order": lambda labels: ["negative" if x == "neg" else "positive" for x in labels],
    "renamed, order swapped": lambda labels: ["z" if x == "neg" else "a" for x in labels],
    "a class added": lambda labels: labels[:-1] + ["mixed"],
    "cased": lambda labels: [x.upper() for x in labels],
    "one row's label flipped": lambda labels: ["pos" if labels[0] == "neg" else "neg", *labels[1:]],
}


def test_resume_is_refused_exactly_when_the_training_labels_changed(tmp_path, tiny_checkpoint, monkeypatch, caplog):
    """Each edit resumes a fresh copy of one interrupted run: unchanged files continue its checkpoint to the end; a
    class renamed with its order swapped (pos -> "a", neg -> "z": the old pos rows are id 0 now) is refused naming
    both lists of labels, and every other edit naming what changed."""
    import shutil

    from bertkit.errors import BertkitError
    from bertkit.settings import ClassifySettings
    from bertkit.training import classify

    settings = _interrupted_run(tmp_path, tiny_checkpoint, monkeypatch)
    shutil.copytree(tmp_path / "out", tmp_path / "interrupted")
    labels = [line.rsplit(",", 1)[1] for line in (tmp_path / "train.csv").read_text().splitlines()[1:]]
    for name, edit in EDITS.items():
        shutil.rmtree(tmp_path / "out")
        shutil.copytree(tmp_path / "interrupted", tmp_path / "out")
        rows = "text,label\n" + "".join(f"{t},{x}\n" for t, x in zip(TEXTS * 4, edit(labels)))
        for split in ("train", "dev"):  # dev too: its labels must be the training file's classes
            (tmp_path / f"{split}.csv").write_text(rows)
        run = ClassifySettings(**settings, resume=True)
        if name == "unchanged":
            with caplog.at_level("INFO", logger="bertkit"):
                assert classify.finetune_classify(run)["runs"][0]["steps"] == 4, name
            assert "step-00000001 (step 1 of 4)" in caplog.text
        else:
            changed = (r"'labels': \(\['neg', 'pos'\], \['a', 'z'\]\).*'train_data'" if name == "renamed, order swapped"
                       else "'(labels|train_data)'")
            with pytest.raises(BertkitError, match=f"cannot resume from .*{changed}"):
                classify.finetune_classify(run)
