"""A bertkit.Trainer script as a user writes one, run by tests/test_trainer.py once as one process and once
under torchrun with two: train (evaluating and checkpointing every 3 steps), evaluate, predict, save_model.
Rank 0 writes what it saw to RESULT (torch.save).

    python tests/trainer_torchrun_script.py OUT RESULT PER_DEVICE_BATCH
    python -m torch.distributed.run --standalone --nproc_per_node 2 tests/trainer_torchrun_script.py OUT RESULT 8
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import torch

from bertkit import (
    BertConfig,
    BertForSequenceClassification,
    DataCollatorWithPadding,
    Trainer,
    TrainingArguments,
)
from bertkit.tokenization import BertTokenizer


def rows(n: int, seed: int) -> list[dict]:
    """Sentences of 6..30 tokens of a 97-token vocabulary, labelled by a rule the model can learn a little of."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        length = int(torch.randint(6, 31, (), generator=g))
        ids = torch.randint(5, 97, (length,), generator=g).tolist()
        out.append({"input_ids": ids, "token_type_ids": [0] * length, "attention_mask": [1] * length,
                    "labels": int(sum(ids[:3])) % 2})
    return out


def main(out: str, result: str, per_device: int) -> None:
    vocab = Path(out).parent / f"{Path(out).name}-vocab.txt"
    # every rank writes the same file: each writes its own copy and renames it into place, so no rank reads another's
    # half-written file (it read an empty vocabulary about one run in three)
    mine = vocab.with_name(f"{vocab.name}.{os.getpid()}")
    mine.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(92)]) + "\n")
    os.replace(mine, vocab)
    tokenizer = BertTokenizer(str(vocab))
    torch.manual_seed(0)
    model = BertForSequenceClassification(BertConfig(
        vocab_size=97, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
        max_position_embeddings=64, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, num_labels=2))

    def accuracy(p):
        return {"accuracy": float((np.argmax(p.predictions, -1) == p.label_ids).mean())}

    args = TrainingArguments(output_dir=out, per_device_train_batch_size=per_device, per_device_eval_batch_size=5,
                             max_steps=9, learning_rate=1e-3, eval_strategy="steps", eval_steps=3,
                             save_strategy="steps", save_steps=3, logging_steps=1, load_best_model_at_end=True,
                             metric_for_best_model="accuracy", seed=1, disable_tqdm=True, use_cpu=True)
    trainer = Trainer(model=model, args=args, train_dataset=rows(96, 1), eval_dataset=rows(37, 2),
                      data_collator=DataCollatorWithPadding(tokenizer), processing_class=tokenizer,
                      compute_metrics=accuracy)
    train = trainer.train()
    metrics = trainer.evaluate()
    predicted = trainer.predict(rows(23, 3))
    trainer.save_model(f"{out}/final")
    if trainer.state.is_world_process_zero:
        torch.save({"training_loss": train.training_loss, "log_history": trainer.state.log_history,
                    "best": trainer.state.best_model_checkpoint, "eval": metrics,
                    "predictions": predicted.predictions, "label_ids": predicted.label_ids,
                    "weights": {k: v.clone() for k, v in model.state_dict().items()}}, result)


def slow_last_checkpoint_worker(rank: int, world: int, port: int, out: str, ending: str) -> None:
    """For tests/test_trainer.py (spawned, as torchrun would start it, with torchrun's job id): 2 steps whose one
    checkpoint, the last, rank 0 is slow to finish (as a large model's is). ``ending`` "best": it is the best that
    load_best_model_at_end loads (rank 0 slow to write it); "save": without it, every rank then saves the model into
    output_dir, as transformers' scripts do after ``trainer.train()``, unguarded (rank 0 slow to let go of
    output_dir)."""
    import time

    from bertkit.training import loop

    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port), TORCHELASTIC_RUN_ID=f"job-{port}")
    torch.set_num_threads(1)
    if rank == 0 and ending == "best":
        save = loop.save_checkpoint

        def slow_save(*args, **kwargs):
            time.sleep(1.0)
            return save(*args, **kwargs)

        loop.save_checkpoint = slow_save
    vocab = Path(out).parent / "vocab.txt"
    torch.manual_seed(0)
    model = BertForSequenceClassification(BertConfig(
        vocab_size=97, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
        max_position_embeddings=64, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, num_labels=2))
    best = ending == "best"
    args = TrainingArguments(output_dir=out, per_device_train_batch_size=4, max_steps=2, learning_rate=1e-3,
                             eval_strategy="steps" if best else "no", eval_steps=2, save_strategy="steps",
                             save_steps=2, load_best_model_at_end=best, seed=1, disable_tqdm=True, use_cpu=True)
    trainer = Trainer(model=model, args=args, train_dataset=rows(16, 1), eval_dataset=rows(8, 2),
                      data_collator=DataCollatorWithPadding(BertTokenizer(str(vocab))))
    if rank == 0 and not best:  # after the loop's last collective, before rank 0 lets go of output_dir
        from bertkit.runs import OutputDir

        release = OutputDir.release

        def slow_release(self, *args, **kwargs):
            time.sleep(1.0)
            return release(self, *args, **kwargs)

        OutputDir.release = slow_release
    trainer.train()
    if best:
        assert Path(trainer.state.best_model_checkpoint).name == "checkpoint-2"
    else:
        model.save_pretrained(out)


def seeding_worker(rank: int, world: int, port: int, out: str, result: str) -> None:
    """For tests/test_trainer.py (spawned, as torchrun would start it): a Trainer with dropout on, made, then a draw of
    the script's, then one step; what torch's and Python's generators would draw next is written to ``result``-RANK
    when the Trainer is made and where on_train_begin is called."""
    import random

    from bertkit import TrainerCallback

    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port), TORCHELASTIC_RUN_ID=f"job-{port}")
    torch.set_num_threads(1)

    def next_draws() -> tuple[list[float], float]:  # torch's and Python's next draws, the generators left as they are
        generator = torch.Generator()
        generator.set_state(torch.get_rng_state())
        python = random.Random()
        python.setstate(random.getstate())
        return torch.rand(4, generator=generator).tolist(), python.random()

    class Seen(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            seen["train_begin"] = next_draws()

    seen = {}
    torch.manual_seed(0)
    model = BertForSequenceClassification(BertConfig(
        vocab_size=97, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
        max_position_embeddings=64, num_labels=2))
    args = TrainingArguments(output_dir=out, per_device_train_batch_size=4, max_steps=1, save_strategy="no", seed=1,
                             disable_tqdm=True, use_cpu=True)
    vocab = Path(out).parent / "vocab.txt"
    trainer = Trainer(model=model, args=args, train_dataset=rows(8, 1), callbacks=[Seen()],
                      data_collator=DataCollatorWithPadding(BertTokenizer(str(vocab))))
    seen["made"] = next_draws()
    torch.rand(2)
    random.random()
    trainer.train()
    torch.save(seen, f"{result}-{rank}")

if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
