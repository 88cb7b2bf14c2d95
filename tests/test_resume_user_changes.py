"""What a user changed between a run and its resume. A model that trains other parameters (requires_grad set on
other tensors) is refused by name before a step is trained: torch hands AdamW's moments out by position, so a model
freezing another layer of the same shapes would take that layer's moments without a word (transformers' Trainer
loads them so). An older checkpoint the user pruned (its optimizer.pt deleted to free the disk, the model kept) is
theirs as it is: not taken for a removal a kill cut short and removed."""

from __future__ import annotations

from pathlib import Path

import pytest

import bertkit
from bertkit.errors import BertkitError
from trainer_helpers import TRAIN, tiny_classifier


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, minilm_2_layers) -> Path:
    return tiny_classifier(tmp_path_factory.mktemp("trainable") / "tiny-classifier", minilm_2_layers)


def _trainer(checkpoint: Path, out: Path, frozen_layer: int | None = None, **overrides) -> bertkit.Trainer:
    tokenizer = bertkit.AutoTokenizer.from_pretrained(checkpoint)
    model = bertkit.AutoModelForSequenceClassification.from_pretrained(checkpoint)
    for name, param in model.named_parameters():
        param.requires_grad_(f"encoder.layer.{frozen_layer}." not in name)
    rows = [dict(tokenizer(r["text"]), label=r["label"]) for r in TRAIN[:8]]
    args = bertkit.TrainingArguments(output_dir=str(out), learning_rate=1e-3, per_device_train_batch_size=4,
                                     **{"max_steps": 1, "report_to": "none", "use_cpu": True, "disable_tqdm": True,
                                        "seed": 3, **overrides})
    return bertkit.Trainer(model=model, args=args, train_dataset=rows, processing_class=tokenizer)


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
