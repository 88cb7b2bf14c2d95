"""A bertkit.sentence training script with in-batch negatives gathered across processes, run by
tests/test_sentence_gather.py once as one process (batch 32) and once under torchrun as two (16 each):
MultipleNegativesRankingLoss(gather_across_devices=True) on 65 SQuAD (question, paragraph, other paragraph) rows,
one epoch: global batches of 32, 32 and 1 (the last leaves rank 1 without a share: it runs a stand-in row).
Rank 0 writes the log history to RESULT (torch.save).

    python tests/sentence_torchrun_script.py MODEL SQUAD_JSON OUT RESULT 32
    python -m torch.distributed.run --standalone --nproc_per_node 2 tests/sentence_torchrun_script.py MODEL SQUAD_JSON OUT RESULT 16
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from bertkit.sentence import (
    SentenceTransformer,
    SentenceTransformerTrainer,
    SentenceTransformerTrainingArguments,
    losses,
)


def main(model_dir: str, squad: str, out: str, result: str, per_device: int) -> None:
    articles = json.loads(Path(squad).read_text())["data"]
    paragraphs = [p for a in articles[:3] for p in a["paragraphs"]]
    rows = [{"question": p["qas"][0]["question"], "paragraph": p["context"], "negative": paragraphs[i + 1]["context"]}
            for i, p in enumerate(paragraphs[:65])]
    model = SentenceTransformer(model_dir)
    model.max_seq_length = 48
    args = SentenceTransformerTrainingArguments(output_dir=out, per_device_train_batch_size=per_device,
                                                num_train_epochs=1, learning_rate=1e-4, logging_steps=1,
                                                save_strategy="no", seed=1, use_cpu=True, disable_tqdm=True)
    trainer = SentenceTransformerTrainer(model=model, args=args, train_dataset=rows,
                                         loss=losses.MultipleNegativesRankingLoss(model, gather_across_devices=True))
    trainer.train()
    if trainer.state.is_world_process_zero:
        torch.save({"log_history": trainer.state.log_history}, result)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]))
