"""The training loop, optimiser and schedule: numbers on known inputs."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from bertkit import BertConfig, BertForSequenceClassification
from bertkit.data.collate import collate
from bertkit.errors import BertkitError
from bertkit.settings import LR_SCHEDULES, TrainingSettings
from bertkit.settings.training import micro_batch_size
from bertkit.training.batch_plan import BatchPlan
from bertkit.training.loop import Phase, TrainResult, train
from bertkit.training.optim import build_optimizer, linear_warmup_decay, parameter_groups

CFG = BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=24,
                 max_position_embeddings=16, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


def _features(n=24, seed=0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        length = int(torch.randint(3, 12, (1,), generator=g))
        ids = torch.randint(5, 50, (length,), generator=g).tolist()
        out.append({"input_ids": ids, "token_type_ids": [0] * length, "attention_mask": [1] * length,
                    "labels": int(ids[1] > 27)})
    return out


def _collate(batch):
    return collate(batch, 0)


def test_schedule_warmup_then_linear_decay():
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=1.0)
    sched = linear_warmup_decay(opt, warmup_steps=4, total_steps=10)
    lrs = []
    for _ in range(10):
        lrs.append(sched.get_last_lr()[0])
        opt.step()
        sched.step()
    assert lrs == pytest.approx([0.0, 0.25, 0.5, 0.75, 1.0, 5 / 6, 4 / 6, 3 / 6, 2 / 6, 1 / 6])
    ratio, steps = TrainingSettings(output_dir="x", warmup_ratio=0.1), TrainingSettings(output_dir="x", warmup_steps=10)
    assert ratio.warmup_for(1000) == 100 and steps.warmup_for(1000) == 10
    assert TrainingSettings(output_dir="x", warmup_steps=0.05).warmup_for(1000) == 50  # below 1: a share
    with pytest.raises(ValueError, match="warmup_steps"):
        linear_warmup_decay(opt, -1, 10)


@pytest.mark.parametrize("shape", LR_SCHEDULES)
@pytest.mark.parametrize("warmup", [0, 3, 25])
def test_schedule_shapes_match_transformers(shape, warmup):
    """Each --lr-scheduler-type gives transformers' factor at every step (its get_scheduler, same names, at its
    defaults: polynomial's lr_end 1e-7 a rate, inverse_sqrt's timescale the warm-up or 10,000, constant's warm-up
    ignored), a warm-up longer than the run included (it rises the whole run at 1/warmup a step). constant,
    polynomial, cosine_with_restarts and inverse_sqrt were refused by name."""
    transformers = pytest.importorskip("transformers")
    rates = {}
    for impl in ("bertkit", "transformers"):
        p = torch.nn.Parameter(torch.zeros(1))
        opt = torch.optim.SGD([p], lr=5e-5)  # polynomial's end (1e-7) is a rate: the factor depends on the peak
        sched = (linear_warmup_decay(opt, warmup, 17, shape) if impl == "bertkit" else
                 transformers.get_scheduler(shape, opt, num_warmup_steps=warmup, num_training_steps=17))
        rates[impl] = []
        for _ in range(18):  # steps 0..17: past the end transformers' cosine rises again, bertkit's stays at 0
            rates[impl].append(sched.get_last_lr()[0])
            opt.step()
            sched.step()
    assert rates["bertkit"] == rates["transformers"]  # to the last bit
    if shape == "cosine" and warmup == 3:
        assert rates["bertkit"][3] == 5e-5 and rates["bertkit"][10] == pytest.approx(2.5e-5)
    if warmup == 25 and shape != "constant":
        assert rates["bertkit"][16] == pytest.approx(5e-5 * 16 / 25)
    if shape == "polynomial" and warmup < 17:
        assert rates["bertkit"][17] == pytest.approx(1e-7) and rates["bertkit"][0] == (5e-5 if warmup == 0 else 0.0)
    if shape == "constant":
        assert set(rates["bertkit"]) == {5e-5}
    with pytest.raises(ValueError, match="choose one of linear, cosine, cosine_with_restarts, polynomial, constant"):
        linear_warmup_decay(opt, 3, 17, "step")


def test_polynomial_schedule_needs_a_rate_above_its_end():
    """transformers' polynomial decays to the rate 1e-7: a learning rate at or below it is refused, naming both."""
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1e-7)
    with pytest.raises(ValueError, match=r"decays to 1e-07 .* learning_rate above it, got 1e-07"):
        linear_warmup_decay(opt, 0, 10, "polynomial")
    # the warm-up as long as the run: transformers divides by zero after the last step; bertkit ends at 1e-7
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1e-3)
    sched = linear_warmup_decay(opt, 4, 4, "polynomial")
    for _ in range(4):
        opt.step()
        sched.step()
    assert sched.get_last_lr()[0] == pytest.approx(1e-7)


@pytest.mark.parametrize("shape", ["linear", "cosine"])
def test_schedule_equals_transformers_to_the_last_bit_over_a_long_run(shape):
    """examples/pretrain-1h's schedule (22,000 steps, 440 of warm-up): the factor equals transformers' at every step,
    bit for bit (1 - done for linear's (total - step) / (total - warmup) was one bit off at 8,985 of these steps,
    from step 567 on, in the rate a run logs)."""
    transformers = pytest.importorskip("transformers")
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    mine = linear_warmup_decay(opt, 440, 22_000, shape).lr_lambdas[0]
    theirs = transformers.get_scheduler(shape, opt, num_warmup_steps=440, num_training_steps=22_000).lr_lambdas[0]
    differ = [step for step in range(22_001) if mine(step) != theirs(step)]
    assert differ == []
    if shape == "linear":
        assert mine(567) == 21_433 / 21_560 and mine(22_000) == 0.0


def test_weight_decay_groups_exclude_biases_and_layernorm():
    model = BertForSequenceClassification(CFG)
    decay, no_decay = parameter_groups(model, 0.01)
    names = {id(p): n for n, p in model.named_parameters()}
    assert all(names[id(p)].endswith(("bias",)) or "norm" in names[id(p)].lower() for p in no_decay["params"])
    assert any("word_embeddings" in names[id(p)] for p in decay["params"])
    assert len(decay["params"]) + len(no_decay["params"]) == len(list(model.parameters()))


def test_gradient_accumulation_equals_the_large_batch(tmp_path):
    """Two micro-batches of 4 accumulated give the step one batch of 8 gives (no dropout, mean losses)."""
    # Equal lengths: with padding, a mean over a padded batch of 8 and two of 4 weigh tokens alike anyway.
    feats = [dict(f, input_ids=f["input_ids"][:3], token_type_ids=[0] * 3, attention_mask=[1] * 3) for f in _features(16)]
    results = []
    for bs, accum in ((8, 1), (4, 2)):
        torch.manual_seed(0)
        model = BertForSequenceClassification(CFG)
        plan = BatchPlan(feats, bs, _collate, seed=0, shuffle=False)
        train(model, [Phase(plan, 2)], TrainingSettings(
            output_dir=tmp_path / f"{bs}", learning_rate=1e-2, gradient_accumulation_steps=accum, progress=False,
            max_grad_norm=0, warmup_ratio=0))
        results.append(model.classifier.weight.detach().clone())
    torch.testing.assert_close(results[0], results[1], atol=1e-6, rtol=1e-5)


def test_a_short_last_batch_split_by_accumulation_logs_the_batch_mean(tmp_path):
    """10 examples in batches of 6: the last batch of 4 is micro-batches of 3 and 1 at accumulation 2, which the step
    weighs 3:1; its logged loss is weighed so too, the batch of 4's mean (it was the two means' average: 0.6937
    against 0.7080)."""
    feats = [dict(f, input_ids=f["input_ids"][:3], token_type_ids=[0] * 3, attention_mask=[1] * 3) for f in _features(10)]
    logged = []
    for bs, accum in ((6, 1), (3, 2)):
        torch.manual_seed(0)
        result = train(BertForSequenceClassification(CFG), [Phase(BatchPlan(feats, bs, _collate, seed=0, shuffle=False), 2)],
                       TrainingSettings(output_dir=tmp_path / f"{bs}", learning_rate=1e-2, gradient_accumulation_steps=accum,
                                        progress=False, warmup_ratio=0, logging_steps=1))
        logged.append([r["loss"] for r in result.history if r["split"] == "train"])
    assert len(logged[0]) == 2
    np.testing.assert_allclose(logged[1], logged[0], rtol=1e-5)


def test_loop_logs_evaluates_and_learns(tmp_path):
    torch.manual_seed(0)
    feats = _features(64)
    model = BertForSequenceClassification(CFG)
    plan = BatchPlan(feats, 8, _collate, seed=3)
    calls = []

    def evaluate(m):
        calls.append(m.training)
        logits = torch.cat([m(**{k: v for k, v in _collate(feats[i:i + 16]).items() if k != "labels"}).logits
                            for i in range(0, 64, 16)])
        return {"accuracy": float((logits.argmax(-1) == torch.tensor([f["labels"] for f in feats])).float().mean())}

    result = train(model, [Phase(plan, 40)], TrainingSettings(output_dir=tmp_path, learning_rate=3e-3, logging_steps=5,
                                                              warmup_ratio=0.1, progress=False), evaluate=evaluate)
    assert calls and not any(calls)  # evaluation runs in eval mode
    records = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    train_rec = [r for r in records if r["split"] == "train"]
    assert [r["step"] for r in train_rec] == list(range(5, 41, 5))
    assert train_rec[-1]["loss"] < train_rec[0]["loss"]
    evals = [r for r in records if r["split"] == "eval"]
    assert [r["epoch"] for r in evals] == [0, 1, 2, 3, 4]  # one per epoch of 8 batches, 40 steps = 5 epochs
    assert result.last_eval["accuracy"] > 0.8
    assert (tmp_path / "checkpoints").is_dir()


def test_an_fp16_step_the_scaler_skips_leaves_the_schedule_where_it_was(tmp_path):
    """fp16: a step whose gradient overflows is skipped by the gradient scaler, and the learning-rate schedule does not
    move either, as transformers' Trainer (accelerate) does: the steps after it take the rates it would have taken
    (step 3 overflows: rates f(0), f(1), f(2), f(2), f(3), f(4) of the schedule). Was: the schedule moved on, one step
    ahead of transformers' for the rest of the run."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    model = BertForSequenceClassification(CFG)
    calls = []

    def overflow_at_step_3(grad):
        calls.append(None)  # once per step (no accumulation)
        return grad * math.inf if len(calls) == 3 else grad

    model.classifier.bias.register_hook(overflow_at_step_3)
    result = train(model, [Phase(BatchPlan(_features(48), 8, _collate, seed=0), 6)], TrainingSettings(
        output_dir=tmp_path, learning_rate=1e-3, warmup_steps=2, fp16=True, device="cpu", logging_steps=1,
        save_strategy="no", progress=False))
    records = [r for r in result.history if r["split"] == "train"]
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5, 6]
    assert not math.isfinite(records[2]["grad_norm"])
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1e-3)
    factor = transformers.get_linear_schedule_with_warmup(opt, 2, 6).lr_lambdas[0]
    assert [r["lr"] for r in records] == [1e-3 * factor(s) for s in (0, 1, 2, 2, 3, 4)]


def test_batch_plan_is_a_function_of_seed_and_epoch():
    plan = BatchPlan(list(range(10)), 3, list, seed=5)
    assert plan.batches(0) == BatchPlan(list(range(10)), 3, list, seed=5).batches(0)
    assert plan.batches(0) != plan.batches(1)
    assert sorted(i for b in plan.batches(2) for i in b) == list(range(10))
    assert len(plan) == 4
    with pytest.raises(ValueError, match="empty"):
        BatchPlan([], 3, list, seed=0)


def test_a_token_loss_run_draws_each_epochs_batches_once(tmp_path):
    """The loop asks for the epoch's batches at every step (the step's target count); they are drawn once an epoch:
    drawing them shuffles the whole dataset (215,145 rows in examples/pretrain-1h: most of a small model's step on
    a GPU). The masked-LM run over 3 epochs of 4 steps calls the sampler 3 times."""
    from bertkit.heads import BertForMaskedLM

    torch.manual_seed(0)
    rows = [{"input_ids": torch.randint(5, 50, (8,)), "labels": torch.where(torch.rand(8) < 0.3,
                                                                           torch.randint(5, 50, (8,)), -100)}
            for _ in range(16)]
    drawn = []

    def draw(epoch):
        drawn.append(epoch)
        order = torch.randperm(16, generator=torch.Generator().manual_seed(epoch)).tolist()
        return [order[i:i + 4] for i in range(0, 16, 4)]

    def collate(batch):
        return {k: torch.stack([r[k] for r in batch]) for k in ("input_ids", "labels")}

    plan = BatchPlan(rows, 4, collate, seed=0, draw=draw)
    model = BertForMaskedLM(CFG)
    train(model, [Phase(plan, 12)], TrainingSettings(output_dir=tmp_path, learning_rate=1e-3, progress=False,
                                                     warmup_ratio=0, save_strategy="no"))
    assert drawn == [0, 1, 2]


def test_training_settings_validation():
    with pytest.raises(ValueError, match="optim 'sgd' is not one of"):
        TrainingSettings(output_dir="x", optim="sgd")
    for bad in (0, -1e-5, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="learning_rate must be a finite positive number"):
            TrainingSettings(output_dir="x", learning_rate=bad)
    with pytest.raises(ValueError, match="warmup_ratio must be in"):
        TrainingSettings(output_dir="x", warmup_ratio=1.5)
    optimizer = build_optimizer(BertForSequenceClassification(CFG), 1e-3)
    assert type(optimizer) is torch.optim.AdamW and optimizer.defaults["fused"]  # CPU fp32: the fused kernel
    assert math.isclose(TrainingSettings(output_dir="x").weight_decay, 0.01)


def test_global_batch_splits_over_processes_and_accumulation():
    assert micro_batch_size(32, 1, 1) == 32 and micro_batch_size(32, 2, 1) == 16 and micro_batch_size(32, 2, 2) == 8
    with pytest.raises(ValueError, match=r"--batch-size 30 \(global\) does not split evenly over 2 process\(es\) x 4"):
        micro_batch_size(30, 2, 4)


def test_resuming_an_optimiser_state_of_another_parameter_layout_is_refused_naming_it():
    """A checkpoint whose optimiser held one fused q/k/v tensor (three now) met torch's bare ValueError."""
    from bertkit.training.checkpoint import load_optimizer_state

    model = BertForSequenceClassification(CFG)
    optimizer = torch.optim.AdamW(parameter_groups(model, 0.01))
    state = optimizer.state_dict()
    state["param_groups"][0]["params"] = state["param_groups"][0]["params"][:-2]  # two tensors fewer
    with pytest.raises(BertkitError, match=r"parameter groups of \[\d+, \d+\] tensors.*start a new run"):
        load_optimizer_state(optimizer, state)
    load_optimizer_state(optimizer, torch.optim.AdamW(parameter_groups(model, 0.01)).state_dict())


def test_a_runs_last_evaluation_is_read_from_its_history():
    """Was: a run resumed from its final checkpoint, whose last evaluation the killed run had made, returned
    last_eval None, and the GLUE grid marked it failed ("dev score is nan")."""
    history = [{"split": "eval", "step": 4, "epoch": 0, "accuracy": 0.5},
               {"split": "train", "step": 8, "epoch": 1, "loss": 0.3},
               {"split": "eval", "step": 8, "epoch": 1, "accuracy": 0.75, "f1": 0.7}]
    assert TrainResult(8, history).last_eval == {"accuracy": 0.75, "f1": 0.7}
    assert TrainResult(8, history[1:2]).last_eval is None


def test_throughput_counts_training_time_only(tmp_path, monkeypatch):
    """seqs_per_s and tokens_per_s are the rows and real tokens of the window over its training time. Was: the time of
    an evaluation or a checkpoint went into the next window (the window after an evaluation read 0.5 sequences/s where
    the steps ran at 2 to 10). A fake clock: each micro-batch's collate takes 1 s, an evaluation 100 s, a save 50 s."""
    from bertkit.training import loop

    clock = [1000.0]
    monkeypatch.setattr(loop.time, "perf_counter", lambda: clock[0])
    feats = _features(16)

    def timed_collate(batch):
        clock[0] += 1.0
        return _collate(batch)

    real_save = loop.save_checkpoint

    def slow_save(*args, **kwargs):
        clock[0] += 50.0
        return real_save(*args, **kwargs)

    monkeypatch.setattr(loop, "save_checkpoint", slow_save)

    def evaluate(model):
        clock[0] += 100.0
        return {"accuracy": 0.5}

    torch.manual_seed(0)
    plan = BatchPlan(feats, 4, timed_collate, seed=0, shuffle=False)
    result = train(BertForSequenceClassification(CFG), [Phase(plan, 4)], TrainingSettings(
        output_dir=tmp_path, learning_rate=1e-2, logging_steps=1, eval_strategy="steps", eval_steps=1, save_steps=2,
        progress=False, warmup_ratio=0), evaluate=evaluate)
    logged = [(r["seqs_per_s"], r["tokens_per_s"]) for r in result.history if r["split"] == "train"]
    tokens = [sum(len(f["input_ids"]) for f in feats[i:i + 4]) for i in range(0, 16, 4)]
    assert logged == [(4.0, float(t)) for t in tokens]
