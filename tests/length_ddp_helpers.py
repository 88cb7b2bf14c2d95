"""Worker for tests/test_length_grouped.py's torchrun comparison, in processes started by
launch_helpers.spawn_gloo_workers: one library's Trainer (transformers' or bertkit's) trains a tiny classifier with
train_sampling_strategy="group_by_length" on 2 gloo processes, recording the rows of each batch each rank trains on;
rank 0 writes those, the logged losses and the final evaluation to RESULT (torch.save)."""

from __future__ import annotations

import os
from pathlib import Path

import torch
import torch.distributed as dist

PER_DEVICE, ACCUM = 4, 1


def rows(n: int, seed: int) -> list[dict]:
    """Sentences of 3..40 tokens, each made unique by its first two tokens, so a batch's rows can be named."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        length = int(torch.randint(3, 41, (), generator=g))
        ids = [5 + i // 90, 5 + i % 90] + torch.randint(5, 97, (length - 2,), generator=g).tolist()
        out.append({"input_ids": ids, "attention_mask": [1] * length, "labels": int(sum(ids[2:5])) % 2})
    return out


class Recorder:
    """A padding collator that notes the rows of every batch of more than one row (bertkit collates the first row
    alone once, to check the data, before training)."""

    def __init__(self, data: list[dict]):
        self.index = {tuple(r["input_ids"]): i for i, r in enumerate(data)}
        self.batches: list[list[int]] = []

    def __call__(self, features: list[dict]) -> dict:
        if len(features) > 1:
            self.batches.append([self.index[tuple(f["input_ids"])] for f in features])
        width = max(len(f["input_ids"]) for f in features)
        return {"input_ids": torch.tensor([f["input_ids"] + [0] * (width - len(f["input_ids"])) for f in features]),
                "attention_mask": torch.tensor([f["attention_mask"] + [0] * (width - len(f["attention_mask"]))
                                                for f in features]),
                "labels": torch.tensor([f["labels"] for f in features])}


def tiny_model_dir(path: Path) -> Path:
    import transformers

    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=97, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=64, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                                     num_labels=2)
    transformers.BertForSequenceClassification(config).save_pretrained(path)
    return path


def _train(lib, model_dir: str, out: str, resume: str | None = None) -> tuple[Recorder, object]:
    train, evaluation = rows(94, 1), rows(40, 2)  # whole evaluation batches on both ranks
    recorder = Recorder(train + evaluation)
    args = lib.TrainingArguments(output_dir=out, per_device_train_batch_size=PER_DEVICE, per_device_eval_batch_size=5,
                                 gradient_accumulation_steps=ACCUM, num_train_epochs=2, learning_rate=1e-3,
                                 logging_steps=1, save_strategy="steps", save_steps=3, report_to="none", use_cpu=True,
                                 seed=3, disable_tqdm=True, train_sampling_strategy="group_by_length",
                                 # (at its default transformers multiplies a BERT head's loss by the processes)
                                 **({"ddp_backend": "gloo", "average_tokens_across_devices": False}
                                    if lib.__name__ == "transformers" else {}))
    model = lib.AutoModelForSequenceClassification.from_pretrained(model_dir)
    trainer = lib.Trainer(model=model, args=args, train_dataset=train, eval_dataset=evaluation,
                          data_collator=recorder)
    trainer.train(resume_from_checkpoint=resume)
    return recorder, trainer


def worker(rank: int, world: int, port: int, library: str, model_dir: str, out: str, result: str) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), TORCHELASTIC_RUN_ID=f"job-{port}")
    torch.set_num_threads(1)
    if library == "transformers":
        import transformers as lib
    else:
        import bertkit as lib
    recorder, trainer = _train(lib, model_dir, out)
    trained = list(recorder.batches)
    recorder.batches.clear()
    metrics = trainer.evaluate()
    evaluated = sorted(i for b in recorder.batches for i in b)
    resumed = None
    if library == "bertkit":  # the finished run replayed from the middle of its first epoch (12 steps an epoch)
        resumed = _train(lib, model_dir, out, resume=f"{out}/checkpoint-3")[0].batches
    everything = [None] * world
    dist.all_gather_object(everything, {"trained": trained, "evaluated": evaluated, "resumed": resumed})
    if rank == 0:
        losses = [r["loss"] for r in trainer.state.log_history if "loss" in r]
        torch.save({"ranks": everything, "losses": losses, "eval_loss": metrics["eval_loss"]}, result)
    dist.barrier()
