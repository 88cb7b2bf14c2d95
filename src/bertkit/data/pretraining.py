"""Pre-training data: documents -> next-sentence pairs -> masked-LM instances (BERT paper, section 3.1).

google-research/bert ``create_pretraining_data.py`` (the reference), streamed and parallel; the full
description, with the exact meaning of every option, is docs/pretraining-data.md.

* **Work units** (:func:`~bertkit.data.text.plan_work_units`): the corpus, in file order, in pieces of
  about ``unit_bytes`` (>= 2 files). One worker reads, tokenises, pairs and masks a unit with seeds
  derived from ``(seed, unit index)`` and writes it as one shard: output bytes never depend on
  ``num_workers``, and memory per worker is bounded by a unit, never by the corpus.
* **Pairs** (:func:`create_instances_from_document`): the reference's chunking, A/B split, put-back of
  unused sentences and ``truncate_seq_pair``. Negatives come from another document of the same unit
  (the reference holds the whole corpus in memory).
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
import logging
import os
import random
import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from bertkit._parallel import spawn_pool
from bertkit.data.config import PretrainingConfig
from bertkit.data.masking import MaskingTables, mask_tokens
from bertkit.data.pairs import PairInstance, create_instances_from_document
from bertkit.data.shards import (
    FORMAT,
    MANIFEST,
    VOCAB,
    remove_shards,
    save_shard,
    shard_name,
    write_manifest,
)
from bertkit.data.text import WorkUnit, iter_documents, plan_work_units
from bertkit.errors import BertkitError, MissingFileError, read_json_object
from bertkit.outputs import (
    atomic_target,
    atomic_write_text,
    claims_for_workers,
    join_claims,
    owns,
    register,
    sha256_of,
)
from bertkit.tokenization.wordpiece import SPECIAL_TOKENS as BERT_SPECIAL_TOKENS

logger = logging.getLogger(__name__)
SPECIAL_TOKENS = dict(zip(("pad", "unk", "cls", "sep", "mask"), BERT_SPECIAL_TOKENS))  # by role, for the manifest


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
    num_shards: int = 1,
    shard_index: int = 0,
    **config_fields: Any,
) -> dict:
    """Turn text files into pre-training instances in ``output_dir``; return the manifest plus timings.

    ``tokenizer`` is a :class:`bertkit.tokenization.BertTokenizer`. ``config_fields`` are the fields of
    :class:`PretrainingConfig` (they decide the output bytes; ``max_seq_length=512``, ``dupe_factor=10``, ...);
    the other arguments say how to run: ``num_workers`` processes (0 or 1: in this process), a tqdm bar unless
    ``progress=False``, and ``overwrite`` to replace an earlier run's shards in ``output_dir``. Read the result
    with :class:`PretrainingDataset`.

    Corpus scale: ``num_shards`` K > 1 makes only part ``shard_index`` of the work (every K-th work unit,
    so the parts are about equal), for K processes or machines that share nothing but the input files.
    ``output_dir`` then receives that part's shards and ``part.json`` instead of ``manifest.json``;
    :func:`merge_pretraining_data` joins the K parts into one directory whose bytes equal a single run's.
    """
    config = PretrainingConfig(**config_fields)
    vocab = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer.vocab))))
    _check_arguments(tokenizer, vocab, input_files, num_shards, shard_index)
    all_units = plan_work_units(input_files, config.input_format, config.unit_bytes)
    units = all_units[shard_index::num_shards]  # the plan is the same in every part: it depends on the files only
    out = _fresh_output_dir(Path(output_dir), vocab, overwrite)

    started = time.perf_counter()
    # a part may hold none of the corpus's documents: its counts are checked when the parts are merged
    shards, counts = _make_shards(_Job(config, tokenizer, str(out)), units, num_workers, progress,
                                  num_files=len(input_files) if num_shards == 1 else None)
    atomic_write_text(out / VOCAB, "".join(t + "\n" for t in vocab))  # only now: a refused corpus leaves nothing
    seconds = time.perf_counter() - started
    manifest = _manifest(config, input_files, tokenizer, vocab, out, counts, shards)
    if num_shards > 1:
        manifest["part"] = {"index": shard_index, "count": num_shards, "units": len(all_units)}
    write_manifest(out, manifest, PART if num_shards > 1 else MANIFEST)  # merge_pretraining_data joins parts
    rate = counts["instances"] / seconds if seconds > 0 else float("inf")
    return {**manifest, "output_dir": str(out), "seconds": seconds, "instances_per_second": rate,
            "num_workers": num_workers}


def _check_arguments(tokenizer, vocab: list[str], input_files: Sequence, num_shards: int, shard_index: int) -> None:
    missing = [t for t in SPECIAL_TOKENS.values() if t not in tokenizer.vocab]
    if missing:
        raise BertkitError(
            f"the tokenizer's vocabulary ({len(vocab)} entries) lacks the special tokens {missing}; "
            "BERT instances need [PAD] [UNK] [CLS] [SEP] [MASK] (vocabularies from "
            "bertkit.tokenization.trainer have them)"
        )
    if not input_files:
        raise BertkitError("no input files: pass at least one text file")
    if num_shards < 1 or not 0 <= shard_index < num_shards:
        raise BertkitError(f"shard_index {shard_index} must be in [0, num_shards {num_shards}) and num_shards >= 1")


def _fresh_output_dir(out: Path, vocab: list[str], overwrite: bool) -> Path:
    """``out`` without an earlier run's shards (refused unless ``overwrite``), ready for this run's vocabulary
    (written once the shards are made).

    ``overwrite`` removes only the shards bertkit can prove it wrote (``remove_shards``); a vocab.txt there is
    replaced only if bertkit wrote it, or it already holds this vocabulary."""
    out.mkdir(parents=True, exist_ok=True)
    if any(out.glob("shard-*.npy")) or (out / "manifest.json").exists() or (out / PART).exists():
        if not overwrite:
            raise BertkitError(f"{out} already holds pre-training shards; pass --overwrite (overwrite=True) or choose a new directory")
        left = remove_shards(out, (MANIFEST, PART), earlier_runs=True)  # --overwrite: the user asked
        if left:
            raise BertkitError(f"{out} holds {len(left)} pre-training file(s) bertkit cannot prove it wrote (e.g. "
                               f"{', '.join(left[:3])}: not recorded, or changed since); bertkit leaves them alone: "
                               "move them or choose a new directory")
    text = "".join(t + "\n" for t in vocab)
    existing = out / VOCAB
    if (existing.is_symlink() or existing.exists()) and not owns(existing) and not (
            existing.is_file() and existing.read_bytes() == text.encode("utf-8")):
        raise BertkitError(f"{existing} is not a vocabulary bertkit wrote for this run; bertkit does not replace it: "
                           "choose a new directory")
    return out


def _make_shards(job: _Job, units: list[WorkUnit], num_workers: int, progress: bool, *,
                 num_files: int | None) -> tuple[list[dict], dict]:
    """Each unit's shard record, in unit order whichever worker made it, and the counts summed over the units,
    checked for a corpus of ``num_files`` files (None: not checked). On any failure the shards made so far are
    removed: a directory never keeps an incomplete set."""
    out, results = Path(job.output_dir), []
    try:
        bar = tqdm(total=sum(u.num_bytes for u in units), unit="B", unit_scale=True, desc="instances",
                   disable=not progress)
        with spawn_pool(num_workers, len(units), _init_worker, (job,)) as pool:
            stream = pool.imap(_run_unit, units) if pool else (job.run(u) for u in units)
            for unit, result in zip(units, stream, strict=True):
                for entry in result["shard"]["files"].values():  # a worker wrote it: record it as this run's
                    register(out / entry["file"], entry["sha256"])
                results.append(result)
                bar.update(unit.num_bytes)
        bar.close()
        counts = {k: sum(r["counts"][k] for r in results) for k in COUNTS}
        if num_files is not None:
            _check_counts(counts, num_files, job.config.input_format)
    except BaseException:
        left = remove_shards(out, (MANIFEST, PART))  # only what this run (or its workers) wrote
        if left:
            logger.warning("%s: left %d shard file(s) in place that this run cannot prove it wrote (e.g. %s)",
                           out, len(left), ", ".join(left[:3]))
        raise
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
            "special_token_ids": {k: tokenizer.vocab[t] for k, t in SPECIAL_TOKENS.items()},
        },
        "token_dtype": _token_dtype(len(vocab)).__name__,
        "counts": counts,
        "shards": shards,
    }


COUNTS = ("instances", "tokens", "documents", "multi_sentence_documents", "sentences", "random_next",
          "masked_positions")
PART = "part.json"  # one part's manifest (num_shards > 1), until merge_pretraining_data joins the parts


def _check_counts(counts: dict, num_files: int, input_format: str) -> None:
    if counts["documents"] == 0:
        raise BertkitError(
            f"no text found in the {num_files} input file(s) after clean-up "
            f"(input_format={input_format!r}); see bertkit.data.text for what is kept"
        )
    if counts["multi_sentence_documents"] == 0:
        raise BertkitError(
            f"none of the {counts['documents']} documents has two or more sentences, so next-sentence "
            "pairs are impossible; with input_format='sentences' put one sentence per line and a "
            "blank line between documents"
        )


def merge_pretraining_data(part_dirs: Sequence[str | os.PathLike], output_dir: str | os.PathLike) -> dict:
    """Join the K parts of a ``num_shards=K`` creation into ``output_dir``: its files are byte for byte those
    of one run over the whole corpus (each work unit has its own seed, so who made it does not matter).

    Shards are hard-linked into ``output_dir`` where the filesystem allows (no copy, no extra space), else
    copied; the part directories are left as they are (bertkit never deletes what it did not make here).
    """
    parts = [(Path(d), _read_part(Path(d))) for d in part_dirs]
    if not parts:
        raise BertkitError("no parts to merge: pass the K part directories")
    count = parts[0][1]["part"]["count"]
    same = ("format", "config", "input_files", "tokenizer", "token_dtype")
    for d, part in parts:
        diff = [k for k in same if part.get(k) != parts[0][1].get(k)] + (
            ["num_shards"] if part["part"]["count"] != count else [])
        if diff:
            raise BertkitError(f"{d} was made with other {', '.join(diff)} than {parts[0][0]}: parts of one "
                               "corpus share the input files, tokenizer and every data setting")
    indices = sorted(part["part"]["index"] for _, part in parts)
    if indices != list(range(count)):
        missing = sorted(set(range(count)) - set(indices))
        extra = sorted({i for i in indices if indices.count(i) > 1})
        raise BertkitError(f"the parts of a {count}-way split are 0..{count - 1}; missing {missing}, "
                           f"given twice {extra}: pass each part directory once")
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    if (out / MANIFEST).exists() or any(out.glob("shard-*.npy")):
        raise BertkitError(f"{out} already holds pre-training data; merge into a new directory")
    shards = sorted(((d, shard) for d, part in parts for shard in part["shards"]), key=lambda x: x[1]["name"])
    if len(shards) != parts[0][1]["part"]["units"]:
        raise BertkitError(f"the parts hold {len(shards)} shards but the corpus has {parts[0][1]['part']['units']} "
                           "work units: a part is incomplete; make it again")
    # Every file checked against its part's record before anything is linked: parts are made on other machines
    # and copied here, and a truncated or missing shard must stop the merge, not a pre-training run days later.
    for d, shard in shards:
        for entry in shard["files"].values():
            name = entry["file"]
            if not isinstance(name, str) or "/" in name or "\x00" in name or name in ("", ".", ".."):
                raise BertkitError(f"{d / PART} names the shard file {name!r}, which is not a file name inside the "
                                   "part: this part.json was not written by bertkit; make the part again")
            if os.path.lexists(out / name):
                raise BertkitError(f"{out / name} already exists; bertkit never replaces a file it did not create: "
                                   "merge into a new directory")
            src = d / name
            if not src.is_file():
                raise MissingFileError(f"{src} is listed in {d / PART} but missing: copy the part again")
            if sha256_of(src) != entry["sha256"]:
                raise BertkitError(f"{src}: its sha256 differs from {d / PART} (truncated or changed in the copy): "
                                   "copy the part again")
    for d, shard in shards:
        for entry in shard["files"].values():
            _link_or_copy(d / entry["file"], out / entry["file"], entry["sha256"])
    _link_or_copy(parts[0][0] / VOCAB, out / VOCAB)
    counts = {k: sum(part["counts"][k] for _, part in parts) for k in COUNTS}
    _check_counts(counts, len(parts[0][1]["input_files"]), parts[0][1]["config"]["input_format"])
    manifest = {k: parts[0][1][k] for k in same}
    manifest.update(counts=counts, shards=[shard for _, shard in shards])
    write_manifest(out, manifest)
    return {**manifest, "output_dir": str(out), "parts": [str(d) for d, _ in parts]}


def _link_or_copy(src: Path, dst: Path, sha256: str | None = None) -> None:
    """``src`` hard-linked at ``dst`` where the filesystem allows, else copied (atomically); never over an
    existing file; recorded as this run's."""
    if os.path.lexists(dst):
        raise BertkitError(f"{dst} already exists; bertkit never replaces a file it did not create: merge into a "
                           "new directory")
    try:
        os.link(src, dst)
    except FileExistsError:
        raise BertkitError(f"{dst} appeared while merging; merge into a new directory") from None
    except OSError:
        with atomic_target(dst) as tmp:
            shutil.copyfile(src, tmp)
    register(dst, sha256)


_PART_KEYS = ("format", "config", "input_files", "tokenizer", "token_dtype", "part", "shards", "counts")


def _read_part(d: Path) -> dict:
    """A part directory's part.json, checked to hold what merging reads; any flaw names the file."""
    path = d / PART
    if not path.is_file():
        raise MissingFileError(f"{path} not found: {d} is not a part made with --num-shards/--shard-index "
                               "(or that run did not finish: run it again)")
    part = read_json_object(path, "make that part again")
    missing = [k for k in _PART_KEYS if k not in part]
    inner = part.get("part")
    if isinstance(inner, dict):
        missing += [f"part.{k}" for k in ("index", "count", "units") if k not in inner]
    elif "part" in part:
        missing.append("part.index")
    counts = part.get("counts")
    missing += [f"counts.{k}" for k in COUNTS if not isinstance(counts, dict) or k not in counts] if "counts" in part else []
    shards = part.get("shards")
    if not missing and not (isinstance(shards, list) and all(
            isinstance(x, dict) and "name" in x and isinstance(x.get("files"), dict)
            and all(isinstance(e, dict) and {"file", "sha256"} <= set(e) for e in x["files"].values())
            for x in shards)):
        missing.append("shards[].name/files/file/sha256")
    if missing:
        raise BertkitError(f"{path} lacks {', '.join(missing)}: it was not written by create-pretraining-data "
                           "--num-shards (or was edited); make that part again")
    return part


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
        self.tables = MaskingTables.from_vocab(tokenizer.convert_ids_to_tokens(list(range(len(tokenizer.vocab)))))
        self.token_dtype = _token_dtype(len(tokenizer.vocab))
        self.claims = claims_for_workers()  # workers record their shards in the claimed directory as they write

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
    join_claims(job.claims)


def _run_unit(unit: WorkUnit) -> dict:
    assert _WORKER_JOB is not None, "worker not initialised"
    return _WORKER_JOB.run(unit)


