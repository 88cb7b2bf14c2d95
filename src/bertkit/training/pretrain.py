"""Pre-training BERT from scratch: masked LM + next-sentence prediction on prepared instances.

The instances come from ``bertkit create-pretraining-data`` (``bertkit.data.pretraining``). The recipe
is the paper's (section 3.1, appendix A.2): Adam(W) at lr 1e-4 with betas 0.9/0.999 and weight decay
0.01, linear warm-up then linear decay, and optionally two phases: 90% of the steps on 128-token
instances, the rest on 512-token ones ("to speed up pretraing ... the rest 10% of the steps of sequence
of 512 to learn the positional embeddings").
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from bertkit.config import BertConfig
from bertkit.data.pretraining import PretrainingDataset, collate_pretraining
from bertkit.errors import BertkitError
from bertkit.heads import IGNORE_INDEX, BertForPreTraining
from bertkit.tokenization import BertTokenizer
from bertkit.training.loop import BatchPlan, Phase, TrainArgs, TrainResult, train
from bertkit.training.plot import plot_metrics

logger = logging.getLogger("bertkit")


@dataclass
class PretrainSettings:
    data_dir: Path  # phase 1 instances (e.g. 128 tokens)
    tokenizer_dir: Path  # vocab.txt + tokenizer_config.json used to make the instances
    config: BertConfig
    max_steps: int
    batch_size: int = 32
    phase2_data_dir: Path | None = None  # e.g. 512-token instances for the last (1 - phase1_fraction) of steps
    phase1_fraction: float = 0.9
    eval_data_dir: Path | None = None  # held-out instances (e.g. from WikiText-2 valid)
    eval_every: int | None = None
    eval_instances: int = 2000
    eval_batch_size: int = 64
    dynamic_masking_seed: int | None = None  # passed to PretrainingDataset for instances stored unmasked


def mlm_nsp_batch_metrics(batch: dict, out: Any) -> dict[str, float]:
    """MLM accuracy over the predicted positions and NSP accuracy, for one batch."""
    metrics: dict[str, float] = {}
    if out.mlm_loss is not None:
        target = batch["labels"][batch["labels"] != IGNORE_INDEX]
        metrics["mlm_loss"] = out.mlm_loss.item()
        metrics["mlm_acc"] = (out.prediction_logits.argmax(-1) == target).float().mean().item() if target.numel() else 0.0
    if out.nsp_loss is not None:
        metrics["nsp_loss"] = out.nsp_loss.item()
        metrics["nsp_acc"] = (out.seq_relationship_logits.argmax(-1) == batch["next_sentence_label"]).float().mean().item()
    return metrics


def evaluate_pretraining(model: BertForPreTraining, dataset, *, batch_size: int, pad_id: int, limit: int,
                         device: str = "cpu") -> dict[str, float]:
    """Held-out MLM loss/accuracy (per predicted token) and NSP loss/accuracy (per instance)."""
    n = min(limit, len(dataset))
    mlm_correct = mlm_total = nsp_correct = 0
    mlm_loss_sum = nsp_loss_sum = 0.0
    for start in range(0, n, batch_size):
        batch = collate_pretraining([dataset[i] for i in range(start, min(n, start + batch_size))], pad_id)
        batch = {k: v.to(device) for k, v in batch.items()}
        out = model(**batch)
        target = batch["labels"][batch["labels"] != IGNORE_INDEX]
        mlm_correct += int((out.prediction_logits.argmax(-1) == target).sum())
        mlm_total += target.numel()
        mlm_loss_sum += out.mlm_loss.item() * target.numel()
        rows = batch["input_ids"].shape[0]
        nsp_correct += int((out.seq_relationship_logits.argmax(-1) == batch["next_sentence_label"]).sum())
        nsp_loss_sum += out.nsp_loss.item() * rows
    return {"mlm_loss": mlm_loss_sum / max(1, mlm_total), "mlm_acc": mlm_correct / max(1, mlm_total),
            "nsp_loss": nsp_loss_sum / max(1, n), "nsp_acc": nsp_correct / max(1, n), "instances": n}


def pretrain(s: PretrainSettings, args: TrainArgs, *, resume: bool = False) -> TrainResult:
    """Pre-train ``BertForPreTraining(s.config)`` from scratch; the final model goes to ``out_dir/final``.

    Metrics (train and held-out) stream to ``out_dir/metrics.jsonl`` and are drawn to ``metrics.png``.
    """
    tokenizer = BertTokenizer.from_pretrained(s.tokenizer_dir)
    if len(tokenizer.vocab) != s.config.vocab_size:
        raise BertkitError(
            f"the vocabulary in {s.tokenizer_dir} has {len(tokenizer.vocab)} entries but the model config has "
            f"vocab_size {s.config.vocab_size}; set vocab_size={len(tokenizer.vocab)}"
        )
    pad = tokenizer.pad_token_id
    phases = []
    for i, data_dir in enumerate(d for d in (s.data_dir, s.phase2_data_dir) if d is not None):
        dataset = PretrainingDataset(data_dir, seed=s.dynamic_masking_seed)
        if dataset.max_seq_length > s.config.max_position_embeddings:
            raise BertkitError(
                f"{data_dir} holds instances of {dataset.max_seq_length} tokens but max_position_embeddings is "
                f"{s.config.max_position_embeddings}; recreate the data or enlarge the config"
            )
        phases.append(Phase(BatchPlan(dataset, s.batch_size, lambda b: collate_pretraining(b, pad), seed=args.seed),
                            0, name=f"phase{i + 1}-{dataset.max_seq_length}"))
    if len(phases) == 1:
        phases[0].steps = s.max_steps
    else:
        phases[0].steps = max(1, round(s.max_steps * s.phase1_fraction))
        phases[1].steps = s.max_steps - phases[0].steps
        if phases[1].steps < 1:
            raise BertkitError(f"max_steps {s.max_steps} with phase1_fraction {s.phase1_fraction} leaves phase 2 empty")

    evaluate = None
    if s.eval_data_dir is not None:
        eval_set = PretrainingDataset(s.eval_data_dir, seed=None)

        def evaluate(model):
            return evaluate_pretraining(model, eval_set, batch_size=s.eval_batch_size, pad_id=pad,
                                        limit=s.eval_instances, device=args.device)

    torch.manual_seed(args.seed)  # the initial weights are part of the run: same seed, same model
    model = BertForPreTraining(s.config)
    fingerprint = {"model_config": s.config.to_dict(), "max_steps": s.max_steps, "batch_size": s.batch_size,
                   "data": [str(Path(p.plan.dataset.path).resolve()) for p in phases]}
    result = train(model, phases, args, evaluate=evaluate, batch_metrics=mlm_nsp_batch_metrics,
                   fingerprint=fingerprint, resume=resume)
    final = args.out_dir / "final"
    model.save_pretrained(final)
    tokenizer.save_pretrained(final)
    (args.out_dir / "summary.json").write_text(json.dumps(
        {"steps": result.step, "last_eval": result.last_eval, "final_model": str(final)}, indent=2))
    plot_metrics(args.out_dir / "metrics.jsonl", args.out_dir / "metrics.png")
    return result


def default_pretrain_args(out_dir: Path, **overrides: Any) -> TrainArgs:
    """The paper's pre-training optimiser settings (appendix A.2), with warm-up as 1% of steps by default
    (the paper's 10,000 of 1,000,000); overrides win."""
    base = dict(out_dir=out_dir, lr=1e-4, warmup=0.01, weight_decay=0.01, betas=(0.9, 0.999), eps=1e-6,
                max_grad_norm=1.0, log_every=10)
    base.update(overrides)
    return TrainArgs(**base)

