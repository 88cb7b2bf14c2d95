"""Pre-training data: documents -> next-sentence pairs -> masked-LM instances (BERT paper, section 3.1).

google-research/bert ``create_pretraining_data.py`` (the reference), streamed and parallel; the full
description, with the exact meaning of every option, is docs/pretraining-data.md.

* **Work units** (:func:`~bertkit.data.text.plan_work_units`): the corpus, in file order, in pieces of
  about ``unit_bytes`` (>= 2 files). One worker reads, tokenises, pairs and masks a unit with seeds
  derived from ``(seed, unit index)`` and writes it as one shard: output bytes never depend on
  ``num_workers``, and memory per worker is bounded by a unit, never by the corpus.
* **Pairs** (:func:`create_instances_from_document`): the reference's chunking, A/B split, put-back of
  unused sentences and ``truncate_seq_pair``. ``"random"`` negatives come from another document of the
  same unit (the reference holds the whole corpus in memory); ``"nearby"`` negatives are whole sentences
  of the same document, 1..``nearby_window`` sentences away from A on either side, never adjacent.
* **Masking** (:func:`mask_tokens`): the reference's budget and 80/10/10, optionally whole-word;
  ``masking="dynamic"`` stores unmasked instances and :class:`PretrainingDataset` masks them from
  ``(seed, epoch, index)`` (RoBERTa, section 4.1).

Deliberate differences from the reference: (1) the short target length is drawn per instance, not per
document (documents here can be whole books); (2) the next/random coin comes first and a one-sentence
chunk drawn "next" takes the following sentence as B, so positives are 50%, not ~45% (a lone last
sentence is then dropped); (3) random replacement tokens exclude the five special tokens, and a ``##``
piece right after [CLS]/[SEP] starts a new word; (4) instances are shuffled within a shard only.
"""

from __future__ import annotations

import dataclasses
import os
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
from tqdm.auto import tqdm

from bertkit._parallel import spawn_pool
from bertkit.data.shards import (
    FORMAT,
    VOCAB,
    ShardedInstances,
    remove_shards,
    save_shard,
    sha256_file,
    shard_name,
    write_manifest,
)
from bertkit.data.text import DECODE_ERRORS, INPUT_FORMATS, WorkUnit, iter_documents, plan_work_units
from bertkit.errors import BertkitError
from bertkit.heads import IGNORE_INDEX  # positions without a masked-LM target (the loss skips them)
from bertkit.tokenization.wordpiece import SPECIAL_TOKENS as BERT_SPECIAL_TOKENS

SPECIAL_TOKENS = dict(zip(("pad", "unk", "cls", "sep", "mask"), BERT_SPECIAL_TOKENS))  # by role, for the manifest


@dataclass(frozen=True)
class PretrainingConfig:
    """Everything that decides the instances' bytes (it is stored in the manifest)."""

    max_seq_length: int = 128
    """Tokens per instance, [CLS] and the two [SEP] included (the paper: 128, then 512)."""
    max_predictions_per_seq: int = 20
    """Most masked positions per instance (google's 20 at 128 tokens, 80 at 512)."""
    masked_lm_prob: float = 0.15
    """Share of tokens to predict; of those 80% become [MASK], 10% a random token, 10% stay (section 3.1)."""
    short_seq_prob: float = 0.1
    """Share of instances made shorter than max_seq_length, so fine-tuning lengths are seen too."""
    dupe_factor: int = 5
    """Passes over the corpus, each with different masks and pairs."""
    random_next_prob: float = 0.5
    """Share of pairs whose second segment is not the true next text."""
    whole_word_mask: bool = False
    """Mask all WordPieces of a word together (google's later whole-word-masking models)."""
    nsp_negatives: Literal["random", "nearby"] = "random"
    """Where a negative pair's second segment comes from: another document, or a nearby non-adjacent
    stretch of the same one (docs/pretraining-data.md)."""
    nearby_window: int = 8
    """With nearby negatives: at most this many sentences away from segment A."""
    masking: Literal["static", "dynamic"] = "static"
    """dynamic: store unmasked instances and draw masks afresh each epoch at load time."""
    input_format: Literal["auto", "prose", "sentences", "wikitext"] = "auto"
    """How documents and sentences are marked in the files (docs/pretraining-data.md)."""
    errors: Literal["strict", "replace", "ignore"] = "strict"
    """Non-UTF-8 bytes: stop naming file, line and byte (strict), replace with U+FFFD, or drop them."""
    unit_bytes: int = 4 << 20
    """Bytes of text per unit of work (each unit is processed independently with its own seed)."""
    seed: int = 12345
    """Seed of pairs and masks: same seed, same bytes."""

    def __post_init__(self):
        checks = [
            ("max_seq_length", self.max_seq_length >= 5, "must be at least 5 ([CLS] a [SEP] b [SEP])"),
            ("max_predictions_per_seq", self.max_predictions_per_seq >= 1, "must be at least 1"),
            ("masked_lm_prob", 0 < self.masked_lm_prob < 1, "must be in (0, 1)"),
            ("short_seq_prob", 0 <= self.short_seq_prob <= 1, "must be in [0, 1]"),
            ("dupe_factor", self.dupe_factor >= 1, "must be at least 1"),
            ("random_next_prob", 0 <= self.random_next_prob <= 1, "must be in [0, 1]"),
            ("nsp_negatives", self.nsp_negatives in ("random", "nearby"), "must be 'random' or 'nearby'"),
            ("nearby_window", self.nearby_window >= 1, "must be at least 1"),
            ("masking", self.masking in ("static", "dynamic"), "must be 'static' or 'dynamic'"),
            ("input_format", self.input_format in INPUT_FORMATS, f"must be one of {INPUT_FORMATS}"),
            ("errors", self.errors in DECODE_ERRORS, f"must be one of {DECODE_ERRORS}"),
            ("unit_bytes", self.unit_bytes >= 1, "must be positive"),
            ("seed", self.seed >= 0, "must be a non-negative integer"),
        ]
        for name, ok, why in checks:
            if not ok:
                raise BertkitError(f"{name}={getattr(self, name)!r} {why}")


# --------------------------------------------------------------------------------------------------
# Next-sentence pairs
# --------------------------------------------------------------------------------------------------


@dataclass
class PairInstance:
    """Segments A and B before masking, with where they came from (sentence indices, end exclusive)."""

    tokens_a: list[int]
    tokens_b: list[int]
    is_random_next: bool
    a_span: tuple[int, int, int]  # (document, first sentence, end sentence)
    b_span: tuple[int, int, int]
    nearby_fallback: bool = False


def create_instances_from_document(
    documents: Sequence[Sequence[Sequence[int]]],
    document_index: int,
    config: PretrainingConfig,
    rng: random.Random,
) -> list[PairInstance]:
    """All A/B pairs from one document (a list of tokenised sentences); see the module docstring."""
    document = documents[document_index]
    max_num_tokens = config.max_seq_length - 3

    def draw_target() -> int:
        if rng.random() < config.short_seq_prob:
            return rng.randint(2, max_num_tokens)
        return max_num_tokens

    instances: list[PairInstance] = []
    target = draw_target()
    chunk_start, chunk_length, i = 0, 0, 0
    while i < len(document):
        chunk_length += len(document[i])
        if i == len(document) - 1 or chunk_length >= target:
            chunk_end = i + 1
            is_random_next = rng.random() < config.random_next_prob
            if not is_random_next and chunk_end - chunk_start == 1:
                if chunk_end == len(document):
                    break  # a lone last sentence cannot have a true next sentence
                chunk_end += 1  # a positive needs a second sentence: take the next one as B
                i += 1
            a_end = chunk_start + 1
            if chunk_end - chunk_start >= 2:
                a_end = rng.randint(chunk_start + 1, chunk_end - 1)
            tokens_a = [t for s in document[chunk_start:a_end] for t in s]
            a_span = (document_index, chunk_start, a_end)
            fallback = False
            if is_random_next:
                target_b = target - len(tokens_a)
                b_span = None
                if config.nsp_negatives == "nearby":
                    b_span = _nearby_span(document, chunk_start, a_end, target_b, config.nearby_window, rng)
                    fallback = b_span is None
                    if b_span is not None:
                        b_span = (document_index, *b_span)
                if b_span is None:
                    b_span = _random_document_span(documents, document_index, target_b, rng)
                tokens_b = [t for s in documents[b_span[0]][b_span[1] : b_span[2]] for t in s]
                i = a_end - 1  # put the chunk's unused sentences back
            else:
                tokens_b = [t for s in document[a_end:chunk_end] for t in s]
                b_span = (document_index, a_end, chunk_end)
            truncate_seq_pair(tokens_a, tokens_b, max_num_tokens, rng)
            instances.append(PairInstance(tokens_a, tokens_b, is_random_next, a_span, b_span, fallback))
            chunk_start, chunk_length = i + 1, 0
            target = draw_target()
        i += 1
    return instances


def _random_document_span(
    documents: Sequence[Sequence[Sequence[int]]], document_index: int, target_b: int, rng: random.Random
) -> tuple[int, int, int]:
    other = document_index
    for _ in range(10):  # the reference's ten tries; a one-document pool falls back to itself
        other = rng.randint(0, len(documents) - 1)
        if other != document_index:
            break
    sentences = documents[other]
    start = rng.randint(0, len(sentences) - 1)
    return (other, start, _take_forward(sentences, start, len(sentences), target_b))


def _nearby_span(
    document: Sequence[Sequence[int]], a_start: int, a_end: int, target_b: int, window: int, rng: random.Random
) -> tuple[int, int] | None:
    options = [(+1, g) for g in range(1, window + 1) if a_end + g < len(document)]
    options += [(-1, g) for g in range(1, window + 1) if a_start - g >= 1]
    if not options:
        return None
    side, gap = options[rng.randrange(len(options))]
    if side > 0:
        start = a_end + gap
        return start, _take_forward(document, start, len(document), target_b)
    end = a_start - gap  # B is document[start:end]; sentences end .. a_start - 1 separate it from A
    start, length = end - 1, len(document[end - 1])
    while start > 0 and length < target_b:
        start -= 1
        length += len(document[start])
    return start, end


def _take_forward(sentences: Sequence[Sequence[int]], start: int, limit: int, target: int) -> int:
    end, length = start, 0
    while end < limit:
        length += len(sentences[end])
        end += 1
        if length >= target:
            break
    return end


def truncate_seq_pair(tokens_a: list[int], tokens_b: list[int], max_num_tokens: int, rng: random.Random) -> None:
    """Trim the longer segment, one token at a time from its front or back (50/50), to fit; in place."""
    while len(tokens_a) + len(tokens_b) > max_num_tokens:
        trunc = tokens_a if len(tokens_a) > len(tokens_b) else tokens_b
        # Google: truncate from the front or the back at random "to add more randomness and avoid biases".
        if rng.random() < 0.5:
            del trunc[0]
        else:
            trunc.pop()


# --------------------------------------------------------------------------------------------------
# Masked LM
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MaskingTables:
    """What masking needs to know about the vocabulary."""

    mask_id: int
    replacement_ids: np.ndarray  # ids a "random token" is drawn from: all but the special tokens
    is_continuation: np.ndarray  # bool per id: the token starts with "##"

    @classmethod
    def from_vocab(cls, tokens: Sequence[str]) -> MaskingTables:
        specials = set(SPECIAL_TOKENS.values())
        ids = np.array([i for i, t in enumerate(tokens) if t not in specials], dtype=np.int64)
        cont = np.array([t.startswith("##") for t in tokens], dtype=bool)
        return cls(tokens.index("[MASK]"), ids, cont)


def mask_tokens(
    input_ids: np.ndarray,
    type_start: int,
    tables: MaskingTables,
    *,
    masked_lm_prob: float,
    max_predictions: int,
    whole_word: bool,
    rng: np.random.Generator,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Mask one ``[CLS] A [SEP] B [SEP]`` sequence; return (masked ids, sorted positions, original ids there)."""
    n = len(input_ids)
    special = np.zeros(n, dtype=bool)
    special[[0, type_start - 1, n - 1]] = True
    candidates = np.flatnonzero(~special)
    budget = min(max_predictions, max(1, int(round(n * masked_lm_prob))), len(candidates))
    if whole_word:
        starts = ~tables.is_continuation[input_ids[candidates]] | special[candidates - 1]
        word_starts = np.flatnonzero(starts)
        word_lengths = np.diff(np.append(word_starts, len(candidates))).tolist()
        chosen, count = [], 0
        for w in rng.permutation(len(word_starts)).tolist():
            if count >= budget:
                break
            if count + word_lengths[w] > budget:
                continue
            chosen.append(w)
            count += word_lengths[w]
        picked = [candidates[word_starts[w] : word_starts[w] + word_lengths[w]] for w in chosen]
        positions = np.sort(np.concatenate(picked)) if picked else np.zeros(0, dtype=np.int64)
    else:
        positions = np.sort(rng.choice(candidates, size=budget, replace=False))
    labels = input_ids[positions]
    masked = np.array(input_ids, copy=True)
    # Section 3.1 / appendix A.1: 80% [MASK], 10% a random token, 10% unchanged.
    u = rng.random(len(positions))
    masked[positions[u < 0.8]] = tables.mask_id
    randomised = positions[u >= 0.9]
    draws = rng.integers(0, len(tables.replacement_ids), size=len(randomised))
    masked[randomised] = tables.replacement_ids[draws]
    return masked, positions, labels


# --------------------------------------------------------------------------------------------------
# The corpus -> shards pipeline
# --------------------------------------------------------------------------------------------------


def create_pretraining_data(
    input_files: Sequence[str | os.PathLike],
    tokenizer,
    output_dir: str | os.PathLike,
    *,
    max_seq_length: int = 128,
    max_predictions_per_seq: int = 20,
    masked_lm_prob: float = 0.15,
    short_seq_prob: float = 0.1,
    dupe_factor: int = 5,
    whole_word_mask: bool = False,
    nsp_negatives: str = "random",
    nearby_window: int = 8,
    masking: str = "static",
    input_format: str = "auto",
    errors: str = "strict",
    unit_bytes: int = 4 << 20,
    seed: int = 12345,
    num_workers: int = 2,
    progress: bool = True,
    overwrite: bool = False,
) -> dict:
    """Turn text files into pre-training instances in ``output_dir``; return the manifest plus timings.

    ``tokenizer`` is a :class:`bertkit.tokenization.BertTokenizer`. The other arguments are those of
    :class:`PretrainingConfig` (they decide the output bytes) and how to run: ``num_workers``
    processes (0 or 1: in this process), a tqdm bar unless ``progress=False``, and ``overwrite`` to
    replace an earlier run's shards in ``output_dir``. Read the result with :class:`PretrainingDataset`.
    """
    config = PretrainingConfig(
        max_seq_length=max_seq_length,
        max_predictions_per_seq=max_predictions_per_seq,
        masked_lm_prob=masked_lm_prob,
        short_seq_prob=short_seq_prob,
        dupe_factor=dupe_factor,
        whole_word_mask=whole_word_mask,
        nsp_negatives=nsp_negatives,
        nearby_window=nearby_window,
        masking=masking,
        input_format=input_format,
        errors=errors,
        unit_bytes=unit_bytes,
        seed=seed,
    )
    vocab = _vocab_list(tokenizer)
    missing = [t for t in SPECIAL_TOKENS.values() if t not in tokenizer.vocab]
    if missing:
        raise BertkitError(
            f"the tokenizer's vocabulary ({len(vocab)} entries) lacks the special tokens {missing}; "
            "BERT instances need [PAD] [UNK] [CLS] [SEP] [MASK] (vocabularies from "
            "bertkit.tokenization.trainer have them)"
        )
    if not input_files:
        raise BertkitError("no input files: pass at least one text file")
    units = plan_work_units(input_files, config.input_format, config.unit_bytes)
    if not units:
        raise BertkitError(f"the corpus is empty: all {len(input_files)} input file(s) have 0 bytes")

    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    if any(out.glob("shard-*.npy")) or (out / "manifest.json").exists():
        if not overwrite:
            raise BertkitError(f"{out} already holds pre-training shards; pass --overwrite (overwrite=True) or choose a new directory")
        remove_shards(out)
    vocab_text = "".join(t + "\n" for t in vocab)
    (out / VOCAB).write_text(vocab_text, encoding="utf-8")

    started = time.perf_counter()
    job = _Job(config, tokenizer, str(out))
    results = []
    try:
        bar = tqdm(total=sum(u.num_bytes for u in units), unit="B", unit_scale=True, desc="instances",
                   disable=not progress)
        with spawn_pool(num_workers, len(units), _init_worker, (job,)) as pool:
            stream = pool.imap(_run_unit, units) if pool else (job.run(u) for u in units)
            for unit, result in zip(units, stream, strict=True):
                results.append(result)
                bar.update(unit.num_bytes)
        bar.close()
        counts = {k: sum(r["counts"][k] for r in results) for k in results[0]["counts"]}
        if counts["documents"] == 0:
            raise BertkitError(
                f"no text found in the {len(input_files)} input file(s) after clean-up "
                f"(input_format={config.input_format!r}); see bertkit.data.text for what is kept"
            )
        if counts["multi_sentence_documents"] == 0:
            raise BertkitError(
                f"none of the {counts['documents']} documents has two or more sentences, so next-sentence "
                "pairs are impossible; with input_format='sentences' put one sentence per line and a "
                "blank line between documents"
            )
    except BaseException:
        remove_shards(out)
        raise
    seconds = time.perf_counter() - started

    manifest = {
        "format": FORMAT,
        "config": dataclasses.asdict(config),
        "input_files": [str(f) for f in input_files],
        "tokenizer": {
            "vocab_size": len(vocab),
            "vocab_sha256": sha256_file(out / VOCAB),
            "do_lower_case": getattr(tokenizer, "do_lower_case", None),
            "special_token_ids": {k: tokenizer.vocab[t] for k, t in SPECIAL_TOKENS.items()},
        },
        "token_dtype": _token_dtype(len(vocab)).__name__,
        "counts": counts,
        "shards": [r["shard"] for r in results],
    }
    write_manifest(out, manifest)
    return {
        **manifest,
        "output_dir": str(out),
        "seconds": seconds,
        "instances_per_second": counts["instances"] / seconds if seconds > 0 else float("inf"),
        "num_workers": num_workers,
    }


def _vocab_list(tokenizer) -> list[str]:
    vocab = [None] * len(tokenizer.vocab)
    for token, i in tokenizer.vocab.items():
        vocab[i] = token
    if any(t is None for t in vocab):
        raise BertkitError("the tokenizer's vocabulary ids are not 0..n-1 without gaps")
    return vocab


def _token_dtype(vocab_size: int) -> type:
    return np.uint16 if vocab_size <= 1 << 16 else np.int32


def _unit_seeds(seed: int, unit_index: int) -> tuple[int, np.random.Generator]:
    """Independent streams for pairs (``random.Random``) and masks (numpy) of one unit."""
    pair_seed = int(np.random.SeedSequence([seed, unit_index, 0]).generate_state(2, np.uint64)[0])
    return pair_seed, np.random.default_rng([seed, unit_index, 1])


class _Job:
    """The per-unit work, with what every worker needs (pickled once per worker)."""

    def __init__(self, config: PretrainingConfig, tokenizer, output_dir: str):
        self.config = config
        self.tokenizer = tokenizer
        self.output_dir = output_dir
        self.tables = MaskingTables.from_vocab(_vocab_list(tokenizer))
        self.token_dtype = _token_dtype(len(tokenizer.vocab))

    def tokenize(self, sentences: list[str]) -> list[list[int]]:
        """Ids of each sentence; sentences with no token (e.g. only control characters) are dropped."""
        ids = self.tokenizer(sentences, add_special_tokens=False)["input_ids"]
        return [s for s in ids if s]

    def run(self, unit: WorkUnit) -> dict:
        cfg = self.config
        documents: list[list[list[int]]] = []
        sentences = 0
        for part in unit.parts:
            for text in iter_documents(part.path, part.input_format, cfg.errors, part.start, part.end):
                doc = self.tokenize(text)
                if doc:
                    documents.append(doc)
                    sentences += len(doc)
        pair_seed, mask_rng = _unit_seeds(cfg.seed, unit.index)
        rng = random.Random(pair_seed)
        pairs: list[PairInstance] = []
        for _ in range(cfg.dupe_factor):
            for d in range(len(documents)):
                pairs.extend(create_instances_from_document(documents, d, cfg, rng))
        rng.shuffle(pairs)
        arrays = self._arrays(pairs, mask_rng)
        shard = {
            "name": shard_name(unit.index),
            "num_instances": len(pairs),
            "source": [[p.path, p.start, p.end] for p in unit.parts],
            "files": save_shard(self.output_dir, shard_name(unit.index), arrays),
        }
        counts = {
            "instances": len(pairs),
            "tokens": int(len(arrays["input_ids"])),
            "documents": len(documents),
            "multi_sentence_documents": sum(len(d) >= 2 for d in documents),
            "sentences": sentences,
            "random_next": sum(p.is_random_next for p in pairs),
            "nearby_fallbacks": sum(p.nearby_fallback for p in pairs),
            "masked_positions": int(len(arrays.get("masked_positions", ()))),
        }
        return {"shard": shard, "counts": counts}

    def _arrays(self, pairs: list[PairInstance], mask_rng: np.random.Generator) -> dict[str, np.ndarray]:
        cfg, tables, vocab = self.config, self.tables, self.tokenizer.vocab
        cls_id, sep_id = vocab["[CLS]"], vocab["[SEP]"]
        lengths = np.array([len(p.tokens_a) + len(p.tokens_b) + 3 for p in pairs], dtype=np.int64)
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        input_ids = np.empty(int(offsets[-1]), dtype=self.token_dtype)
        type_start = np.array([len(p.tokens_a) + 2 for p in pairs], dtype=np.int32)
        labels = np.array([int(p.is_random_next) for p in pairs], dtype=np.uint8)
        static = cfg.masking == "static"
        positions, targets, mask_counts = [], [], []
        for k, p in enumerate(pairs):
            ids = np.array([cls_id, *p.tokens_a, sep_id, *p.tokens_b, sep_id], dtype=np.int64)
            if static:
                ids, pos, lab = mask_tokens(
                    ids,
                    int(type_start[k]),
                    tables,
                    masked_lm_prob=cfg.masked_lm_prob,
                    max_predictions=cfg.max_predictions_per_seq,
                    whole_word=cfg.whole_word_mask,
                    rng=mask_rng,
                )
                positions.append(pos)
                targets.append(lab)
                mask_counts.append(len(pos))
            input_ids[offsets[k] : offsets[k + 1]] = ids
        arrays = {"input_ids": input_ids, "offsets": offsets, "type_start": type_start, "next_sentence_labels": labels}
        if static:
            arrays["masked_positions"] = np.concatenate(positions or [np.zeros(0)]).astype(np.int32)
            arrays["masked_offsets"] = np.concatenate([[0], np.cumsum(mask_counts, dtype=np.int64)]).astype(np.int64)
            arrays["masked_labels"] = np.concatenate(targets or [np.zeros(0)]).astype(self.token_dtype)
        return arrays


_WORKER_JOB: _Job | None = None


def _init_worker(job: _Job) -> None:
    global _WORKER_JOB
    _WORKER_JOB = job


def _run_unit(unit: WorkUnit) -> dict:
    assert _WORKER_JOB is not None, "worker not initialised"
    return _WORKER_JOB.run(unit)


# --------------------------------------------------------------------------------------------------
# Reading instances for training
# --------------------------------------------------------------------------------------------------


class PretrainingDataset:
    """Instances from a :func:`create_pretraining_data` directory, ready for ``BertForPreTraining``.

    ``dataset[i]`` is a dict of unpadded numpy ``int64`` arrays: ``input_ids``, ``token_type_ids``,
    ``attention_mask`` (ones), ``labels`` (the original id at masked-LM positions, ``-100``
    elsewhere) and a scalar ``next_sentence_label`` (0 = B follows A, 1 = B is random, as Hugging
    Face). Batch them with :func:`collate_pretraining`. Works as a ``torch.utils.data.Dataset``
    (``__len__``/``__getitem__``), memory-mapped, so DataLoader workers share the page cache.

    Static masking: the stored masks; ``epoch`` and ``seed`` are ignored. Dynamic masking: masks are
    drawn from ``numpy.random.default_rng([seed, epoch, index])`` on every access, so they are the same
    for the same (seed, epoch) and differ across epochs; ``seed=None`` uses the seed in the manifest.
    Call :meth:`set_epoch` at the start of each epoch (the training loop does).

        ds = PretrainingDataset("runs/pretrain-data", epoch=0)
        batch = collate_pretraining([ds[i] for i in range(32)], pad_id=0)
    """

    def __init__(self, data_dir: str | os.PathLike, epoch: int = 0, seed: int | None = None, verify: bool = False):
        self.path = Path(data_dir)
        self.store = ShardedInstances(self.path, verify=verify)
        self.manifest = self.store.manifest
        cfg = self.manifest["config"]
        self.max_seq_length: int = cfg["max_seq_length"]
        self.dynamic = cfg["masking"] == "dynamic"
        self.seed = cfg["seed"] if seed is None else seed
        self.epoch = epoch
        self._masking = dict(
            masked_lm_prob=cfg["masked_lm_prob"],
            max_predictions=cfg["max_predictions_per_seq"],
            whole_word=cfg["whole_word_mask"],
        )
        self.tables = MaskingTables.from_vocab(self.store.read_vocab()) if self.dynamic else None

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return len(self.store)

    def __getitem__(self, index: int) -> dict[str, np.ndarray]:
        raw = self.store[index]
        ids = raw.input_ids.astype(np.int64)
        if self.dynamic:
            rng = np.random.default_rng([self.seed, self.epoch, index % len(self)])
            ids, positions, targets = mask_tokens(ids, raw.type_start, self.tables, rng=rng, **self._masking)
        else:
            positions, targets = raw.masked_positions, raw.masked_labels
        labels = np.full(len(ids), IGNORE_INDEX, dtype=np.int64)
        labels[positions] = targets
        token_type_ids = np.zeros(len(ids), dtype=np.int64)
        token_type_ids[raw.type_start :] = 1
        return {
            "input_ids": ids,
            "token_type_ids": token_type_ids,
            "attention_mask": np.ones(len(ids), dtype=np.int64),
            "labels": labels,
            "next_sentence_label": np.int64(raw.next_sentence_label),
        }


def collate_pretraining(batch: Sequence[dict], pad_id: int = 0) -> dict:
    """Pad a list of :class:`PretrainingDataset` items to the longest; return ``torch.long`` tensors.

    ``input_ids`` pad with ``pad_id``, ``token_type_ids``/``attention_mask`` with 0, ``labels`` with
    -100; ``next_sentence_label`` has shape ``(B,)``.
    """
    import torch  # here, so that data-creation workers never pay for importing torch

    if not batch:
        raise BertkitError("collate_pretraining got an empty batch")
    width = max(len(item["input_ids"]) for item in batch)
    pads = {"input_ids": pad_id, "token_type_ids": 0, "attention_mask": 0, "labels": IGNORE_INDEX}
    out = {}
    for key, value in pads.items():
        tensor = torch.full((len(batch), width), value, dtype=torch.long)  # (B, T)
        for row, item in enumerate(batch):
            tensor[row, : len(item[key])] = torch.as_tensor(item[key])
        out[key] = tensor
    out["next_sentence_label"] = torch.tensor([int(item["next_sentence_label"]) for item in batch], dtype=torch.long)
    return out
