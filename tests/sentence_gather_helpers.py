"""Worker for tests/test_sentence_gather.py, in processes started by launch_helpers.spawn_gloo_workers on gloo: each
rank computes the gathering losses on its slice of a batch, the gradients are averaged over the ranks as DDP
averages them, and rank 0 compares loss and gradients with one process on the whole batch."""

from __future__ import annotations

import os
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

# Each case: the loss, the columns it takes, and how the batch is split: per rank, the rows it runs, its weight
# (its share of the global batch x world size, as the training loop weights it) and each row's dataset index.
# "stand-in": a global batch of 1 row over 2 ranks, rank 1 runs a copy of row 0 at weight 0 (as the loop does).
# A global batch of 16 rows: the gather's equalities hold at any batch size, and MiniLM's backward pass is most of
# this test's time (32 rows: twice it); each anchor still has 15 in-batch negatives per column to be misplaced among.
SPLITS = {"even": [range(0, 8), range(8, 16)], "uneven": [range(0, 9), range(9, 16)], "stand-in": [range(0, 1)]}
CASES = [("mnrl", 3, "even"), ("mnrl", 3, "uneven"), ("mnrl", 3, "stand-in"), ("mnsrl", 2, "even"),
         ("cached", 3, "even"), ("cached", 3, "uneven"), ("matryoshka", 3, "even"), ("all_directions", 3, "even"),
         ("gist", 3, "even"), ("gist", 3, "uneven"), ("matryoshka_gist", 3, "even")]


def make_loss(name: str, model, gather: bool, guide=None):
    from bertkit.sentence import losses

    if name == "mnrl":
        return losses.MultipleNegativesRankingLoss(model, gather_across_devices=gather)
    if name == "mnsrl":
        return losses.MultipleNegativesSymmetricRankingLoss(model, gather_across_devices=gather)
    if name == "cached":
        return losses.CachedMultipleNegativesRankingLoss(model, mini_batch_size=4, gather_across_devices=gather)
    if name == "matryoshka":
        inner = losses.MultipleNegativesRankingLoss(model, gather_across_devices=gather)
        return losses.MatryoshkaLoss(model, inner, [384, 64], [1.0, 0.5])
    if name in ("gist", "matryoshka_gist"):  # the guide vets in-batch negatives: its rows are gathered too
        gist = losses.GISTEmbedLoss(model, guide, margin=0.05, gather_across_devices=gather)
        return gist if name == "gist" else losses.MatryoshkaLoss(model, gist, [384, 64], [1.0, 0.5])
    return losses.MultipleNegativesRankingLoss(model, gather_across_devices=gather,
                                               directions=("query_to_doc", "query_to_query", "doc_to_query", "doc_to_doc"))


def triples(data_dir: Path, n: int = 16) -> list[list[str]]:
    """(question, its paragraph, the next article's paragraph) from SQuAD: every row's hard negative differs."""
    import json

    articles = json.loads((data_dir / "squad" / "dev-v1.1.json").read_text())["data"]
    rows = [(a["paragraphs"][0]["qas"][0]["question"], a["paragraphs"][0]["context"],
             articles[i + 1]["paragraphs"][1]["context"]) for i, a in enumerate(articles[:n])]
    return [list(c) for c in zip(*rows)]


def features(model, columns: list[list[str]], rows: range | list[int]) -> list[dict]:
    out = []
    for texts in columns:
        f = model.tokenize([texts[i] for i in rows])
        out.append({**f, "index": torch.tensor(list(rows), dtype=torch.long)})
    return out


def loss_and_grad(model, loss, feats, weight: float = 1.0) -> tuple[float, torch.Tensor]:
    model.zero_grad(set_to_none=True)
    value = loss(feats, None)
    (value * weight).backward()
    return float(value.detach()), torch.cat([p.grad.flatten() if p.grad is not None else torch.zeros(p.numel())
                                    for p in model.parameters()])


def compare(model_dir: str, data_dir: str) -> dict:
    """Per case: the 1-process loss, each rank's loss, and the averaged gradient's distance to the 1-process one;
    plus, as a control, the loss when rank 1's hard negatives are paired with rank 0's anchors."""
    from bertkit.sentence import SentenceTransformer

    model = SentenceTransformer(model_dir)
    # one layer of the two: the gather's equalities do not depend on depth, and the backward pass is this test's time
    model.bert.encoder.layer = model.bert.encoder.layer[:1]
    # texts cut to 16 word pieces (questions shorter, so batches still pad): the gather's equalities hold at any
    # length, and a backward pass through MiniLM is most of this test's time (32: 1.5x it)
    model.max_seq_length = 16
    model.train()
    for m in model.modules():  # dropout off: the ranks would draw other masks than one process
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
    guide = SentenceTransformer(model_dir)  # the same checkpoint: a guide that vets some negatives and not others
    guide.bert.encoder.layer = guide.bert.encoder.layer[:1]
    guide.max_seq_length = 16  # GIST's guide vets 22% of the candidates at 16 as at 32
    columns = triples(Path(data_dir))
    rank, world = dist.get_rank(), dist.get_world_size()
    results, wants = {}, {}
    for name, ncols, split in CASES:
        cols = columns[:ncols]
        shares = SPLITS[split]
        everything = range(0, max(s.stop for s in shares))
        if rank == 0 and (name, len(everything)) not in wants:  # the other rank has nothing to do meanwhile
            # one 1-process reference per loss and global batch (the even and the uneven split share theirs)
            wants[name, len(everything)] = loss_and_grad(model, make_loss(name, model, False, guide),
                                                         features(model, cols, everything))
        if rank == 0:
            want, want_grad = wants[name, len(everything)]
        mine = shares[rank] if rank < len(shares) else shares[0][:1]  # no share: a stand-in copy of row 0
        weight = len(mine) * world / len(everything) if rank < len(shares) else 0.0
        got, grad = loss_and_grad(model, make_loss(name, model, True, guide), features(model, cols, mine), weight)
        dist.all_reduce(grad)
        grad /= world  # DDP's average
        got_all = [torch.zeros(1) for _ in range(world)]
        dist.all_gather(got_all, torch.tensor([got]))
        if rank == 0:
            results[f"{name}-{split}"] = {"want": want, "got": [float(g) for g in got_all],
                                          "grad_error": float((grad - want_grad).norm() / want_grad.norm()),
                                          "grad_norm": float(want_grad.norm())}
    # under DDP (as the trainer runs it): the cached loss's averaged gradient is the uncached loss's
    model.bert.pooler.requires_grad_(False)  # as the trainer leaves it: no part of an embedding, so no gradient
    ddp = DistributedDataParallel(_Losses({name: make_loss(name, model, True) for name in ("mnrl", "cached")}))
    mine = features(model, columns, SPLITS["even"][rank])
    ddp_grads = {}
    for name in ("mnrl", "cached"):
        model.zero_grad(set_to_none=True)
        ddp(name, mine).backward()
        ddp_grads[name] = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
    if rank == 0:
        want = ddp_grads["mnrl"]
        results["ddp-cached"] = {"grad_error": float((ddp_grads["cached"] - want).norm() / want.norm()),
                                 "grad_norm": float(want.norm())}
    # evaluation (no grad): each rank's own batch (5 rows on rank 0, 11 on rank 1), with the gathering loss and alone
    mine = range(0, 5) if rank == 0 else range(5, 16)
    with torch.no_grad():
        evaluated = [float(make_loss("mnrl", model, gather, guide)(features(model, columns, mine), None))
                     for gather in (True, False)]
    evaluations = [None] * world
    dist.all_gather_object(evaluations, evaluated)
    if rank == 0:
        results["evaluation"] = evaluations
    # control: the batch with rank 1's positives paired with rank 0's anchors, as misplaced offsets would pair them
    if rank == 0:
        cols = [columns[0], columns[1][8:16] + columns[1][:8]]
        results["control"] = {"misaligned": float(make_loss("mnrl", model, False)(features(model, cols, range(16)),
                                                                                 None).detach()),
                              "want": results["mnrl-even"]["want"]}
    return results


class _Losses(torch.nn.Module):
    """Losses over one model, by name: one DDP wrapper runs each of them."""

    def __init__(self, losses: dict):
        super().__init__()
        self.losses = torch.nn.ModuleDict(losses)

    def forward(self, name: str, feats: list[dict]) -> torch.Tensor:
        return self.losses[name](feats, None)


def gathered_rows(rank: int) -> dict:
    """The gather itself on labelled rows: column c's row i holds (i, c); splits 3+5, and 1 + a stand-in."""
    from bertkit.sentence.losses.gather import gather_rows

    out = {}
    for split, shares in {"3+5": [range(0, 3), range(3, 8)], "stand-in": [range(0, 1), range(0, 1)]}.items():
        rows = list(shares[rank])
        columns = [torch.tensor([[float(i), float(c)] for i in rows], requires_grad=True) for c in range(3)]
        glob, factor = gather_rows(columns, torch.tensor(rows))
        sum(g.sum() for g in glob).backward()  # the gradient reaches this rank's rows only, once each
        out[split] = {"rows": [g.detach() for g in glob], "factor": factor,
                      "grad": [c.grad.clone() for c in columns]}
    return out


def logged_terms(model_dir: str, rank: int) -> dict:
    """The terms a loss returns by name (as SpladeLoss does), logged by the trainer's LossModel: here the rows of
    each batch, 3 and 3 on rank 0 and 6 on rank 1."""
    from bertkit.sentence import SentenceTransformer
    from bertkit.sentence.loss_model import LossModel
    from bertkit.sentence.losses.base import SentenceLoss

    class Rows(SentenceLoss):
        def forward(self, features, labels):
            return {"rows": torch.tensor(float(features[0]["input_ids"].shape[0]))}

    module = LossModel(Rows(SentenceTransformer(model_dir)))
    for n in ([3, 3] if rank == 0 else [6]):
        module(torch.ones(n, 1, 2, dtype=torch.long), torch.ones(n, 1, 2, dtype=torch.long),
               torch.zeros(n, 1, 2, dtype=torch.long), [2], [0], [None], torch.zeros(n), torch.arange(n))
    return module.components("train")


def no_duplicates_eval_loss(model_dir: str, data_dir: str, out_dir: str) -> float:
    """SentenceTransformerTrainer.evaluate()'s eval_loss (MultipleNegativesRankingLoss) on 6 SQuAD pairs whose first
    four questions are one text, in the no-duplicates sampler's batches of 4: 3, 1, 1 and 1 rows, the first three
    counted as whole batches, the last as the 2 rows left over (one process, or under torchrun whichever rank
    evaluates them)."""
    from datasets import Dataset

    from bertkit.sentence import (
        SentenceTransformer,
        SentenceTransformerTrainer,
        SentenceTransformerTrainingArguments,
        losses,
    )
    from bertkit.sentence.training_args import BatchSamplers

    questions, paragraphs, _ = triples(Path(data_dir), 6)
    questions[1] = questions[2] = questions[3] = questions[0]
    model = SentenceTransformer(model_dir, device="cpu")
    model.max_seq_length = 32
    args = SentenceTransformerTrainingArguments(output_dir=out_dir, per_device_eval_batch_size=4, use_cpu=True,
                                                batch_sampler=BatchSamplers.NO_DUPLICATES, report_to=[], seed=3)
    trainer = SentenceTransformerTrainer(model=model, args=args, loss=losses.MultipleNegativesRankingLoss(model),
                                         eval_dataset=Dataset.from_dict({"q": questions, "p": paragraphs}))
    return trainer.evaluate()["eval_loss"]


def worker(rank: int, world: int, port: int, model_dir: str, data_dir: str, result_file: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        gathered = gathered_rows(rank)
        gathered_all = [None] * world
        dist.all_gather_object(gathered_all, gathered)
        terms = [None] * world
        dist.all_gather_object(terms, logged_terms(model_dir, rank))
        losses = compare(model_dir, data_dir)
        eval_loss = no_duplicates_eval_loss(model_dir, data_dir, f"{result_file}.eval")
        if rank == 0:
            torch.save({"gathered": gathered_all, "losses": losses, "terms": terms, "eval_loss": eval_loss},
                       result_file)
        dist.barrier()
    finally:
        dist.destroy_process_group()
