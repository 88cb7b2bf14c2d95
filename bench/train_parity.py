"""Training parity with dropout off: bertkit and transformers fine-tuned step by step on the same batches.

With dropout disabled nothing random is left, so the two implementations must follow the same trajectory:
the same per-step losses and the same weights after training, up to float rounding. This separates
implementation differences from the dropout-draw noise that ``bench_glue.py`` comparisons contain.

    python bench/train_parity.py --task cola --steps 40

Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import torch
import transformers

from bertkit import BertForSequenceClassification, BertTokenizer
from bertkit.data.collate import collate
from bertkit.tasks import glue
from bertkit.training.batch_plan import BatchPlan
from bertkit.training.optim import build_optimizer, linear_warmup_decay, warmup_steps_for

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--task", default="cola")
    p.add_argument("--model", type=Path, default=REPO / "models" / "minilm")
    p.add_argument("--data-dir", type=Path, default=REPO.parent / "shared" / "data" / "glue")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--threads", type=int, default=None)
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    task = glue.get_task(args.task)
    tok = BertTokenizer.from_pretrained(args.model)
    features = glue.featurize(glue.read_glue(task, args.data_dir, "train")[: 32 * args.steps], tok, 128, task)
    torch.manual_seed(args.seed)
    ours = BertForSequenceClassification.from_pretrained(
        args.model, num_labels=task.num_labels, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
        problem_type="regression" if task.is_regression else "single_label_classification")
    with tempfile.TemporaryDirectory() as init_dir:
        ours.save_pretrained(init_dir)
        theirs = transformers.BertForSequenceClassification.from_pretrained(init_dir)
    plan = BatchPlan(features, 32, lambda b: collate(b, tok.pad_token_id), shuffle=True, seed=args.seed)
    losses = {}
    for name, model in (("bertkit", ours), ("transformers", theirs)):
        opt = build_optimizer(model, "adamw", args.lr, 0.01)
        sched = linear_warmup_decay(opt, warmup_steps_for(args.steps, 0.1), args.steps)
        model.train()
        losses[name] = []
        for idx in list(plan.batches(0))[: args.steps]:
            loss = model(**plan.load(0, idx)).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
            losses[name].append(loss.item())
    theirs_state = theirs.state_dict()
    ours_state = ours.published_state_dict()
    missing = sorted(set(ours_state) - set(theirs_state))
    if missing:
        raise SystemExit(f"published names transformers does not have: {missing}")
    weight_diff = max(float((v - theirs_state[k]).abs().max()) for k, v in ours_state.items())
    print(json.dumps({
        "bench": "train_parity_no_dropout", "task": task.name, "model": str(args.model), "steps": len(losses["bertkit"]),
        "lr": args.lr, "max_abs_loss_diff": max(abs(a - b) for a, b in zip(losses["bertkit"], losses["transformers"])),
        "max_abs_weight_diff_after": weight_diff, "first_losses": losses["bertkit"][:3],
        "last_loss": {k: v[-1] for k, v in losses.items()},
    }))


if __name__ == "__main__":
    main()
