"""What a resume carries over from the run it continues, and what a user changed in between. A seeded masking
collator goes on drawing its masks where the interrupted run was, not from its seed again. A model that trains other parameters (requires_grad set on
other tensors) is refused by name before a step is trained: torch hands AdamW's moments out by position, so a model
freezing another layer of the same shapes would take that layer's moments without a word (transformers' Trainer
loads them so). An older checkpoint the user pruned (its optimizer.pt deleted to free the disk, the model kept) is
theirs as it is: not taken for a removal a kill cut short and removed."""

from __future__ import annotations

from pathlib import Path

import pytest

import bertkit
from bertkit.errors import BertkitError
from trainer_helpers import TRAIN, KillAt, Killed, _losses, tiny_classifier


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, minilm_2_layers) -> Path:
    return tiny_classifier(tmp_path_factory.mktemp("trainable") / "tiny-classifier", minilm_2_layers)


def _trainer(checkpoint: Path, out: Path, frozen_layer: int | None = None, collator=None, callbacks=(),
             **overrides) -> bertkit.Trainer:
    tokenizer = bertkit.AutoTokenizer.from_pretrained(checkpoint)
    model = (bertkit.AutoModelForMaskedLM if collator else bertkit.AutoModelForSequenceClassification
             ).from_pretrained(checkpoint)
    for name, param in model.named_parameters():
        param.requires_grad_(f"encoder.layer.{frozen_layer}." not in name)
    rows = [dict(tokenizer(r["text"]), **({} if collator else {"label": r["label"]})) for r in TRAIN[:8]]
    args = bertkit.TrainingArguments(output_dir=str(out), learning_rate=1e-3, per_device_train_batch_size=4,
                                     **{"max_steps": 1, "report_to": "none", "use_cpu": True, "disable_tqdm": True,
                                        "seed": 3, **overrides})
    return bertkit.Trainer(model=model, args=args, train_dataset=rows, processing_class=tokenizer,
                           data_collator=collator and collator(tokenizer), callbacks=list(callbacks))


def test_a_resume_freezing_other_tensors_of_the_same_shapes_is_refused_naming_them(checkpoint, tmp_path):
    out = tmp_path / "run"
    _trainer(checkpoint, out, frozen_layer=0).train()
    before = {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.name != ".bertkit-lock"}  # (taken, let go)
    # the same group sizes (each layer's tensors are alike): only the names tell the moments apart
    with pytest.raises(BertkitError, match=r"the checkpoint's trains \['bert\.encoder\.layer\.1\..*, \.\.\. \(16 in all\)"
                                           r"\], which this run's does not, and this run's trains \['bert\.encoder\."
                                           r"layer\.0\..*freeze the parameters that run froze"):
        _trainer(checkpoint, out, frozen_layer=1).train(resume_from_checkpoint=str(out / "checkpoint-1"))
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.name != ".bertkit-lock"} == before  # all kept
    resumed = _trainer(checkpoint, out, frozen_layer=0)
    assert resumed.train(resume_from_checkpoint=str(out / "checkpoint-1")).global_step == 1


def test_a_checkpoint_the_user_pruned_is_kept_by_a_resume(checkpoint, tmp_path):
    out = tmp_path / "run"
    _trainer(checkpoint, out, max_steps=3, save_steps=1).train()  # save_total_limit None: every checkpoint kept
    (out / "checkpoint-1" / "optimizer.pt").unlink()  # the model kept, the moments (twice its size) not
    kept = sorted(p.name for p in (out / "checkpoint-1").iterdir())
    assert _trainer(checkpoint, out, max_steps=3, save_steps=1).train(resume_from_checkpoint=True).global_step == 3
    assert sorted(p.name for p in (out / "checkpoint-1").iterdir()) == kept  # was: the whole directory removed
    assert "model.safetensors" in kept


@pytest.fixture(scope="module")
def masked_lm(tmp_path_factory, minilm_2_layers) -> Path:
    return tiny_classifier(tmp_path_factory.mktemp("trainable") / "tiny-mlm", minilm_2_layers, head="BertForMaskedLM")


def test_a_seeded_masking_collator_resumes_its_masks_where_the_run_was(masked_lm, tmp_path):
    def collator(tokenizer):
        return bertkit.DataCollatorForLanguageModeling(tokenizer, seed=7)

    settings = {"max_steps": 2, "save_steps": 1, "logging_steps": 1}
    whole = _trainer(masked_lm, tmp_path / "whole", collator=collator, **settings)
    whole.train()
    with pytest.raises(Killed):  # killed at step 2's end, before its checkpoint: resumed from checkpoint-1
        _trainer(masked_lm, tmp_path / "cut", collator=collator, callbacks=[KillAt(2)], **settings).train()
    resumed = _trainer(masked_lm, tmp_path / "cut", collator=collator, **settings)
    resumed.train(resume_from_checkpoint=True)
    # was: the resumed collator drew from seed 7 again, other masks from step 2 on (loss 9.155843 for 9.155526)
    assert _losses(resumed.state.log_history) == _losses(whole.state.log_history)
    assert len({loss for _, loss, _ in _losses(whole.state.log_history)}) == 2
