"""The files of a feature extraction (``features.extract_features``): google-research/bert's JSON lines, the
.safetensors layout and its shards, what an earlier extraction to a name left, and ``read_features``, which reads
either format back. docs/token-tasks.md ("bertkit extract-features") gives the layouts.
"""

from __future__ import annotations

import glob
import hashlib
import json
import logging
import os
import re
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bertkit.errors import BertkitError, MissingFileError, NonFiniteError
from bertkit.manifests import sha256_of
from bertkit.outputs import fsync, regular_stat, writing
from bertkit.partial_output import PartialOutput, open_partial, partial_path

logger = logging.getLogger("bertkit")
StatesOf = Callable[[int, int], dict[int, np.ndarray]]


def _values(vec: np.ndarray) -> str:
    # 9 significant digits: the shortest width at which every float32 reads back exactly.
    return ",".join(map("{:.9g}".format, vec.tolist()))


def _jsonl_line(line_index: int, tokens: list[str], states: np.ndarray, layer_names: Sequence[int]) -> str:
    feats = []
    for t, token in enumerate(tokens):
        layers = ",".join(f'{{"index":{name},"values":[{_values(states[k, t])}]}}'
                          for k, name in enumerate(layer_names))
        feats.append(f'{{"token":{json.dumps(token)},"layers":[{layers}]}}')
    return f'{{"linex_index":{line_index},"features":[{",".join(feats)}]}}\n'


def write_jsonl(partial: PartialOutput, out: Path, units: list[list[int]], states_of: StatesOf,
                encoded: Sequence[dict], tokenizer: Any, layers: Sequence[int], np_dtype: np.dtype,
                skipped: Callable[[int], None] = lambda n: None) -> None:
    """The lines of ``units`` appended to ``out``'s partial file, each unit's flushed and recorded as it ends (a
    resumed run goes on from the first unit not recorded), then renamed to ``out``."""
    f = partial.appender(out)
    for u, unit in enumerate(units):
        if unit and unit[-1] < f.rows:  # written by the run this one continues
            skipped(len(unit))
            continue
        states = states_of(0, u)
        for i in unit:
            tokens = tokenizer.convert_ids_to_tokens(np.asarray(encoded[i]["input_ids"]).tolist())
            # float16: the values a .safetensors output holds, read back exactly as float32
            f.write(_jsonl_line(i, tokens, _written(i, states[i], layers, np_dtype).astype(np.float32), layers))
        f.commit(unit[-1] + 1 if unit else 0)
    f.close()
    partial.finish([(f.tmp, out)])


def resume_point(partial: PartialOutput, out: Path, files: Sequence[Path],
                 units: list[list[list[int]]]) -> tuple[dict, set[tuple[int, int]]]:
    """What of a run cut short's record (``partial.progress``) the partial files beside ``out`` prove, and the work
    units (shard, unit) that makes finished: a file torn by the kill, or changed since, is dropped from the record
    with the units after it, which are made again. Under torchrun rank 0 decides this once, before any unit, and
    tells the other ranks: ranks that read the record on their own skipped units rank 0 made again, and their gathers
    no longer matched (a crash, or a hang). A .jsonl's proof (``PartialOutput.proven``) is the digest its
    ``Appender`` goes on from: the file is read once."""
    progress = partial.progress
    if out.suffix == ".jsonl":
        if (progress.get(out.name) or {}).get("rows") and partial.proven(out) is None:
            logger.warning("%s is missing or differs from the rows recorded when it was written: every row is made "
                           "again", partial_path(out))
            progress = {}
        rows = int((progress.get(out.name) or {}).get("rows", 0))
        return progress, {(0, u) for u, unit in enumerate(units[0]) if unit and unit[-1] < rows}
    state = progress.get("safetensors") or {}
    shards, current = list(state.get("shards", [])), int(state.get("units", 0))  # the sha256 of each finished shard
    for p, sha in enumerate(shards):
        # a shard's partial file, or the shard itself where a kill cut the renames into place short (``finish``)
        if not any(f.is_file() and not f.is_symlink() and sha256_of(f) == sha
                   for f in (partial_path(files[p]), files[p])):
            logger.warning("%s is missing or differs from the sha256 recorded when it was written: it is made again "
                           "(and the shards after it)", partial_path(files[p]))
            shards, current = shards[:p], 0
            break
    tmp = partial_path(files[min(len(shards), len(files) - 1)])
    if current and not (len(shards) < len(files) and (st := regular_stat(tmp)) is not None  # never a symlink's
                        and st.st_size == state.get("bytes")
                        and len(state.get("unit_sha256") or []) >= current):
        logger.warning("%s is missing or not of the size recorded: shard %d's units are made again", tmp, len(shards))
        current = 0
    current = _proven_units(tmp, state, current)
    if state:  # the extraction's id kept: the shards proven were written with it
        progress = {"safetensors": {**state, "shards": shards, "units": current,
                                    "unit_sha256": (state.get("unit_sha256") or [])[:current]}}
    return progress, {(p, u) for p, part in enumerate(units) for u in range(len(part))
                      if p < len(shards) or (p == len(shards) and u < current)}


def _proven_units(tmp: Path, state: dict, count: int) -> int:
    """How many of the first ``count`` units of the shard being made (``tmp``) hold the states recorded: each unit's
    rows, in every layer, have the sha256 taken when they were flushed. The file is at its final size from the start,
    so its size proves nothing of a unit torn by a kill, or changed since: that unit is made again, and those after."""
    if not count:
        return 0
    head, stripe, layers = state["layout"]
    with open(tmp, "rb") as f:
        for u, (a, b, sha) in enumerate(state["unit_sha256"][:count]):
            digest = hashlib.sha256()
            for k in range(layers):
                f.seek(head + k * stripe + a)
                digest.update(f.read(b - a))
            if digest.hexdigest() != sha:
                logger.warning("%s: work unit %d's states differ from the sha256 recorded when they were written: "
                               "it is made again, and the %d after it", tmp, u, count - u - 1)
                return u
    return count


def _written(i: int, states: np.ndarray, layers: Sequence[int], np_dtype: np.dtype) -> np.ndarray:
    """Line ``i``'s float32 ``states`` as written (``np_dtype``), or an error naming the line and layer: a NaN would be
    ``nan`` in the .jsonl (no JSON), a float16 value past 65504 inf."""
    with np.errstate(over="ignore"):
        cast = states.astype(np_dtype)
    finite = np.isfinite(cast).reshape(len(layers), -1).all(1)
    if finite.all():
        return cast
    k = int(np.argmin(finite))
    where = f"line {i} (0-based, input order): layer {layers[k]} holds"
    if np.isfinite(states[k]).all():
        raise NonFiniteError(f"{where} values past float16's range (largest {np.abs(states[k]).max():.1e}); write "
                             "float32 (dtype='float32', --dtype float32)")
    raise NonFiniteError(f"{where} NaN or infinite values: the model's weights are broken; nothing was written")


def shard_plan(lengths: Sequence[int], per_token_bytes: int, max_shard_bytes: int) -> list[range]:
    """Consecutive line ranges of at most ``max_shard_bytes`` each (a single larger line gets its own)."""
    shards, start, size = [], 0, 0
    for i, n in enumerate(lengths):
        if size and size + n * per_token_bytes > max_shard_bytes:
            shards.append(range(start, i))
            start, size = i, 0
        size += n * per_token_bytes
    shards.append(range(start, len(lengths)))
    return shards


def shard_paths(out: Path, n: int) -> list[Path]:
    """``out`` itself for one shard; ``stem-00001-of-0000n.safetensors`` (the Hugging Face naming) for several."""
    if n == 1:
        return [out]
    return [out.with_name(f"{out.stem}-{k + 1:05d}-of-{n:05d}{out.suffix}") for k in range(n)]


def existing_output(out: Path) -> list[Path]:
    """What an earlier extraction to ``out`` left: ``out`` itself and, for .safetensors, every shard named after it
    (in whatever number of shards), sorted."""
    found = [out] if out.exists() or out.is_symlink() else []
    if out.suffix == ".safetensors":
        shard = re.compile(rf"{re.escape(out.stem)}-\d{{5}}-of-\d{{5}}{re.escape(out.suffix)}")
        found += sorted(p for p in out.parent.glob(f"{glob.escape(out.stem)}-*-of-*{out.suffix}")
                        if shard.fullmatch(p.name))
    return found


def safetensors_meta(layers: Sequence[int], dtype: str, hidden_size: int, max_seq_length: int, prompt: str,
                      lowercase: bool, precision: dict[str, Any] | None = None) -> dict[str, str]:
    # "extraction" tells one extraction's shards from another's of the same names: the shards are renamed into place
    # one by one, so a kill in between leaves some of each (``_one_output`` refuses to read them as one)
    # "prompt" and "lowercase" say which text of each line the states are of (a sentence-transformers directory's)
    # ``precision`` (``Precision.record``: quantize, float_dtype, int8's calibration and kernel) what they were computed
    # in: "dtype" is only how they are stored, so an --int8 --bf16 file read as float32 states of fp32
    computed = {k: v if isinstance(v, str) else json.dumps(v) for k, v in (precision or {}).items()}
    return {"format": "bertkit-features", "layers": json.dumps(list(layers)), "dtype": dtype,
            "hidden_size": str(hidden_size), "max_seq_length": str(max_seq_length), "prompt": prompt,
            "lowercase": json.dumps(lowercase), **computed, "extraction": uuid.uuid4().hex}


def write_safetensors(partial: PartialOutput, files: list[Path], plan: list[range], units: list[list[list[int]]],
                      states_of: StatesOf, encoded: Sequence[dict], layers: Sequence[int], np_dtype: np.dtype,
                      meta: dict[str, str], skipped: Callable[[int], None] = lambda n: None,
                      superseded: Sequence[Path] = ()) -> None:
    """Every shard written beside its name (``partial_path``), its states as each unit comes (recorded, so a resumed
    run goes on from the first unit ``resume_point`` does not prove), and all renamed into place at the end: a kill
    while the states are computed leaves the earlier output whole, not its first shards replaced by this run's. The
    earlier output's other shards (``superseded``, of other names: checked again, so a file of the user's put there
    meanwhile stays) are removed before the record: a kill among the renames, or before those removals, is finished by
    a resume, which computes nothing again."""
    state = partial.progress.get("safetensors") or {}  # proven by ``resume_point``
    done: list[str] = list(state.get("shards", []))  # the sha256 of each finished shard
    meta = {**meta, "extraction": state.get("extraction", meta["extraction"])}  # one extraction's shards, resumed
    for p, (shard, path) in enumerate(zip(plan, files)):
        if p < len(done):
            skipped(len(shard))
            continue
        ours = p == len(state.get("shards", []))  # the shard the run cut short was making
        recorded = (state.get("unit_sha256") or [])[:int(state.get("units", 0))] if ours else []
        skipped(sum(len(unit) for unit in units[p][:len(recorded)]))

        def record(u: int, **shard: Any) -> None:
            partial.save({"safetensors": {"extraction": meta["extraction"], "shards": done, "units": u, **shard}})

        _write_shard(partial, path, shard, units[p], p, recorded, record, states_of, encoded, layers, np_dtype, meta)
        done.append(sha256_of(partial_path(path)))
        record(0)
    # a shard without its partial file was placed by the run a kill cut short (``resume_point`` proved it there)
    partial.finish([(partial_path(path), path) for path in files if os.path.lexists(partial_path(path))],
                   superseded=[path for path in superseded if path not in files and is_feature_shard(path)])


def _write_shard(partial: PartialOutput, path: Path, shard: range, units: list[list[int]], p: int,
                 recorded: list[list], record: Callable[..., None], states_of: StatesOf, encoded: Sequence[dict],
                 layers: Sequence[int], np_dtype: np.dtype, meta: dict[str, str]) -> None:
    """Shard ``p`` (the lines ``shard``) written to ``partial_path(path)``, its units after the ``recorded`` ones
    (proven by ``resume_point``: [first byte, end, sha256] of each one's rows in a layer's tensor)."""
    shard_lengths = np.asarray([len(encoded[i]["input_ids"]) for i in shard], dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(shard_lengths)]).astype(np.int64)
    # The shard is laid out whole from the start (``_shard_head``: everything but the states) and each work unit's
    # states are put in place in its layers' tensors as they come, flushed before the unit is recorded: the shard
    # is on disk once, never beside a second copy of its states (a 1 GiB shard peaked at 2 GiB, its states file and
    # the shard written from it), and a resumed run finds its finished units' states there. (0, H) for no lines
    # (an empty input file): a shard of zero lines, as the .jsonl is a file of none.
    shape = (len(layers), int(starts[-1]), int(meta["hidden_size"]))
    ints = {key: np.concatenate([np.zeros(0, np.int64), *(np.asarray(encoded[i][key], np.int64) for i in shard)])
            for key in ("input_ids", "token_type_ids")}
    ints.update(offsets=starts, line_index=np.arange(shard.start, shard.stop, dtype=np.int64))
    head = _shard_head(ints, layers, shape, np_dtype, meta)
    tmp = partial.own(partial_path(path))
    start, recorded, row = len(recorded), list(recorded), shape[2] * np_dtype.itemsize
    layout = [len(head), shape[1] * row, len(layers)]  # where each layer's rows are: what a resume checks
    if not start:
        record(0)  # the file named before it is made
    size = len(head) + int(np.prod(shape)) * np_dtype.itemsize
    with writing(tmp), open_partial(tmp, "r+b" if start else "wb") as f:
        f.write(head)  # the same bytes again on a resume
        f.truncate(size)
        if hasattr(os, "posix_fallocate"):  # not on macOS or Windows
            # the disk's room taken now, for a clear error: a memmap's write finding the disk full is a SIGBUS
            # (the process killed without a word), the truncated file being sparse
            os.posix_fallocate(f.fileno(), 0, size)
    placed = np.memmap(tmp, np_dtype, "r+", offset=len(head), shape=shape) if shape[1] else np.empty(shape, np_dtype)
    for u, unit in enumerate(units):
        if u < start:
            continue
        states = states_of(p, u)
        for i in unit:
            a, b = starts[i - shard.start], starts[i - shard.start + 1]
            placed[:, a:b] = _written(i, states[i], layers, np_dtype)
        del states  # before the next unit's are computed
        a, b = int(starts[unit[0] - shard.start]), int(starts[unit[-1] - shard.start + 1])
        digest = hashlib.sha256()
        for k in range(len(layers)):
            digest.update(placed[k, a:b])
        recorded.append([a * row, b * row, digest.hexdigest()])
        with writing(tmp):
            placed.flush()  # a memmap: a unit's lines hold tokens
            fsync(tmp)
        record(u + 1, bytes=size, layout=layout, unit_sha256=recorded)
    del placed


def _shard_head(ints: dict[str, np.ndarray], layers: Sequence[int], shape: tuple[int, int, int], np_dtype: np.dtype,
                meta: dict[str, str]) -> bytes:
    """A shard's bytes before its states: the safetensors header (the int64 tensors first, as safetensors orders
    them by dtype, then the layers in the order asked; the metadata sorted, so a resumed run writes the same bytes)
    and the int64 tensors."""
    import struct

    header: dict[str, Any] = {"__metadata__": dict(sorted(meta.items()))}
    at = 0
    tensors = [(k, "I64", list(v.shape), v.nbytes) for k, v in sorted(ints.items())]
    tensors += [(f"layer.{name}", {2: "F16", 4: "F32"}[np_dtype.itemsize], list(shape[1:]),
                 shape[1] * shape[2] * np_dtype.itemsize) for name in layers]
    for key, dtype, dims, size in tensors:
        header[key] = {"dtype": dtype, "shape": dims, "data_offsets": [at, at + size]}
        at += size
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)  # the data 8-byte aligned, as safetensors pads it
    return struct.pack("<Q", len(text)) + text + b"".join(v.tobytes() for _, v in sorted(ints.items()))


def is_feature_shard(path: Path) -> bool:
    """Whether ``path`` is a safetensors file an extraction wrote (its metadata says ``bertkit-features``)."""
    return _shard_meta(path).get("format") == "bertkit-features"


def _shard_meta(path: Path) -> dict[str, str]:
    """The metadata of the safetensors file ``path`` ({} if it is none)."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="np") as f:
            return f.metadata() or {}
    except (SafetensorError, OSError):
        return {}


def _one_output(path: Path) -> list[Path]:
    """The files of the one output at ``path`` (.safetensors): itself, or all its shards; two outputs' files at once
    (what a kill while an overwrite placed its shards leaves) are refused, naming --resume where the record of the
    extraction cut short is there to finish it."""
    found = existing_output(path)
    if not found:
        raise MissingFileError(f"no features at {path} (nor shards {path.stem}-*-of-*{path.suffix})")
    record = partial_path(path, ".json")
    fix = (f"run the extraction cut short again with --resume (resume=True) to finish it (it was placing its shards; "
           f"its record: {record}), or extract again with overwrite" if record.is_file()
           else "remove the ones you do not want, or extract again with overwrite")
    shards = [p for p in found if p != path]
    if len(found) > 1 and len(shards) < len(found):
        raise BertkitError(f"{path} and its shards {', '.join(p.name for p in shards)} are two extractions' outputs; "
                           + fix.replace("the ones", "the one"))
    if shards:
        counts = sorted({p.stem.rpartition("-of-")[2] for p in shards})
        want = shard_paths(path, int(counts[-1]))
        if len(counts) > 1 or shards != want:
            missing = [p.name for p in want if p not in shards]
            raise BertkitError(f"the shards of {path} are not one extraction's: {', '.join(p.name for p in shards)}"
                               + (f" ({', '.join(missing)} is missing)" if missing else "") + f"; {fix}")
    runs: dict[str | None, list[str]] = {}
    for p in shards:
        runs.setdefault(_shard_meta(p).get("extraction"), []).append(p.name)
    if len(runs) > 1:
        one, *others = (", ".join(names) for names in runs.values())
        raise BertkitError(f"the shards of {path} are of {len(runs)} extractions ({one} of one, {'; '.join(others)} "
                           "of another): an overwrite of them was cut short; "
                           + (fix if record.is_file() else "extract again with overwrite"))
    return found


def read_features(path: str | os.PathLike) -> Iterator[dict[str, Any]]:
    """Yield ``{"line_index", "tokens" (jsonl) or "input_ids" (safetensors), "layers": {index: (T, H)}}`` from
    what ``extract_features`` wrote to ``path`` (its shards found by name), the layers in the order extracted."""
    path = Path(path)
    if path.suffix not in (".jsonl", ".safetensors"):
        raise BertkitError(f"{path}: read_features reads the .jsonl or .safetensors files extract_features writes")
    if path.suffix == ".jsonl":
        if not path.is_file():
            raise MissingFileError(f"features file not found: {path}")
        with open(path, encoding="utf-8") as f:
            for number, line in enumerate(f, 1):
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError:
                    obj = None
                if not isinstance(obj, dict) or not {"linex_index", "features"} <= obj.keys():
                    raise BertkitError(f"{path}:{number} is not a line of extracted features (no 'linex_index' and "
                                       "'features', as extract_features and google's extract_features.py write)")
                feats = obj["features"]
                names = [layer["index"] for layer in feats[0]["layers"]] if feats else []
                yield {"line_index": obj["linex_index"], "tokens": [t["token"] for t in feats],
                       "layers": {n: np.asarray([t["layers"][k]["values"] for t in feats], dtype=np.float32)
                                  for k, n in enumerate(names)}}
        return
    from safetensors import SafetensorError
    from safetensors.numpy import load_file

    shards = _one_output(path)
    for shard in shards:
        try:
            t = load_file(str(shard))
        except (SafetensorError, OSError) as e:
            raise BertkitError(f"{shard} cannot be read as a .safetensors file ({e}): a copy cut short, or no such "
                               "file; extract again") from None
        meta = _shard_meta(shard)
        if meta.get("format") != "bertkit-features":
            raise BertkitError(f"{shard} holds no extracted features (its metadata has no 'bertkit-features', which "
                               "extract_features writes); pass the .safetensors file extract_features wrote")
        # in the order asked for, as the .jsonl has them (the file holds its tensors sorted by name)
        names = json.loads(meta["layers"])
        offsets = t["offsets"]
        for j, line in enumerate(t["line_index"].tolist()):
            a, b = int(offsets[j]), int(offsets[j + 1])
            yield {"line_index": line, "input_ids": t["input_ids"][a:b],
                   "layers": {n: t[f"layer.{n}"][a:b] for n in names}}


__all__ = ["read_features", "write_jsonl", "write_safetensors", "shard_plan", "shard_paths", "existing_output",
           "safetensors_meta", "is_feature_shard"]
