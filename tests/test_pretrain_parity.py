"""`bertkit pretrain` against its references, step for step: transformers' BertForPreTraining on the same weights and
batches, trained as docs/command-line.md says bertkit trains (torch's AdamW, transformers' linear schedule with
warm-up, google-research/bert's betas, epsilon, weight decay and its exclusion of biases and LayerNorm parameters,
the gradient norm clipped to 1.0), its loss the masked-LM mean over the step's predicted positions plus the
next-sentence mean (google's ``run_pretraining.py``)."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F
import transformers
from safetensors.torch import load_file

import bertkit.heads as H
from bertkit.cli import main
from bertkit.config import BertConfig
from bertkit.data.dataset import PretrainingDataset
from bertkit.training.batch_plan import BatchPlan
from bertkit.training.pretrain import collate_instances

STEPS, BATCH, LR, WARMUP = 4, 8, 1e-3, 0.3


pytestmark = pytest.mark.slow  # 3 to 9 s each: a 4-step pretrain run and transformers' model trained beside it


# accumulation 2: the masked-LM mean is over the step's predicted positions, both micro-batches'
@pytest.mark.parametrize("accumulation", [1, 2])
def test_pretrain_trains_transformers_model_as_adamw_and_the_linear_schedule_do(tiny_pretraining_data, tmp_path,
                                                                               accumulation):
    data, vocab = tiny_pretraining_data / "data", tiny_pretraining_data / "vocab"
    shape = dict(vocab_size=len((vocab / "vocab.txt").read_text().splitlines()), hidden_size=32, num_hidden_layers=2,
                 num_attention_heads=4, intermediate_size=37, max_position_embeddings=64, hidden_dropout_prob=0.0,
                 attention_probs_dropout_prob=0.0)
    (tmp_path / "config.json").write_text(json.dumps(shape))
    out = tmp_path / "run"
    assert main(["pretrain", "--data", str(data), "--vocab", str(vocab), "--output-dir", str(out), "--max-steps",
                 str(STEPS), "--batch-size", str(BATCH), "--gradient-accumulation-steps", str(accumulation),
                 "--config-name", str(tmp_path / "config.json"), "--lr", str(LR), "--warmup-ratio", str(WARMUP),
                 "--logging-steps", "1", "--no-progress"]) == 0

    torch.manual_seed(42)  # pretrain's default seed draws the initial weights
    start = H.BertForPreTraining(BertConfig(**shape)).state_dict()
    hf = transformers.BertForPreTraining(transformers.BertConfig(**shape))
    hf.load_state_dict(start, strict=True)
    hf.train()
    plan = BatchPlan(PretrainingDataset(data), BATCH // accumulation, lambda items: collate_instances(items, 0),
                     seed=42)
    undecayed = [p for n, p in hf.named_parameters() if "bias" in n or "LayerNorm" in n]  # google's exclusions
    decayed = [p for n, p in hf.named_parameters() if not ("bias" in n or "LayerNorm" in n)]
    optimizer = torch.optim.AdamW([{"params": decayed, "weight_decay": 0.01}, {"params": undecayed, "weight_decay": 0}],
                                  lr=LR, betas=(0.9, 0.999), eps=1e-6)
    schedule = transformers.get_linear_schedule_with_warmup(optimizer, math.ceil(WARMUP * STEPS), STEPS)
    losses, rates = [], []
    for step in range(STEPS):
        micro = [plan.load(0, plan.global_batches(0)[step * accumulation + k]) for k in range(accumulation)]
        predicted = sum(int((b["labels"] != -100).sum()) for b in micro)
        total = 0.0
        for batch in micro:
            out_hf = hf(**batch)
            mlm = F.cross_entropy(out_hf.prediction_logits.flatten(0, 1), batch["labels"].flatten(), reduction="sum")
            loss = mlm / predicted + F.cross_entropy(out_hf.seq_relationship_logits,
                                                     batch["next_sentence_label"]) / accumulation
            loss.backward()
            total += loss.item()
        torch.nn.utils.clip_grad_norm_(hf.parameters(), 1.0)
        rates.append(schedule.get_last_lr()[0])
        optimizer.step()
        schedule.step()
        optimizer.zero_grad()
        losses.append(total)

    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r["split"] == "train"]
    assert [r["lr"] for r in train] == rates  # to the bit
    torch.testing.assert_close(torch.tensor([r["loss"] for r in train]), torch.tensor(losses), atol=1e-5, rtol=0)
    ours = load_file(str(out / "final" / "model.safetensors"))
    theirs = hf.state_dict()
    assert max(float((ours[k] - theirs[k]).abs().max()) for k in ours) < 1e-6
    # the run moved the weights, and by more than the tolerance
    assert float((ours["bert.embeddings.word_embeddings.weight"] - start["bert.embeddings.word_embeddings.weight"])
                 .abs().max()) > 1e-3
