"""``mine_hard_negatives``: add to (anchor, positive) pairs the corpus texts the model ranks closest to each anchor
that are not its positives, as sentence-transformers 6 mines them (same candidates, filters, sampling and output
formats, so the same negatives from the same model and data), with an exact torch search instead of faiss.

    triplets = mine_hard_negatives(pairs, model, range_min=2, num_negatives=1, relative_margin=0.05)

Each distinct anchor is embedded once (as a query) and each distinct text of ``corpus`` plus the positives once (as
a document), normalised; a query's candidates are its ``range_max`` best-scoring texts, less the anchor's own text
(unless it is its own positive and ``include_positives``), less its positives (unless ``include_positives``), less
those the margins, ``max_score`` and ``min_score`` rule out, as sentence-transformers 6.3 mines them; the first
``range_min`` candidates are skipped, and ``num_negatives`` taken from the rest: the best ("top") or drawn at random
("random", with ``rng``, Python's ``random`` module by default as in sentence-transformers).
"""

from __future__ import annotations

import math
import random
from collections import Counter
from numbers import Real
from typing import Any

import torch

from bertkit.errors import BertkitError, is_whole, keyword_only
from bertkit.sentence.data import column_names
from bertkit.sentence.finite import refuse_nonfinite

FORMATS = ("triplet", "n-tuple", "labeled-pair", "labeled-list")
_REFUSED = {
    "use_faiss": "bertkit searches exactly with torch; drop this argument (faiss_batch_size bounds the memory)",
    "use_multi_process": "encoding runs in one process; drop this argument",
    "cache_folder": "embeddings are not cached on disk; drop this argument",
    "as_triplets": "use output_format='triplet' or 'n-tuple'",
}

# sentence-transformers' positional order: cross_encoder and the rest are keyword-only here
_POSITIONS = ("dataset", "model", "anchor_column_name", "positive_column_name", "corpus", "cross_encoder",
              "range_min", "range_max", "max_score", "min_score", "absolute_margin", "relative_margin",
              "num_negatives", "sampling_strategy")


@keyword_only(_POSITIONS, "sentence-transformers")
def mine_hard_negatives(dataset: Any, model: Any, anchor_column_name: str | None = None,
                        positive_column_name: str | None = None, corpus: list[str] | None = None, *,
                        range_min: int = 0, range_max: int | None = None, max_score: float | None = None,
                        min_score: float | None = None, absolute_margin: float | None = None,
                        relative_margin: float | None = None, num_negatives: int = 3, sampling_strategy: str = "top",
                        query_prompt_name: str | None = None, query_prompt: str | None = None,
                        corpus_prompt_name: str | None = None, corpus_prompt: str | None = None,
                        cross_encoder: Any = None, include_positives: bool = False, output_format: str = "triplet", output_scores: bool = False,
                        batch_size: int = 32, faiss_batch_size: int = 16384, verbose: bool = True,
                        margin: float | None = None, rng: random.Random | None = None, **refused: Any) -> Any:
    """``dataset`` (a ``datasets.Dataset`` or a list of dicts) with hard negatives, in the same type: "triplet"
    (anchor, positive, negative), "n-tuple" (anchor, positive, negative_1..n; rows without n negatives dropped),
    "labeled-pair" (anchor, text, label 1/0) or "labeled-list" (anchor, [texts], [labels]); ``output_scores`` adds
    (or puts in the labels' place) the similarity scores. ``margin`` is sentence-transformers' older name of
    ``absolute_margin``. Asking for more negatives than the corpus holds beside a query's positives is an error. The
    arguments after ``corpus`` are keywords (a call by sentence-transformers' positions, whose sixth is
    ``cross_encoder``, is refused by Python). With a ``cross_encoder``, its scores replace the model's for the
    candidates and the positives (which order the candidates, which the filters compare, and ``output_scores``
    gives), as sentence-transformers 6.3 rescores, with or without a filter."""
    for name, value in refused.items():
        if name not in _REFUSED:
            raise BertkitError(f"mine_hard_negatives got an unknown argument {name!r}")
        # False is sentence-transformers' default of the flags, and does nothing there either; as_triplets=False
        # asks for n-tuples, so any value of it is refused rather than mined as triplets
        if value is not None and (value is not False or name == "as_triplets"):
            raise BertkitError(f"mine_hard_negatives({name}=...) is not implemented in bertkit: {_REFUSED[name]}")
    columns = column_names(dataset)
    if len(dataset) == 0:
        raise BertkitError(f"mine_hard_negatives: the dataset (columns {columns}) has no rows; give it (anchor, "
                           "positive) pairs")
    anchor_column_name = _column(anchor_column_name, columns, 0, "anchor_column_name")
    positive_column_name = _column(positive_column_name, columns, 1, "positive_column_name")
    if anchor_column_name == positive_column_name:  # each anchor its own positive: nothing to mine against
        raise BertkitError(f"mine_hard_negatives: anchor_column_name and positive_column_name are both "
                           f"{anchor_column_name!r} (of the columns {columns}); name the positive column with "
                           "positive_column_name=")
    if margin is not None:
        absolute_margin = margin
    if include_positives:
        output_format = "n-tuple"  # the ranking order, positives included, is the point (as sentence-transformers)
    if output_format not in FORMATS:
        raise BertkitError(f"output_format {output_format!r} is not one of {FORMATS}"
                           + ("; for sentence-transformers' older 'n-tuple-scores' use output_format='n-tuple', "
                              "output_scores=True" if output_format == "n-tuple-scores" else ""))
    if sampling_strategy not in ("top", "random"):
        raise BertkitError(f"sampling_strategy {sampling_strategy!r} is not 'top' or 'random'")
    for name, value, least in (("num_negatives", num_negatives, 1), ("range_min", range_min, 0),
                               ("range_max", range_max, 1), ("batch_size", batch_size, 1),
                               ("faiss_batch_size", faiss_batch_size, 1)):
        if value is not None and not is_whole(value, least):
            raise BertkitError(f"{name} must be a whole number >= {least}, got {value!r}")
    for name, value in (("max_score", max_score), ("min_score", min_score), ("absolute_margin", absolute_margin),
                        ("relative_margin", relative_margin), ("margin", margin)):
        # a NaN compares False, so that its filter would keep every candidate
        if value is not None and (isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(value)):
            raise BertkitError(f"{name} must be a finite number or None, got {value!r}")
    rows = [dataset[i] for i in range(len(dataset))] if not hasattr(dataset, "column_names") else None
    queries_all = [r[anchor_column_name] for r in rows] if rows is not None else list(dataset[anchor_column_name])
    positives_all = [r[positive_column_name] for r in rows] if rows is not None else list(dataset[positive_column_name])
    for column, values in ((anchor_column_name, queries_all), (positive_column_name, positives_all)):
        bad = next((i for i, v in enumerate(values) if not isinstance(v, str)), None)
        if bad is not None:
            raise BertkitError(f"mine_hard_negatives: row {bad}, column {column!r} is {type(values[bad]).__name__} "
                               f"{str(values[bad])[:60]!r}, not a text; "
                               + ("fill it in or drop the row (dataset.filter(lambda row: row[...] is not None))"
                                  if values[bad] is None else "name the text columns with anchor_column_name= and "
                                  f"positive_column_name= (the columns: {columns})"))
    bad = next((i for i, v in enumerate(corpus or ()) if not isinstance(v, str)), None)
    if bad is not None:
        raise BertkitError(f"mine_hard_negatives: corpus[{bad}] is {type(corpus[bad]).__name__} "
                           f"{str(corpus[bad])[:60]!r}, not a text; drop it from the corpus")
    max_rows = max(Counter(queries_all).values())  # sentence-transformers sizes the search by rows per anchor
    filtered = absolute_margin is not None or relative_margin is not None or max_score is not None
    if range_max is None:  # room for skipped candidates when filters drop some, and for the positives
        many = filtered or (cross_encoder is not None and min_score is not None)
        range_max = range_min + num_negatives * (10 if many else 1) + max_rows
    if range_min >= range_max or num_negatives > range_max - range_min:
        raise BertkitError(f"range_min {range_min} and range_max {range_max} leave {range_max - range_min} "
                           f"candidates for num_negatives {num_negatives}; need range_min < range_max and "
                           "range_max - range_min >= num_negatives")

    texts = list(dict.fromkeys((list(corpus) if corpus is not None else positives_all) + positives_all))
    text_id = {t: i for i, t in enumerate(texts)}
    queries = list(dict.fromkeys(queries_all))
    query_id = {q: i for i, q in enumerate(queries)}
    positive_ids: list[list[int]] = [[] for _ in queries]
    # the anchor's own text is no negative of it (unless it is its own positive and positives are candidates)
    own_ids = [text_id.get(q, -1) for q in queries]
    for q, p in zip(queries_all, positives_all):
        if text_id[p] not in positive_ids[query_id[q]]:
            positive_ids[query_id[q]].append(text_id[p])
        if include_positives and q == p:
            own_ids[query_id[q]] = -1
    reserved = max((0 if include_positives else len(p)) + (own not in p and own != -1)
                   for p, own in zip(positive_ids, own_ids))
    if range_min + num_negatives > len(texts) - reserved:
        raise BertkitError(
            f"mine_hard_negatives: cannot mine {num_negatives} negatives per anchor after skipping range_min "
            f"{range_min}: the corpus holds {len(texts)} distinct texts, and up to {reserved} of them are an anchor's "
            f"own text and positives, which leaves {max(len(texts) - reserved - range_min, 0)}; lower num_negatives or "
            "range_min, or pass corpus= with more texts")

    encode = {"batch_size": batch_size, "normalize_embeddings": True, "convert_to_tensor": True,
              "show_progress_bar": verbose}
    corpus_emb = model.encode_document(texts, prompt_name=corpus_prompt_name, prompt=corpus_prompt, **encode)
    query_emb = model.encode_query(queries, prompt_name=query_prompt_name, prompt=query_prompt, **encode)
    for embeddings, inputs, what in ((corpus_emb, texts, "document embedding"), (query_emb, queries, "query embedding")):
        refuse_nonfinite(embeddings, inputs, "mine_hard_negatives", what, "no negatives were mined", model=model)
    width = range_max + max_rows + 1  # sentence-transformers 6.3: room for the positives and the anchor's own text
    scores, ids = [], []
    for start in range(0, len(queries), faiss_batch_size):  # exact search, (faiss_batch_size, corpus) at a time
        top = torch.topk(model.similarity(query_emb[start:start + faiss_batch_size], corpus_emb),
                         k=min(width, len(texts)), dim=1)
        scores.append(top.values)
        ids.append(top.indices)
    scores, ids = torch.cat(scores), torch.cat(ids)  # (Q, k)
    if width > len(texts):  # as sentence-transformers: padded to range_max + max_rows + 1 with empty candidates
        scores = torch.cat([scores, scores.new_full((len(queries), width - len(texts)), -torch.inf)], 1)
        ids = torch.cat([ids, ids.new_full((len(queries), width - len(texts)), -1)], 1)
    repeat = torch.tensor([len(p) for p in positive_ids])
    flat_positives = torch.tensor([i for p in positive_ids for i in p])
    positive_scores = model.similarity_pairwise(query_emb.repeat_interleave(repeat, 0), corpus_emb[flat_positives])
    if cross_encoder is not None:  # every candidate (a padding one, id -1, as the last text, as sentence-transformers scores it) and
        # every positive, in one predict call: batches across queries
        pairs = [(queries[q], texts[i]) for q, row in enumerate(ids.tolist()) for i in row]
        pairs += [(queries[q], texts[p]) for q, pids in enumerate(positive_ids) for p in pids]
        rescored = cross_encoder.predict(pairs, batch_size=batch_size, convert_to_tensor=True).to(scores)
        refuse_nonfinite(rescored, pairs, "mine_hard_negatives", "cross_encoder's score", "no negatives were mined",
                         model=cross_encoder)
        scores, positive_scores = rescored[:ids.numel()].view(ids.shape).clone(), rescored[ids.numel():]
    scores[ids == -1] = -torch.inf
    scores[ids == torch.tensor(own_ids, device=ids.device).unsqueeze(1)] = -torch.inf
    if not include_positives:
        scores[torch.stack([torch.isin(ids[q], torch.tensor(p)) for q, p in enumerate(positive_ids)])] = -torch.inf

    skipped: dict[str, int] = {}

    def drop(name: str, mask: torch.Tensor) -> None:
        skipped[name] = int((mask & (scores > -torch.inf)).sum())
        scores[mask] = -torch.inf

    # against each anchor's hardest (lowest-scored) positive
    hardest = torch.stack([s.min() for s in positive_scores.split(repeat.tolist())]).unsqueeze(1)  # (Q, 1)
    if absolute_margin is not None:
        drop("absolute_margin", scores + absolute_margin > hardest)
    if relative_margin is not None:
        drop("relative_margin", scores > hardest - hardest.abs() * relative_margin)
    if max_score is not None:
        drop("max_score", scores > max_score)
    if min_score is not None:
        drop("min_score", scores < min_score)
    negative_scores, local = torch.topk(scores, k=range_max, dim=1)
    negative_ids = ids.gather(1, local)[:, range_min:]
    negative_scores = negative_scores[:, range_min:]
    if sampling_strategy == "top":
        negative_ids, negative_scores = negative_ids[:, :num_negatives], negative_scores[:, :num_negatives]
    else:
        options = (negative_ids.shape[1] - negative_scores.isinf().sum(1)).clamp(min=num_negatives)
        draw = rng if rng is not None else random
        picked = torch.tensor([draw.sample(range(int(n)), k=num_negatives) for n in options])
        negative_scores, order = negative_scores.gather(1, picked).sort(dim=1, descending=True)
        negative_ids = negative_ids.gather(1, picked).gather(1, order)

    names = _column_names(output_format, output_scores, anchor_column_name, positive_column_name, num_negatives)
    out = _rows(output_format, output_scores, queries, texts, positive_ids, positive_scores.tolist(),
                negative_ids.tolist(), negative_scores.tolist())
    if verbose:
        kept = negative_scores[negative_scores > -torch.inf]
        print(f"mined {len(kept)} negatives for {len(queries)} anchors from {len(texts)} texts: mean score "
              f"{positive_scores.mean():.4f} positive, {kept.mean() if len(kept) else float('nan'):.4f} negative; "
              + ", ".join(f"{n} skipped {k}" for n, k in skipped.items() if k) + f"; {len(out)} rows")
    if hasattr(dataset, "column_names"):
        from datasets import Dataset

        # by column, so that a dataset left without rows (every candidate filtered out) keeps its columns
        return Dataset.from_dict({name: [row[i] for row in out] for i, name in enumerate(names)})
    return [dict(zip(names, row)) for row in out]


def _column(name: str | None, columns: list[str], position: int, what: str) -> str:
    if name is None:
        if len(columns) <= position:
            raise BertkitError(f"the dataset has the columns {columns}; mine_hard_negatives needs (anchor, positive)")
        return columns[position]
    if name not in columns:
        raise BertkitError(f"{what} {name!r} is not a column of the dataset {columns}")
    return name


def _column_names(output_format: str, output_scores: bool, anchor: str, positive: str,
                  num_negatives: int) -> list[str]:
    """The output's columns, the order of ``_rows``' values."""
    if output_format == "labeled-pair":
        return [anchor, positive, "score" if output_scores else "label"]
    if output_format == "labeled-list":
        return [anchor, positive, "scores" if output_scores else "labels"]
    negatives = ["negative"] if output_format == "triplet" else [f"negative_{i}" for i in range(1, num_negatives + 1)]
    return [anchor, positive, *negatives, *(["scores"] if output_scores else [])]


def _rows(output_format: str, output_scores: bool, queries: list[str], texts: list[str],
          positive_ids: list[list[int]], positive_scores: list[float], negative_ids: list[list[int]],
          negative_scores: list[list[float]]) -> list[tuple]:
    """The output rows, each its values in ``_column_names``' order, in sentence-transformers' order: by anchor (first
    appearance), then positive, then negative rank; a negative scored -inf (filtered out, or missing) is left out."""
    rows: list[tuple] = []
    r = 0  # index of the (anchor, positive) pair
    for q, pids in enumerate(positive_ids):
        found = [(texts[i], s) for i, s in zip(negative_ids[q], negative_scores[q]) if s != -float("inf")]
        if output_format == "labeled-pair":
            for pid in pids:
                rows.append((queries[q], texts[pid], positive_scores[r] if output_scores else 1))
                r += 1
            rows.extend((queries[q], t, s if output_scores else 0) for t, s in found)
            continue
        for pid in pids:
            base, scores = (queries[q], texts[pid]), [positive_scores[r]] + [s for _, s in found]
            r += 1
            if output_format == "triplet":
                rows.extend((*base, t, *([[scores[0], s]] if output_scores else [])) for t, s in found)
            elif output_format == "n-tuple" and len(found) == len(negative_ids[q]):
                rows.append((*base, *(t for t, _ in found), *([scores] if output_scores else [])))
            elif output_format == "labeled-list" and found:
                rows.append((queries[q], [texts[pid]] + [t for t, _ in found],
                             scores if output_scores else [1] + [0] * len(found)))
    return rows
