"""Pre-training data: documents -> next-sentence pairs -> masked-LM instances (BERT paper, section 3.1).

google-research/bert ``create_pretraining_data.py`` (the reference), streamed and parallel: each work unit
(:func:`~bertkit.data.text.plan_work_units`) is read, tokenised, paired and masked by one worker with seeds
derived from ``(seed, unit index)`` and written as one shard, so output bytes never depend on ``num_workers``.
A run cut short keeps the shards of its finished units, each proven by a record written after it
(``bertkit.data.unit_records``): ``resume=True`` makes only the others. docs/pretraining-data.md gives every
option and the deliberate differences from the reference.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import random
import re
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bertkit import runs
from bertkit._parallel import refuse_in_a_starting_worker, spawn_pool
from bertkit.data import unit_records
from bertkit.data.config import PretrainingConfig
from bertkit.data.masking import MaskingTables, mask_tokens, targets_asked
from bertkit.data.pairs import PairInstance, create_instances_from_document
from bertkit.data.shards import (
    FORMAT,
    VOCAB,
    save_shard,
    shard_name,
    write_manifest,
)
from bertkit.data.text import WorkUnit, iter_documents, plan_work_units
from bertkit.errors import BertkitError, InputError
from bertkit.manifests import sha256_of
from bertkit.outputs import atomic_write_text
from bertkit.progress import progress_bar
from bertkit.tokenization.textfiles import expand_input_files

logger = logging.getLogger(__name__)
COMMAND = "create-pretraining-data"
SPECIAL_ROLES = ("pad", "unk", "cls", "sep", "mask")  # the manifest records each one's id


# --------------------------------------------------------------------------------------------------
# The corpus -> shards pipeline
# --------------------------------------------------------------------------------------------------


def create_pretraining_data(
    input_files: Sequence[str | os.PathLike],
    tokenizer,
    output_dir: str | os.PathLike,
    *,
    num_workers: int = 2,
    progress: bool = True,
    overwrite: bool = False,
    resume: bool = False,
    **config_fields: Any,
) -> dict:
    """Turn text files into pre-training instances in ``output_dir``; return the manifest plus timings.

    ``tokenizer`` is a :class:`bertkit.tokenization.BertTokenizer`. ``config_fields`` are the fields of
    :class:`PretrainingConfig` (they decide the output bytes; ``max_seq_length=512``, ``dupe_factor=10``, ...);
    the other arguments say how to run: ``num_workers`` processes (0 or 1: in this process), a tqdm bar unless
    ``progress=False``, and ``overwrite`` to replace an earlier run in ``output_dir`` (``bertkit.runs``: only the
    files its manifest proves bertkit's, once this one is complete). The directory is written beside
    ``output_dir`` and moved into place whole: a failure or a kill leaves no partial set of shards there. A run cut
    short (a kill, Ctrl-C, a full disk) keeps its finished units' shards in that staging directory: ``resume=True``
    continues it, making only the units not finished, the output the bytes an uninterrupted run writes; it is
    refused when the settings, the input files (their sizes and modification times), the tokenizer or the plan of
    work units differ from the run it continues. Read the result with :class:`PretrainingDataset`.
    """
    refuse_in_a_starting_worker()  # a worker re-running a script without a main guard: named, not its parent's lock
    if resume and overwrite:  # either winning quietly would do what one of them did not ask
        raise BertkitError("resume and overwrite are both set: resume (--resume) continues the run cut short in "
                           f"{output_dir}, overwrite (--overwrite) starts it again; choose one")
    config = PretrainingConfig(**config_fields)
    _warn_capped_predictions(config)
    vocab = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer.vocab))))
    if not input_files:
        raise BertkitError("no input files: pass at least one text file")
    input_files = expand_input_files(input_files, "its documents would be read twice, and a random-next segment "
                                     "drawn from the copy would be the true next text; pass each file once "
                                     "(--dupe-factor makes more instances of every document)")
    units = plan_work_units(input_files, config.input_format, config.unit_bytes)
    plan = unit_records.run_plan(dataclasses.asdict(config), input_files, _tokenizer_record(tokenizer, vocab), units)

    started = time.perf_counter()
    with runs.output_dir(output_dir, COMMAND, dataclasses.asdict(config), overwrite=overwrite,
                         resume=resume) as claim:
        out = claim.path
        done = unit_records.start(out, plan, units, output_dir, COMMAND, resume)
        shards, counts = _make_shards(_Job(config, tokenizer, str(out)), units, done, num_workers, progress,
                                      num_files=len(input_files))
        atomic_write_text(out / VOCAB, "".join(t + "\n" for t in vocab))
        manifest = _manifest(config, input_files, tokenizer, vocab, out, counts, shards)
        unit_records.finish(out)  # the manifest holds every record's content now
        write_manifest(out, manifest)
    seconds = time.perf_counter() - started
    rate = counts["instances"] / seconds if seconds > 0 else float("inf")
    return {**manifest, "output_dir": str(output_dir), "seconds": seconds, "instances_per_second": rate,
            "num_workers": num_workers}


def _make_shards(job: _Job, units: list[WorkUnit], done: dict[int, dict], num_workers: int, progress: bool, *,
                 num_files: int) -> tuple[list[dict], dict]:
    """Each unit's shard record, in unit order whichever worker made it (or the finished run it continues: ``done``,
    by unit index), and the counts summed over the units, checked for a corpus of ``num_files`` files."""
    todo = [u for u in units if u.index not in done]
    results = dict(done)
    bar = progress_bar(total=sum(u.num_bytes for u in units), unit="B", unit_scale=True, desc="instances",
                       enabled=progress)
    bar.update(sum(u.num_bytes for u in units if u.index in done))
    with spawn_pool(num_workers, len(todo), _init_worker, (job,)) as pool:
        stream = pool.imap(_run_unit, todo) if pool else (job.run(u) for u in todo)
        for unit, result in zip(todo, stream, strict=True):
            results[unit.index] = result
            bar.update(unit.num_bytes)
    bar.close()
    results = [results[u.index] for u in units]
    counts = {k: sum(r["counts"][k] for r in results) for k in COUNTS}
    _check_counts(counts, num_files, job.config.input_format)
    _warn_same_document_negatives(counts)
    return [r["shard"] for r in results], counts


def _manifest(config: PretrainingConfig, input_files: Sequence, tokenizer, vocab: list[str], out: Path,
              counts: dict, shards: list[dict]) -> dict:
    return {
        "format": FORMAT,
        "config": dataclasses.asdict(config),
        "input_files": [str(f) for f in input_files],
        "tokenizer": {
            "vocab_size": len(vocab),
            "vocab_sha256": sha256_of(out / VOCAB),
            "do_lower_case": getattr(tokenizer, "do_lower_case", None),
            "special_token_ids": _special_ids(tokenizer),
        },
        "token_dtype": _token_dtype(len(vocab)).__name__,
        "counts": counts,
        "shards": shards,
    }


COUNTS = ("instances", "tokens", "documents", "multi_sentence_documents", "sentences", "random_next",
          "random_next_same_document", "masked_positions")


def _check_counts(counts: dict, num_files: int, input_format: str) -> None:
    if counts["documents"] == 0:
        raise InputError(
            f"no text found in the {num_files} input file(s) after clean-up "
            f"(input_format={input_format!r}); see bertkit.data.text for what is kept"
        )
    if counts["multi_sentence_documents"] == 0:
        raise InputError(
            f"none of the {counts['documents']} documents has two or more sentences, so next-sentence "
            "pairs are impossible; with input_format='sentences' put one sentence per line and a "
            "blank line between documents"
        )


def _warn_same_document_negatives(counts: dict) -> None:
    """A work unit of one document draws its "random next" segments from that document (google's fallback after ten
    draws), weak negatives for next-sentence prediction: said, with the count, rather than done silently."""
    same, total = counts["random_next_same_document"], counts["random_next"]
    if total and same > 0.01 * total:
        logger.warning(
            "%d of the %d random-next segments come from the document of their first segment: a work unit held one "
            "document (a file read as one document: a book in prose, or lines with no blank line between documents, "
            "such as one article per line). Give several files, or mark documents with blank lines "
            "(--input-format sentences: one sentence per line), or pre-train without NSP (pretrain --no-nsp)",
            same, total)


def _warn_capped_predictions(config: PretrainingConfig) -> None:
    """A ``max_predictions_per_seq`` below the targets ``masked_lm_prob`` gives a full-length instance masks fewer
    tokens than asked (the default 20 at ``max_seq_length`` 512: 3.9% where 0.15 asks 77): said, with the fix, as google's
    README says it (its script, with the same default, says nothing)."""
    asked = targets_asked(config.max_seq_length, config.masked_lm_prob)  # at full length
    if config.max_predictions_per_seq < asked:
        logger.warning(
            "max_predictions_per_seq %d caps the masked-LM targets of a %d-token instance at %d (%.1f%% of its tokens), "
            "below the %d masked_lm_prob %g asks for: pass --max-predictions-per-seq %d (max_seq_length x "
            "masked_lm_prob, as google's README says; its 512-token data has 80), or keep it to mask fewer",
            config.max_predictions_per_seq, config.max_seq_length, config.max_predictions_per_seq,
            100 * config.max_predictions_per_seq / config.max_seq_length, asked, config.masked_lm_prob, asked)


def _tokenizer_record(tokenizer, vocab: list[str]) -> dict:
    """What of the tokenizer decides the shards' ids: a resumed run must tokenise as the run it continues."""
    return {
        "vocab_size": len(vocab),
        "vocab_sha256": hashlib.sha256("".join(t + "\n" for t in vocab).encode("utf-8")).hexdigest(),  # vocab.txt's
        **{name: getattr(tokenizer, name, None) for name in ("do_lower_case", "strip_accents", "tokenize_chinese_chars")},
        "special_token_ids": _special_ids(tokenizer),
        "unlisted_special_tokens": list(getattr(tokenizer, "unlisted_special_tokens", ())),
        # a word longer than this is one [UNK] (transformers' 100; google's tokenization.py reads up to 200); recorded
        # where it is not 100, so that a run started before it was recorded still resumes
        **({} if (chars := getattr(tokenizer, "max_input_chars_per_word", 100)) == 100
           else {"max_input_chars_per_word": chars}),
    }


def _special_ids(tokenizer) -> dict[str, int]:
    return {role: getattr(tokenizer, f"{role}_token_id") for role in SPECIAL_ROLES}


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
        self.special_ids = _special_ids(tokenizer)
        self.tables = MaskingTables.from_vocab(tokenizer.convert_ids_to_tokens(list(range(len(tokenizer.vocab)))),
                                               self.special_ids)
        self.token_dtype = _token_dtype(len(tokenizer.vocab))
        special = [*tokenizer.all_special_tokens, *getattr(tokenizer, "unlisted_special_tokens", ())]  # all it cuts out
        written = [re.escape(t) for t in special if len(t) > 1]
        self.special_text = re.compile("|".join(written) or "(?!)")  # (?!) matches nothing

    def tokenize(self, sentences: list[str]) -> list[list[int]]:
        """Ids of each sentence; sentences with no token (e.g. only control characters) are dropped.

        A special token written in the text ("[SEP]") is text, as google's tokenizer reads it ("[", "sep", "]"): a NUL
        after its first character keeps the tokenizer from matching it, and its clean-up drops the NUL. So special ids
        stand only where an instance's layout puts them, and are never masked-LM targets."""
        sentences = [self.special_text.sub(lambda m: m[0][0] + "\0" + m[0][1:], s) for s in sentences]
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
            "random_next_same_document": sum(p.is_random_next and p.b_span[0] == p.a_span[0] for p in pairs),
            "masked_positions": int(len(arrays.get("masked_positions", ()))),
        }
        result = {"shard": shard, "counts": counts}
        unit_records.record(self.output_dir, unit.index, result)  # after its files: a record proves them written
        return result

    def _arrays(self, pairs: list[PairInstance], mask_rng: np.random.Generator) -> dict[str, np.ndarray]:
        cfg, tables = self.config, self.tables
        cls_id, sep_id = self.special_ids["cls"], self.special_ids["sep"]
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


