"""What a training run makes of the things a user keeps among its checkpoints: names bertkit never writes,
checkpoints the user made read-only, and damaged ones. Each test is a way an earlier version stopped a run (the
docstring says how); tests/test_checkpoint_lifecycle_fuzz.py draws such output directories against transformers'
Trainer."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from bertkit.errors import BertkitError
from bertkit.outputs import MARKER
from bertkit.sentence.fit import _latest_checkpoint
from bertkit.training.checkpoint import HF_LAYOUT, STEP_LAYOUT, save_checkpoint
from bertkit.training.resume_point import checkpoint_to_resume

NOT_STEPS = ("checkpoint-²", "checkpoint-٦", "checkpoint-１２", "checkpoint-abc", "checkpoint-old-5", "checkpoint-")


@pytest.mark.parametrize("name", NOT_STEPS)
def test_a_directory_named_with_no_ascii_step_is_no_checkpoint(tmp_path, name):
    """Was: the names were read with str.isdigit, which takes superscripts and other scripts' digits: a user's
    ``checkpoint-²`` stopped every save, resume and rotation with "ValueError: invalid literal for int() with base 10:
    '²'", and ``checkpoint-٦`` was read as checkpoint 6. transformers reads ``[0-9]+``; so does bertkit now."""
    (tmp_path / name).mkdir()
    (tmp_path / name / "notes.txt").write_text("mine")
    first = save_checkpoint(tmp_path, {"model": {}}, 2, keep=1, layout=HF_LAYOUT)
    second = save_checkpoint(tmp_path, {"model": {}}, 10, keep=1, layout=HF_LAYOUT)
    assert HF_LAYOUT.dirs(tmp_path) == [second] and not first.exists()
    assert (tmp_path / name / "notes.txt").read_text() == "mine"
    with pytest.raises(BertkitError, match=r"already holds checkpoints \(checkpoint-10\) of an earlier run"):
        checkpoint_to_resume(tmp_path, {}, HF_LAYOUT, False)  # a new run into it: refused naming the newest
    assert _latest_checkpoint(str(tmp_path)) == str(second)  # SentenceTransformer.fit(resume_from_checkpoint=True)


def test_the_commands_layout_reads_ascii_steps_only(tmp_path):
    root = STEP_LAYOUT.root(tmp_path)
    root.mkdir()
    for name in ("step-²", "step-٠٠٠٠٠٠٠٩", "step-00000003", "step-12"):
        (root / name).mkdir()
    assert [p.name for p in STEP_LAYOUT.dirs(tmp_path)] == ["step-00000003", "step-12"]


def test_fit_resumes_from_no_directory_a_name_only_ends_in_digits(tmp_path, caplog):
    """Was: fit took the digits after the last '-' of any checkpoint-* entry: a user's ``checkpoint-old-5`` beside
    checkpoint-2 gave checkpoint-5, a path that does not exist; and a file named checkpoint-9 was taken too."""
    (tmp_path / "checkpoint-old-5").mkdir()
    (tmp_path / "checkpoint-9").write_text("a file")
    (tmp_path / "checkpoint-2").mkdir()
    assert _latest_checkpoint(str(tmp_path)) == str(tmp_path / "checkpoint-2")
    (tmp_path / "checkpoint-2").rmdir()
    with caplog.at_level(logging.WARNING, logger="bertkit"):
        assert _latest_checkpoint(str(tmp_path)) is None
    assert "no checkpoints found" in caplog.text


def _refuse_removal_under(monkeypatch, directory: Path) -> None:
    """The system refusing every removal in ``directory``, as a directory ``chmod a-w`` refuses it to any user but
    root (the tests may run as root, whom the mode does not stop)."""
    unlink = Path.unlink

    def refusing(self, missing_ok=False):
        if Path(os.path.abspath(self)).parent == directory:
            raise PermissionError(13, "Permission denied", str(self))
        return unlink(self, missing_ok)

    monkeypatch.setattr(Path, "unlink", refusing)


@pytest.mark.parametrize("layout", [HF_LAYOUT, STEP_LAYOUT], ids=["trainer", "commands"])
def test_rotation_keeps_a_checkpoint_the_user_made_read_only_and_goes_on(tmp_path, monkeypatch, caplog, layout):
    """Was: rotation stopped the run at its next checkpoint with "PermissionError: [Errno 13] Permission denied:
    '.../checkpoint-1/config.json'" once the user had made checkpoint-1 read-only (chmod a-w, to keep it): the
    training since the last checkpoint lost. transformers' rotation (shutil.rmtree, ignore_errors) leaves it and goes
    on: with save_total_limit 2 a run saving at steps 1 to 5 ends with checkpoint-1, -4 and -5. Now bertkit does the
    same, with a warning naming the directory and the fix; the checkpoint stays whole, its manifest with it."""
    first = save_checkpoint(tmp_path, {"model": {}}, 1, keep=2, layout=layout)
    files = sorted(p.name for p in first.iterdir())
    _refuse_removal_under(monkeypatch, first)
    with caplog.at_level(logging.WARNING, logger="bertkit"):
        for step in (2, 3, 4, 5):
            save_checkpoint(tmp_path, {"model": {}}, step, keep=2, layout=layout)
    assert [p.name for p in layout.dirs(tmp_path)] == [layout.path(tmp_path, s).name for s in (1, 4, 5)]
    assert sorted(p.name for p in first.iterdir()) == files and MARKER in files
    assert f"kept {first}: the system refused the removal of" in caplog.text and "chmod -R u+w" in caplog.text
    monkeypatch.undo()  # made writable again: the next rotation removes it as any checkpoint of the run
    save_checkpoint(tmp_path, {"model": {}}, 6, keep=2, layout=layout)
    assert [p.name for p in layout.dirs(tmp_path)] == [layout.path(tmp_path, s).name for s in (5, 6)]


def _resume_from(tiny_model, out: Path, resume) -> None:
    import bertkit

    model = tiny_model("BertForSequenceClassification", labels=2)
    args = bertkit.TrainingArguments(output_dir=str(out), use_cpu=True, report_to="none", max_steps=1)
    bertkit.Trainer(model=model, args=args, train_dataset=[{"input_ids": [2, 5, 3], "label": 0}] * 4).train(
        resume_from_checkpoint=resume)


@pytest.mark.parametrize(("given", "message"), [
    ("missing", r"resume_from_checkpoint \S+/out/checkpoint-9 does not exist; give a checkpoint-N directory"),
    ("a file", r"resume_from_checkpoint \S+/model.safetensors is a file, not a checkpoint directory; give"),
    ("transformers'", r"\S+/hf/checkpoint-2 has no state.pt: it was written by transformers' Trainer \(optimizer.pt\), "
                      r"whose optimiser, schedule and data position bertkit cannot continue exactly; start a new run "
                      r"from its weights"),
    ("empty", r"resume_from_checkpoint '': give True \(the newest checkpoint in output_dir\), the path of a "
              r"checkpoint-N directory, or None"),
    ("a number", r"resume_from_checkpoint 2: give True"),
])
def test_a_resume_from_checkpoint_that_names_no_checkpoint_says_what_it_names(tiny_model, tmp_path, given, message):
    """Was: a missing path, a file and transformers' checkpoint were each "is not a checkpoint bertkit wrote (it has no
    state.pt)"; "" was named as "." (the working directory, Path('')); a number stopped in pathlib with "TypeError:
    expected str, bytes or os.PathLike object, not int". Each is refused before anything is written."""
    (tmp_path / "hf" / "checkpoint-2").mkdir(parents=True)
    for name in ("trainer_state.json", "optimizer.pt", "model.safetensors"):
        (tmp_path / "hf" / "checkpoint-2" / name).write_text("{}")
    resume = {"missing": tmp_path / "out" / "checkpoint-9", "a file": tmp_path / "hf" / "checkpoint-2" /
              "model.safetensors", "transformers'": str(tmp_path / "hf" / "checkpoint-2"), "empty": "",
              "a number": 2}[given]
    with pytest.raises(BertkitError, match=message):
        _resume_from(tiny_model, tmp_path / "out", resume)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("layout", [HF_LAYOUT, STEP_LAYOUT], ids=["trainer", "commands"])
def test_rotation_keeps_a_checkpoint_whose_manifest_is_damaged_and_goes_on(tmp_path, caplog, layout):
    """Was: rotation stopped the run at its next checkpoint with "checkpoint-1/.bertkit-run.json is not a run
    marker this bertkit wrote", and a resumed run stopped there again at each save: it could never finish. Now the
    checkpoint is kept (it proves nothing, so nothing of it is removed), not counted, and named in a warning."""
    first = save_checkpoint(tmp_path, {"model": {}}, 1, keep=2, layout=layout)
    (first / MARKER).write_text('{"files": ')
    with caplog.at_level(logging.WARNING, logger="bertkit"):
        for step in (2, 3, 4):
            save_checkpoint(tmp_path, {"model": {}}, step, keep=2, layout=layout)
    assert [p.name for p in layout.dirs(tmp_path)] == [layout.path(tmp_path, s).name for s in (1, 3, 4)]
    assert (first / MARKER).read_text() == '{"files": ' and f"kept {first}, not counted among" in caplog.text


@pytest.mark.parametrize(("damaged", "message"), [
    ("optimizer.pt", r"cannot resume from \S+/checkpoint-2: it is damaged, \S+/checkpoint-2/state.pt \(ValueError: "
                     r"\S+/checkpoint-2/optimizer.pt: PytorchStreamReader failed .*; resume from the checkpoint before "
                     r"it by its path \(\S+/out/checkpoint-1, dropping the steps after it\)"),
    ("trainer_state.json", r"\S+/checkpoint-2/trainer_state.json is not valid JSON \(.*\); resume from an earlier "
                           r"checkpoint by its path"),
])
def test_resuming_a_damaged_newest_checkpoint_names_the_file_and_the_one_before(tiny_model, tmp_path, damaged, message):
    """Was: a torn optimizer.pt was "no intact checkpoint to resume from in OUT: .../state.pt (RuntimeError: ...)",
    of a directory holding an intact checkpoint-1 and naming another file; a torn trainer_state.json, a bare
    JSONDecodeError. Nothing is written by the refused resume."""
    import bertkit

    def trainer():
        args = bertkit.TrainingArguments(output_dir=str(tmp_path / "out"), use_cpu=True, report_to="none",
                                         max_steps=2, save_steps=1)
        return bertkit.Trainer(model=tiny_model("BertForSequenceClassification", labels=2), args=args,
                               train_dataset=[{"input_ids": [2, 5, 3], "label": 0}] * 4)

    trainer().train()
    torn = tmp_path / "out" / "checkpoint-2" / damaged
    torn.write_bytes(torn.read_bytes()[:len(torn.read_bytes()) // 2])
    before = {p: p.read_bytes() for p in (tmp_path / "out").rglob("*") if p.is_file() and p.name != ".bertkit-lock"}
    with pytest.raises(BertkitError, match=message):
        trainer().train(resume_from_checkpoint=True)
    assert {p: p.read_bytes() for p in before} == before
