"""The feature-based approach (paper section 5.3): frozen per-layer activations, out to disk or into a tagger.

``extract_features`` is google-research/bert's ``extract_features.py``: which texts, tokens and layers, computed
how; ``feature_files`` writes them and reads them back. docs/token-tasks.md ("bertkit extract-features") gives the
formats and where they differ from google's. The paper's Table 7 study is ``training/feature_study.py``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import sys
import time
from array import array
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from bertkit.errors import BertkitError, MissingFileError, file_to_write, is_whole
from bertkit.feature_files import (
    existing_output,
    is_feature_shard,
    read_features,
    resume_point,
    safetensors_meta,
    shard_paths,
    shard_plan,
    write_jsonl,
    write_safetensors,
)
from bertkit.inference import runner
from bertkit.inference.runner import plan_batches
from bertkit.modeling import BertModel
from bertkit.padding import pad_batch
from bertkit.partial_output import PartialOutput, file_identity, model_identity
from bertkit.runs import refuse_existing_file

# The defaults of a direct call (the command passes its settings'): google-research/bert's extract_features.py.
LAST_FOUR_LAYERS = (-1, -2, -3, -4)
MAX_SEQ_LENGTH = 128
BATCH_SIZE = 32

logger = logging.getLogger("bertkit")

_PAIR = re.compile(r"^(.*) \|\|\| (.*)$")
_PAD = {"input_ids": 0, "token_type_ids": 0}


def read_texts(path: str | os.PathLike) -> list[tuple[str, str | None]]:
    """One example per line (blank lines included, as google's reader): ``text`` or ``text_a ||| text_b``."""
    path = Path(path)
    if path.is_dir():
        raise BertkitError(f"{path} is a directory; pass the file of inputs")
    if not path.is_file():
        raise MissingFileError(f"input file not found: {path}")
    from bertkit.tasks.files import read_lines  # line by line: a NUL byte, bad UTF-8 or a 1 GB line is named
    from bertkit.tokenization.textfiles import refuse_record_file

    refuse_record_file(path, "input file", "one text (or text_a ||| text_b) per line")  # not braces and headers

    out: list[tuple[str, str | None]] = []
    for _, line in read_lines(path):
        line = line.strip()
        m = _PAIR.match(line)
        out.append((m.group(1), m.group(2)) if m else (line, None))
    return out


def layer_indices(layers: Sequence[int]) -> list[int]:
    """``layers`` as a list of ints, or an error naming the fix: a string (google's ``--layers`` flag), a bare
    int, or a float or bool among them (``True`` would be written into the .jsonl as ``"index":True``)."""
    if isinstance(layers, (str, bytes, int, np.integer)):
        raise BertkitError(f"layers={layers!r}: give a list of layer indices, e.g. layers=[-1, -2] (google's "
                           "--layers string '-1,-2' is [int(x) for x in s.split(',')])")
    layers = list(layers)  # a generator is read once
    bad = next((k for k, i in enumerate(layers) if not is_whole(i, -sys.maxsize)), None)
    if bad is not None:
        raise BertkitError(f"layer {layers[bad]!r} in layers={layers!r} is not an integer index; give ints, e.g. "
                           "[-1, -2]")
    return [int(i) for i in layers]


def resolve_layers(layers: Sequence[int], num_states: int) -> list[int]:
    """Layer indices (negative ones from the end) -> positions in the L + 1 hidden states."""
    layers = layer_indices(layers)
    if not layers:
        raise BertkitError("layers: give at least one layer index (e.g. layers=[-1], --layers=-1)")
    # a repeated index would be one tensor (one key per index) where the metadata and the report list two
    twice = next((i for k, i in enumerate(layers) if i in layers[:k]), None)
    if twice is not None:
        raise BertkitError(f"layer {twice} is given twice in {list(layers)}; give each index once")
    resolved = []
    for i in layers:
        if not -num_states <= i < num_states:
            raise BertkitError(f"layer {i} does not exist: this model has {num_states} hidden states "
                             f"(0 = embeddings .. {num_states - 1} = last layer; -1 .. -{num_states} from the end)")
        if i % num_states in resolved:  # -1 and L: the same state written twice, under two names
            other = layers[resolved.index(i % num_states)]
            raise BertkitError(f"layers {other} and {i} in {list(layers)} are the same hidden state of this model "
                               f"({num_states - 1} layers: {i % num_states - num_states} = {i % num_states}); "
                               "give each layer once")
        resolved.append(i % num_states)
    return resolved


@dataclass(frozen=True)
class TextForm:
    """How a directory's model sees its texts, as sentence-transformers' ``encode`` feeds them to the encoder: the
    ``prompt`` put before each text (before ``text_a`` of a pair), whether they are ``lowercase``d first
    (sentence_bert_config.json's do_lower_case), and ``max_seq_length``, the tokens they are cut at (None: the
    directory declares none; a plain checkpoint). ``encoder_dir`` holds config.json, the weights and the tokenizer;
    ``source`` names where the length is declared, for messages."""

    encoder_dir: Path
    prompt: str = ""
    lowercase: bool = False
    max_seq_length: int | None = None
    source: str = ""


def text_form(model_dir: str | os.PathLike, prompt_name: str | None = None) -> TextForm:
    """The ``TextForm`` of ``model_dir``: a plain checkpoint's texts are given as they are; a sentence-transformers
    directory's (an embedder, a cross-encoder, a sparse encoder) are given its prompt (``prompt_name``'s, else the
    default prompt), its do_lower_case and its max_seq_length, so that the states written are those of the tokens
    its model sees. A directory whose texts reach different modules by kind (an inference-free sparse encoder's
    Router) is refused, naming the modules.

    ``model_dir`` may be a Hub id (its snapshot, sentence-transformers' files with it: ``bertkit.hub``), or the
    Transformer folder of an older sentence-transformers layout (``st/0_Transformer``, which ``BertModel`` loads):
    that is read as the directory holding it, whose model it is part of."""
    from bertkit.hub import (
        MODULES,
        SBERT_CONFIG,
        ST_CONFIG,
        encoder_path,
        may_lack_sentence_files,
        module_types,
        read_json,
        read_modules,
        resolve_directory,
    )
    from bertkit.inference.embedding import prompt_named, sentence_directory
    from bertkit.sentence.directory import cross_encoder_max_seq_length, transformer_max_seq_length
    from bertkit.sentence.sparse_encoder.modules import Transformer as FillMask

    path = resolve_directory(model_dir, "model directory")
    if may_lack_sentence_files(path):
        repo_id = path.parent.parent.name.removeprefix("models--").replace("--", "/")
        raise MissingFileError(f"{path} is huggingface_hub's cache of {repo_id} without a modules.json, and the cache "
                               "does not record whether the repo has one (transformers caches a sentence-transformers "
                               "repo's BERT files only), so its prompt, do_lower_case and max_seq_length are unknown: "
                               "load it once with the Hub reachable (bertkit then fetches the rest, or records that "
                               f"there is none), or `hf download {repo_id} --local-dir DIR` and pass DIR")
    modules = read_modules(path)
    if modules is None and path.name and encoder_path(read_modules(path.parent)) == path.name:
        # st/0_Transformer, the Transformer folder its parent's modules.json lists: the model of that directory
        return text_form(path.parent, prompt_name)
    types = module_types(modules) if modules is not None else []
    st_config = read_json(path / ST_CONFIG) or {}
    prompts = {k: v for k, v in (st_config.get("prompts") or {}).items() if isinstance(v, str)}
    if modules is None or types == ["Transformer"]:  # a plain checkpoint; a cross-encoder (one Transformer module)
        if prompt_name is not None:
            raise BertkitError(f"prompt_name {prompt_name!r}: {path} has no prompts (a plain checkpoint's or a "
                               "cross-encoder's directory); put the prompt before each text yourself")
        if modules is None:
            return TextForm(path)
        # refuses the file's do_lower_case and a default prompt, naming them: bertkit's CrossEncoder applies neither
        return TextForm(path, max_seq_length=cross_encoder_max_seq_length(path), source=str(path / SBERT_CONFIG))
    if types[:2] == ["Transformer", "Pooling"]:
        saved = sentence_directory(path)  # refuses a default_prompt_name that names no prompt
        prompt = prompt_named(saved.prompts, prompt_name) if prompt_name is not None else saved.default_prompt or ""
        return TextForm(saved.encoder_dir, prompt, saved.do_lower_case, saved.max_seq_length,
                        str(saved.encoder_dir / SBERT_CONFIG))
    if types[:1] in (["Transformer"], ["MLMTransformer"]) and types[1:] == ["SpladePooling"]:
        encoder_dir = path / encoder_path(modules)
        sbert_file = encoder_dir / SBERT_CONFIG
        sbert = read_json(sbert_file) or {}
        limit = transformer_max_seq_length({k: v for k, v in sbert.items() if k != "transformer_task"}, sbert_file,
                                           FillMask.task_keys)
        prompt = (prompt_named(prompts, prompt_name) if prompt_name is not None
                  else prompts.get(st_config.get("default_prompt_name"), ""))
        return TextForm(encoder_dir, prompt, bool(sbert.get("do_lower_case", False)), limit, str(sbert_file))
    raise BertkitError(f"{path / MODULES} lists the modules {types}: extract-features writes the states of one "
                       "encoder, as a SentenceTransformer (Transformer, Pooling, ...), a CrossEncoder (Transformer) or "
                       "a SparseEncoder (Transformer, SpladePooling) directory holds it; pass the directory of the "
                       "encoder you want (a route's own)")


def max_seq_length_for(given: int | None, form: TextForm, tokenizer: Any, positions: int) -> int:
    """The tokens each text is cut at: ``given``, else a sentence-transformers directory's max_seq_length (else its
    tokenizer's model_max_length, where sentence-transformers 6 saves it, within the encoder's ``positions``), else
    google's 128 within the encoder's ``positions`` (a checkpoint of 64 positions was refused with no length given,
    told to pass "max_length", a flag neither command has). A ``given`` over the directory's is refused: its model never sees more of a text, and states of
    tokens past it attend to context its own vectors never had."""
    if given is not None and not is_whole(given, -sys.maxsize):  # a size below 3 is named by extract_features
        raise BertkitError(f"max_seq_length {given!r} must be a whole number of tokens (e.g. 128)")
    if not form.source:  # a plain checkpoint: google's default, where the model has that many positions
        return min(MAX_SEQ_LENGTH, positions) if given is None else given
    declared = form.max_seq_length
    where = form.source if declared is not None else f"{form.encoder_dir / 'tokenizer_config.json'} (model_max_length)"
    if declared is not None and declared > positions:  # sentence-transformers fails on the first text that long
        raise BertkitError(f"{where}: max_seq_length {declared} exceeds the encoder's {positions} positions "
                           f"(max_position_embeddings); write {positions} or less there")
    limit = min(declared if declared is not None else tokenizer.model_max_length, positions)
    if given is None:
        return limit
    if given > limit:
        raise BertkitError(f"max_seq_length {given} exceeds the {limit} tokens {where} declares: the directory's model "
                           f"cuts every text at {limit}, so states over more tokens are not what it computes; give "
                           f"--max-seq-length {limit} or less (or leave it out), or raise max_seq_length there")
    return given


def encode_texts(tokenizer: Any, texts: Sequence[tuple[str, str | None]], max_seq_length: int, *,
                 prompt: str = "", lowercase: bool = False) -> list[dict]:
    """``[CLS] a [SEP] (b [SEP])`` as google's extract_features.py builds it: a pair too long loses one token at a
    time from its longer segment, from b on a tie (_truncate_seq_pair; tokenizers' "longest_first" splits the cut
    in halves instead), and a b without tokens, given so or cut to none, is no segment (no second [SEP]).
    ``prompt`` goes before ``a`` and ``lowercase`` lowers both texts first, as sentence-transformers' encode does
    (``text_form``): the prompt's tokens are part of ``a``, written and cut with it."""
    if not isinstance(prompt, str):
        raise BertkitError(f"prompt must be a str (put before each text), got {prompt!r}")
    if not isinstance(lowercase, (bool, np.bool_)):  # "false" would lower every text
        raise BertkitError(f"lowercase must be True or False, got {lowercase!r}")
    return list(_encoded(tokenizer, texts, max_seq_length, prompt, lowercase))


def _encoded(tokenizer: Any, texts: Iterable[tuple[str, str | None]], max_seq_length: int, prompt: str,
             lowercase: bool, cut: list[tuple[int, int]] | None = None) -> Iterator[dict]:
    """``encode_texts``' rows, one at a time; ``cut`` gets (line, tokens before the cut) of each line cut short."""
    lower = lowercaser(tokenizer) if lowercase else None
    # b's segment: 0 too where the tokenizer's model_input_names leaves token_type_ids out, as transformers feeds it
    segment = int(getattr(tokenizer, "segments_to_model", True))
    for line, (a, b) in enumerate(texts):
        a = prompt + a
        if lower is not None:  # around the special tokens, as sentence-transformers' Lowercase normalizer
            a, b = lower(a), lower(b) if b is not None else None
        ids_a = tokenizer(a, add_special_tokens=False)["input_ids"]
        ids_b = tokenizer(b, add_special_tokens=False)["input_ids"] if b else []
        whole = len(ids_a) + len(ids_b) + (3 if ids_b else 2)
        if cut is not None and whole > max_seq_length:
            cut.append((line, whole))
        if ids_b:
            while len(ids_a) + len(ids_b) > max_seq_length - 3:
                (ids_a if len(ids_a) > len(ids_b) else ids_b).pop()
        else:
            del ids_a[max_seq_length - 2:]
        first = [tokenizer.cls_token_id, *ids_a, tokenizer.sep_token_id]
        second = [*ids_b, tokenizer.sep_token_id] if ids_b else []
        yield {"input_ids": first + second, "token_type_ids": [0] * len(first) + [segment] * len(second)}


class EncodedLines(Sequence):
    """Encoded lines held as two flat arrays and their offsets: ``[i]`` is line i's ``{"input_ids", "token_type_ids"}``
    (int32 and int8 views). The lines of a whole input file are held while it is extracted (the shards are planned
    from their lengths): as a list of dicts of Python lists a token took 35 bytes and more (a 3 MB text file's 789,121
    tokens: 28 MB; a 100 MB corpus, about 1 GB), here 5."""

    def __init__(self, rows: Iterable[dict]):
        ids, types, ends = array("i"), array("b"), array("q", [0])
        for row in rows:
            ids.extend(row["input_ids"])
            types.extend(row["token_type_ids"])
            ends.append(len(ids))
        self._ids, self._types = np.frombuffer(ids, np.int32), np.frombuffer(types, np.int8)
        self._ends = np.frombuffer(ends, np.int64)

    def __len__(self) -> int:
        return len(self._ends) - 1

    def __getitem__(self, i: int) -> dict:  # type: ignore[override]
        if not -len(self) <= i < len(self):
            raise IndexError(i)
        a, b = self._ends[i % len(self)], self._ends[i % len(self) + 1]
        return {"input_ids": self._ids[a:b], "token_type_ids": self._types[a:b]}


def lowercaser(tokenizer: Any) -> Callable[[str], str]:
    """How ``tokenizer``'s texts are lower-cased for a sentence-transformers directory's do_lower_case: bertkit's
    ``BertTokenizer.lowercase``; for a transformers tokenizer the same, around its special tokens (which tokenizers
    splits off before sentence-transformers' Lowercase normalizer runs, so "[SEP]" in a text stays that token)."""
    if hasattr(tokenizer, "lowercase"):
        return tokenizer.lowercase
    from bertkit.tokenization.basic import lowercase

    specials = sorted(getattr(tokenizer, "all_special_tokens", None) or [], key=len, reverse=True)
    if not specials:
        return lowercase
    pattern = re.compile("(" + "|".join(map(re.escape, specials)) + ")")
    return lambda text: "".join(part if i % 2 else lowercase(part) for i, part in enumerate(pattern.split(text)))


def length_batches(encoded: Sequence[dict], indices: Sequence[int], batch_size: int) -> list[list[int]]:
    """``indices`` sorted by length (stable) and cut into batches, the same whichever process runs them."""
    return plan_batches({i: len(encoded[i]["input_ids"]) for i in indices}, batch_size, indices=indices)


@torch.no_grad()
def run_batches(model: BertModel, encoded: Sequence[dict], batches: Sequence[Sequence[int]], layers: Sequence[int],
                device: str = "cpu", bar: Any = None, bf16: bool = False) -> dict[int, np.ndarray]:
    """float32 (len(layers), T_i, H) per example of ``batches``, by example index (``layers``: positions in
    the L + 1 hidden states; bf16 autocast with ``bf16``)."""

    def call(batch: dict[str, torch.Tensor], rows: Sequence[dict]) -> list[np.ndarray]:
        states = model(batch["input_ids"], token_type_ids=batch["token_type_ids"],
                       attention_mask=batch["attention_mask"], output_hidden_states=True).hidden_states
        chosen = torch.stack([states[j] for j in layers], 1).float().cpu().numpy()  # (B, len(layers), T, H)
        return [chosen[row, :, :len(r["input_ids"])] for row, r in enumerate(rows)]

    # Padded with id 0 whatever the vocabulary's [PAD]: the attention mask hides padding.
    return runner.run_batches(call, encoded, batches, pad=lambda rows: pad_batch(rows, _PAD, attention_mask=True),
                              device=device, bar=bar, bf16=bf16)


def extract_features(
    model: BertModel,
    tokenizer: Any,
    texts: Iterable[tuple[str, str | None]],
    out: str | os.PathLike,
    *,
    layers: Sequence[int] = LAST_FOUR_LAYERS,
    max_seq_length: int | None = None,
    batch_size: int = BATCH_SIZE,
    dtype: Literal["float32", "float16"] = "float32",
    chunk_size: int = 2048,
    max_shard_bytes: int = 1 << 30,
    device: str = "cpu",
    progress: bool = True,
    overwrite: bool = False,
    bf16: bool = False,
    prompt: str | None = None,
    lowercase: bool | None = None,
    resume: bool = False,
    input_file: str | os.PathLike | None = None,
) -> dict[str, Any]:
    """Write the ``layers`` hidden states of every token of ``texts`` (``(text_a, text_b or None)`` pairs, a list or
    any iterable: read once) to ``out`` (.jsonl or .safetensors).

    ``prompt`` (put before each text, its tokens written with the text's), ``lowercase`` and ``max_seq_length``
    left None are those of the sentence-transformers directory ``model`` was loaded from (``model.name_or_path``;
    ``text_form`` and ``max_seq_length_for``), so the states are of the tokens its model sees; for a plain
    checkpoint no prompt, the texts as given, and google's 128 tokens.

    Layer indices index the L + 1 hidden states (0 = embeddings), negative ones from the end; ``read_features``
    reads either format back. Work proceeds ``chunk_size`` lines at a time. Under torchrun the batches are shared
    and rank 0 writes what one process would (other ranks return ``{"rank", "lines"}``). An existing
    ``out``, or shard files beside it, are replaced only with ``overwrite``.

    The output is written as it is made (``bertkit.partial_output``): a run cut short keeps the work units it
    finished beside ``out``, and ``resume`` continues it (the same texts, settings and model, else refused) to the
    bytes of an uninterrupted run; without ``resume`` or ``overwrite`` such a run is refused. ``input_file``: the file
    ``texts`` were read from, recorded (its size and modification time) as the input a resume must share; else the
    texts' sha256 is.
    """
    from bertkit.inference.prepare import prepare_model
    from bertkit.progress import progress_bar
    from bertkit.training.distributed import current

    out = file_to_write(out)
    loaded_from = getattr(model, "name_or_path", None)  # set by from_pretrained
    form = text_form(loaded_from) if loaded_from else TextForm(Path())
    prompt = form.prompt if prompt is None else prompt
    lowercase = form.lowercase if lowercase is None else lowercase
    max_seq_length = max_seq_length_for(max_seq_length, form, tokenizer, model.config.max_position_embeddings)
    texts = _check_request(model, out, dtype, max_seq_length, texts,
                           {"batch_size": batch_size, "chunk_size": chunk_size, "max_shard_bytes": max_shard_bytes})
    layers = layer_indices(layers)  # the names written: plain ints (numpy's too), for json
    positions = resolve_layers(layers, model.config.num_hidden_layers + 1)
    # as pipelines run it: bf16 checked, on the CPU the copy made for inference, the model passed in left as it is
    model, precision = prepare_model(model, device=device, bf16=bf16)
    device, bf16 = precision.device, precision.bf16
    rank, world = current().rank, current().world_size
    meta = safetensors_meta(layers, dtype, model.config.hidden_size, max_seq_length, prompt, lowercase,
                            precision.record())
    settings = {"layers": layers, "max_seq_length": max_seq_length, "batch_size": batch_size, "dtype": dtype,
                "chunk_size": chunk_size, "max_shard_bytes": max_shard_bytes, "prompt": prompt, "lowercase": lowercase,
                "device": str(device), **{k: v for k, v in meta.items() if k != "extraction"}}
    partial, refused = None, None
    if rank == 0:  # the one writer (the others are told which units it has): a run cut short, before any text is read
        try:
            partial = PartialOutput(out, "extract-features", {"settings": settings, "input": _input_identity(
                input_file, texts), "model": model_identity(loaded_from) or model.config.to_dict()},
                resume=resume, overwrite=overwrite)
        except (BertkitError, OSError) as e:
            refused = e
        else:
            overwrite = overwrite or partial.overwrite  # --resume of a run told it may replace the output
    try:  # a refusal before the run starts lets go of the output's lock (taken by PartialOutput)
        if world > 1:  # rank 0 refusing the run (a resume under other settings) stops every rank, not only itself
            from bertkit.training.distributed import agree

            agree(refused is None, f"taking {out.name} on rank 0")
        if refused is not None:
            raise refused
        encode_texts(tokenizer, [], max_seq_length, prompt=prompt, lowercase=lowercase)  # its arguments checked first
        cut: list[tuple[int, int]] = []
        encoded = EncodedLines(_encoded(tokenizer, texts, max_seq_length, prompt, lowercase, cut))
        if cut and rank == 0:
            _warn_cut(cut, len(encoded), max_seq_length)
        per_token = len(positions) * model.config.hidden_size * np.dtype(dtype).itemsize
        plan, files, units, batches = _plan_output(out, encoded, per_token, max_shard_bytes, chunk_size, batch_size)
        # ``out`` and its shards, in this run's number or another: an earlier output is replaced whole (never some of
        # its shards left to be read with the new ones), and only when ``overwrite`` says so
        earlier = existing_output(out)
        finished: set[tuple[int, int]] = set()
        if partial is not None:  # rank 0 alone proves the record against the files; the others are told what it found
            partial.progress, finished = resume_point(partial, out, files, units)
        if world > 1:  # and whether the run may replace the output (rank 0's claim of it can say so)
            shared = [finished, overwrite]
            torch.distributed.broadcast_object_list(shared, src=0)
            finished, overwrite = shared
        for path in dict.fromkeys([*files, *earlier]):
            refuse_existing_file(path, overwrite, flag="--overwrite (overwrite=True from Python)")
        # replaced or removed at the end: beside ``out`` itself (the name given), only an extraction's own shards, never
        # a user's file at a shard's name, whether this run writes that name again or not
        for path in earlier:
            if (path != out or out not in files) and not is_feature_shard(path):
                raise BertkitError(f"{path} is named as a shard of {out.name} but is not one bertkit wrote (no "
                                   "'bertkit-features' metadata); move it away or choose another output file")
        out.parent.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        bar = progress_bar(total=len(encoded), enabled=progress and rank == 0, unit="line", dynamic_ncols=True)

        def states_of(p: int, u: int) -> dict[int, np.ndarray]:
            """Unit (p, u)'s states; under torchrun each process runs every world-th batch (the batches of one
            process, so the output bytes are too) and rank 0 gathers them."""
            states = run_batches(model, encoded, batches[p][u][rank::world], positions, device, bar, bf16)
            if world == 1:
                return states
            shares = [None] * world if rank == 0 else None
            torch.distributed.gather_object(states, shares, dst=0)
            if rank == 0:
                for share in shares[1:]:
                    states.update(share)
                    bar.update(len(share))
            return states

        if rank != 0:  # the same sequence of gathers as rank 0's writer
            for p, part in enumerate(batches):
                for u in range(len(part)):
                    if (p, u) not in finished:
                        states_of(p, u)
            return {"rank": rank, "lines": sum(len(b) for part in batches for unit in part for b in unit[rank::world])}
    except BaseException:
        if partial is not None:
            partial.release()
        raise
    with partial:
        if out.suffix == ".jsonl":
            write_jsonl(partial, out, units[0], states_of, encoded, tokenizer, layers, np.dtype(dtype), bar.update)
        else:
            write_safetensors(partial, files, plan, units, states_of, encoded, layers, np.dtype(dtype), meta,
                              bar.update, superseded=earlier)  # its other shards, once the new ones are in place
    bar.close()
    return {**_report(files, encoded, layers, world, time.perf_counter() - t0), "lines_cut": len(cut)}


def _warn_cut(cut: list[tuple[int, int]], lines: int, max_seq_length: int) -> None:
    """Lines longer than ``max_seq_length`` are cut, as google's script cuts them, without a word there: said, with
    how many and the longest, since their tokens past the cut have no states in the output."""
    line, tokens = max(cut, key=lambda c: c[1])
    logger.warning("%d of the %d lines are longer than max_seq_length %d and were cut to it (a text at its end, a pair "
                   "from its longer segment): their tokens past it have no states in the output; the longest is line "
                   "%d (0-based) with %d tokens. Pass a larger --max-seq-length (within the model's positions), or "
                   "split those lines", len(cut), lines, max_seq_length, line, tokens)


def _input_identity(input_file: str | os.PathLike | None, texts: Sequence[tuple[str, str | None]]) -> dict:
    """The input a resumed extraction must share: the file read (as the other resumable commands record theirs),
    or the texts themselves."""
    if input_file is not None:
        return file_identity(input_file)
    return {"texts": len(texts), "sha256": hashlib.sha256(json.dumps(texts).encode("utf-8")).hexdigest()}


def _report(files: Sequence[Path], encoded: Sequence[dict], layers: Sequence[int], world: int,
            seconds: float) -> dict[str, Any]:
    n_tokens = sum(len(e["input_ids"]) for e in encoded)
    return {"files": [str(p) for p in files], "lines": len(encoded), "tokens": n_tokens, "layers": list(layers),
            "processes": world, "seconds": round(seconds, 1), "tokens_per_s": round(n_tokens / max(seconds, 1e-9), 1)}


def _check_request(model: BertModel, out: Path, dtype: str, max_seq_length: int, texts: Iterable[Any],
                   sizes: dict[str, Any]) -> list[tuple[str, str | None]]:
    """``texts`` as a list (a generator is read once, here), or an error naming the first bad argument."""
    if out.suffix not in (".jsonl", ".safetensors"):
        raise BertkitError(f"output {out} must end in .jsonl (google's JSON lines) or .safetensors (tensors)")
    if not isinstance(dtype, str) or dtype not in ("float32", "float16"):  # np.dtype("float16") == "float16"
        raise BertkitError(f"dtype {dtype!r} must be 'float32' or 'float16'")
    bad_size = next((k for k, v in sizes.items() if not is_whole(v)), None)
    if bad_size is not None:
        raise BertkitError(f"{bad_size} {sizes[bad_size]!r} must be a whole number of at least 1")
    model.config.check_sequence_length(max_seq_length, "max_seq_length")
    texts = list(texts)
    # a bare string would unpack into a pair of its two characters ("hi": "h" ||| "i"), or fail half-way
    bad = next((k for k, text in enumerate(texts) if not isinstance(text, (tuple, list)) or len(text) != 2
                or not isinstance(text[0], str) or not isinstance(text[1], (str, type(None)))), None)
    if bad is not None:
        raise BertkitError(f"texts[{bad}] is {texts[bad]!r}, not a (text_a, text_b or None) pair of str; pass a text "
                           "alone as (text, None) (read_texts(path) reads a file into these pairs)")
    need = 3 if any(b is not None for _, b in texts) else 2  # [CLS] a [SEP] (b [SEP]), even with no text left
    if max_seq_length < need:
        raise BertkitError(f"max_seq_length {max_seq_length} leaves no room for the {need} special tokens of "
                           f"{'a pair (text_a ||| text_b)' if need == 3 else 'a text'}; use at least {need}")
    return texts


def _plan_output(out: Path, encoded: Sequence[dict], per_token_bytes: int, max_shard_bytes: int, chunk_size: int,
                 batch_size: int) -> tuple[list[range], list[Path], list[list[list[int]]], list[list[list[list[int]]]]]:
    """(the lines of each output file, the files, each file's work units of ``chunk_size`` lines, their batches)."""
    if out.suffix == ".jsonl":
        plan = [range(len(encoded))]
    else:
        plan = shard_plan([len(e["input_ids"]) for e in encoded], per_token_bytes, max_shard_bytes)
    files = [out] if out.suffix == ".jsonl" else shard_paths(out, len(plan))
    units = [[list(range(a, min(a + chunk_size, part.stop))) for a in range(part.start, part.stop, chunk_size)]
             for part in plan]
    batches = [[length_batches(encoded, unit, batch_size) for unit in part] for part in units]
    return plan, files, units, batches


__all__ = ["read_texts", "text_form", "TextForm", "max_seq_length_for", "extract_features", "read_features",
           "resolve_layers", "length_batches", "run_batches", "encode_texts",
           "lowercaser"]
