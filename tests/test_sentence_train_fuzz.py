"""Randomized differential test of SentenceTransformerTrainer against sentence-transformers 6 over several steps and
epochs, through each trainer's own data path: each seed draws a training script (the batch sampler, one dataset or a
dict of two with a loss each and the multi-dataset sampler, MultipleNegativesRankingLoss, its cached form,
MatryoshkaLoss around it or CoSENTLoss, rows not divisible by the batch, dataloader_drop_last, seed and data_seed,
gradient accumulation, max_steps or epochs, warmup and the schedule, prompts, an evaluator and an eval_dataset with
eval_steps, load_best_model_at_end) and runs it with each library on MiniLM's first 2 layers, dropout off, SQuAD and
STS-B rows. Every step sees the same rows and the same loss (1e-4 relative), log_history holds the same records
(losses 1e-4 relative, learning rates exactly), the same best checkpoint, and the trained model the same vectors
(1e-4: Adam turns float rounding of small gradients into steps of up to the learning rate).

Slow: ``BERTKIT_FUZZ_SENTENCE_TRAIN`` seeds, 2 by default (about 20 s a seed on a 2-core machine)."""

from __future__ import annotations

import json
import os
import random
import re

import numpy as np
import pytest
import torch

from sentence_helpers import glue_rows, st_directory

st = pytest.importorskip("sentence_transformers", reason="the reference: pip install -e '.[test-references]'")
datasets = pytest.importorskip("datasets")
pytestmark = pytest.mark.slow

SEEDS = int(os.environ.get("BERTKIT_FUZZ_SENTENCE_TRAIN", "2"))
TIMING = re.compile(r"runtime|per_second|total_flos")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, minilm_2_layers):
    return st_directory(minilm_2_layers, tmp_path_factory.mktemp("st") / "m", dropout=0.0, max_seq_length=32)


@pytest.fixture(scope="module")
def rows(data_dir):
    """(question, the sentence holding its answer) pairs, each sentence once (two rows with one positive make a loss
    whose gradient is float rounding alone), and STS-B pairs scored in [0, 1]."""
    pairs, seen = [], set()
    for article in json.loads((data_dir / "squad" / "dev-v1.1.json").read_text())["data"][:6]:
        for p in article["paragraphs"]:
            for q in p["qas"]:
                at = q["answers"][0]["answer_start"]
                hit = next((m for m in re.finditer(r"[^.!?]+[.!?]+", p["context"]) if m.start() <= at < m.end()), None)
                if hit and hit[0].strip() not in seen:
                    seen.add(hit[0].strip())
                    pairs.append((q["question"], hit[0].strip()))
    scored = [(r[7], r[8], float(r[9]) / 5) for r in glue_rows(data_dir, "STS-B", n=80)]
    return pairs, scored


def _draw(r: random.Random) -> dict:
    multi = r.random() < 0.35
    names = ["pairs", "scored"] if multi else [r.choice(["pairs", "scored"])]
    losses = {n: r.choice(["mnrl", "cached", "matryoshka"]) if n == "pairs" else "cosent" for n in names}
    args = {"per_device_train_batch_size": r.choice([2, 3, 4, 5]), "seed": r.choice([0, 7, 42]),
            "learning_rate": r.choice([5e-5, 1e-4]), "logging_steps": r.choice([1, 2]),
            "lr_scheduler_type": r.choice(["linear", "cosine", "constant_with_warmup"]),
            "batch_sampler": r.choice(["batch_sampler", "no_duplicates"])}
    if r.random() < 0.3:
        args["data_seed"] = r.choice([3, 11])
    if r.random() < 0.3:
        args["gradient_accumulation_steps"] = r.choice([2, 3])
    if r.random() < 0.5:
        args["max_steps"] = r.randint(3, 8)
    else:
        args["num_train_epochs"] = r.choice([1, 2, 1.5])
    if r.random() < 0.5:
        args["warmup_ratio"] = r.choice([0.1, 0.3])
    if r.random() < 0.3:
        args["prompts"] = r.choice(["query: ", {"anchor": "q: "} if "pairs" in names else {"s1": "a: "}])
    evaluates = r.random() < 0.6
    if not evaluates and args["batch_sampler"] == "batch_sampler" and r.random() < 0.4:
        args["dataloader_drop_last"] = True
    draw = {"losses": losses, "rows": {n: r.randint(6, 15) for n in names}, "starts": {n: r.randint(0, 40) for n in names},
            "multi": multi, "evaluator": False, "eval_dataset": False, "args": args}
    if multi:
        args["multi_dataset_batch_sampler"] = r.choice(["proportional", "round_robin"])
    if evaluates:
        draw["evaluator"] = r.random() < 0.7
        draw["eval_dataset"] = not draw["evaluator"] or r.random() < 0.5
        args.update(eval_strategy="steps", eval_steps=r.choice([1, 2, 3]), per_device_eval_batch_size=r.choice([2, 4]))
        if r.random() < 0.5 and (draw["evaluator"] or not multi):  # a dict's eval_loss is eval_{name}_loss
            args.update(load_best_model_at_end=True, save_strategy="steps", save_steps=args["eval_steps"])
            if draw["evaluator"] and (not draw["eval_dataset"] or multi or r.random() < 0.5):
                args["metric_for_best_model"] = "sts_spearman_cosine"
    args.setdefault("save_strategy", "no")
    return draw


def _run(lib: str, draw: dict, model_dir, rows, out) -> dict:
    if lib == "st":
        from sentence_transformers.sentence_transformer import evaluation as E
        from sentence_transformers.sentence_transformer import losses as L
        S = st
    else:
        import bertkit.sentence as S
        from bertkit.sentence import evaluation as E
        from bertkit.sentence import losses as L
    model = S.SentenceTransformer(str(model_dir), device="cpu")
    steps = []

    def loss_of(name: str, kind: str):
        loss = {"mnrl": lambda: L.MultipleNegativesRankingLoss(model), "cosent": lambda: L.CoSENTLoss(model),
                "cached": lambda: L.CachedMultipleNegativesRankingLoss(model, mini_batch_size=2),
                "matryoshka": lambda: L.MatryoshkaLoss(model, L.MultipleNegativesRankingLoss(model), [384, 64])}[kind]()

        def seen(module, args, value):  # each training step's dataset, rows (their token ids) and loss
            if torch.is_grad_enabled():
                ids = [[x[m.bool()].tolist() for x, m in zip(f["input_ids"], f["attention_mask"])] for f in args[0]]
                steps.append((name, ids, value.item()))
        loss.register_forward_hook(seen)
        return loss

    pairs, scored = rows

    def dataset(name: str, start: int, n: int):
        if name == "pairs":
            return datasets.Dataset.from_list([{"anchor": q, "positive": p} for q, p in pairs[start:start + n]])
        return datasets.Dataset.from_list([{"s1": a, "s2": b, "score": s} for a, b, s in scored[start:start + n]])

    names = list(draw["losses"])
    train = {n: dataset(n, draw["starts"][n], draw["rows"][n]) for n in names}
    dev = {n: dataset(n, 60, 6) for n in names}
    loss = {n: loss_of(n, draw["losses"][n]) for n in names}
    if not draw["multi"]:
        train, dev, loss = train[names[0]], dev[names[0]], loss[names[0]]
    sts = scored[64:76]
    evaluator = E.EmbeddingSimilarityEvaluator(*map(list, zip(*sts)), name="sts") if draw["evaluator"] else None
    args = S.SentenceTransformerTrainingArguments(output_dir=str(out), report_to="none", use_cpu=True, disable_tqdm=True,
                                                  **draw["args"])
    trainer = S.SentenceTransformerTrainer(model=model, args=args, train_dataset=train, loss=loss, evaluator=evaluator,
                                           eval_dataset=dev if draw["eval_dataset"] else None)
    trainer.train()
    best = trainer.state.best_model_checkpoint
    return {"steps": steps, "log": [{k: v for k, v in r.items() if not TIMING.search(k)} for r in trainer.state.log_history],
            "best": best and os.path.basename(best), "vectors": model.encode([p for _, p in pairs[80:86]])}


@pytest.mark.parametrize("seed", range(SEEDS))
def test_a_drawn_training_script_trains_as_sentence_transformers(seed, model_dir, rows, tmp_path):
    draw = _draw(random.Random(seed))
    want, got = (_run(lib, draw, model_dir, rows, tmp_path / lib) for lib in ("st", "bk"))
    where = json.dumps(draw)
    assert [s[:2] for s in got["steps"]] == [s[:2] for s in want["steps"]] and got["steps"], where
    np.testing.assert_allclose([s[2] for s in got["steps"]], [s[2] for s in want["steps"]], rtol=1e-4, atol=1e-6,
                               err_msg=where)
    # the last step is always logged (docs/coming-from-transformers.md): a record sentence-transformers writes only
    # when logging_steps divides the step
    logged = {r["step"] for r in want["log"] if "loss" in r}
    records = [r for r in got["log"] if "loss" not in r or r["step"] in logged]
    assert [sorted(r) for r in records] == [sorted(r) for r in want["log"]], where
    for ours, theirs in zip(records, want["log"]):
        for k, v in theirs.items():
            if k == "learning_rate":
                assert ours[k] == v, where
            elif isinstance(v, float):
                assert ours[k] == pytest.approx(v, rel=1e-4, abs=1e-5), (k, where)
    assert got["best"] == want["best"], where
    np.testing.assert_allclose(got["vectors"], want["vectors"], atol=1e-4, err_msg=where)
