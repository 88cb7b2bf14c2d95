"""google-research/bert TensorFlow checkpoints -> the Hugging Face layout, without TensorFlow.

A TF checkpoint (``bert_model.ckpt``) is a *tensor bundle*: ``bert_model.ckpt.index`` is a LevelDB-format
SSTable mapping each variable name to a ``BundleEntryProto`` (dtype, shape, shard, offset, size, crc32c),
and ``bert_model.ckpt.data-00000-of-00001`` holds the raw little-endian tensor bytes at those offsets.
Both are read here directly (``read_tf_checkpoint``): a few dozen lines of SSTable and protobuf wire
format instead of a 500 MB runtime dependency. ``published_name`` maps Google's variable names to the published
ones; docs/inference.md ("Google's TensorFlow checkpoints") has the command and what is converted.
"""

from __future__ import annotations

import logging
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bertkit.errors import BertkitError, MissingFileError, read_json_object
from bertkit.staging import staged
from bertkit.write_paths import refuse_non_directory

logger = logging.getLogger("bertkit")

# -- CRC-32C (Castagnoli), as TensorFlow checksums each tensor's bytes ------------------------------------------------

_CRC32C_POLY = 0x82F63B78  # reflected Castagnoli polynomial


def _crc_table() -> np.ndarray:
    table = []
    for n in range(256):
        for _ in range(8):
            n = (n >> 1) ^ (_CRC32C_POLY if n & 1 else 0)
        table.append(n)
    return np.array(table, dtype=np.uint32)


_CRC_TABLE = _crc_table()
_MASK_DELTA = 0xA282EAD8  # tsl/lib/hash/crc32c.h: stored checksums are "masked"


def _crc_bytes(register: int, data: bytes | np.ndarray) -> int:
    table = _CRC_TABLE.tolist()
    for b in bytes(data):
        register = table[(register ^ b) & 0xFF] ^ (register >> 8)
    return register


def _zeros_operator(n: int) -> list[np.ndarray]:
    """Four 256-entry tables of the linear map 'feed ``n`` zero bytes' on the CRC register, one per register byte."""
    basis = (np.uint32(1) << np.arange(32, dtype=np.uint32)).astype(np.uint32)  # the 32 one-bit registers at once
    for _ in range(n):
        basis = _CRC_TABLE[basis & 0xFF] ^ (basis >> 8)
    tables = []
    for k in range(4):
        t = np.zeros(256, dtype=np.uint32)
        for bit in range(8):
            t[(np.arange(256) >> bit) & 1 == 1] ^= basis[8 * k + bit]
        tables.append(t)
    return tables


def crc32c(data: bytes | np.ndarray) -> int:
    """CRC-32C of ``data``. Pure numpy (no dependency): the bytes are cut into up to 4096 equal chunks whose CRCs
    run side by side (one vectorised table step per byte position), then joined with the linear map that shifts a
    register over a chunk's length, since crc(A + B) = shift_len(B)(crc(A)) ^ crc_from_zero(B). About 100 MB/s."""
    buf = np.frombuffer(data, dtype=np.uint8) if not isinstance(data, np.ndarray) else data.reshape(-1).view(np.uint8)
    length = max(64, -(-len(buf) // 4096))
    k = len(buf) // length
    register = 0xFFFFFFFF
    if k:
        columns = np.ascontiguousarray(buf[:k * length].reshape(k, length).T)  # (length, k): one row per position
        chunk = np.zeros(k, dtype=np.uint32)
        for row in columns:
            chunk = _CRC_TABLE[(chunk ^ row) & 0xFF] ^ (chunk >> 8)
        t0, t1, t2, t3 = (t.tolist() for t in _zeros_operator(length))
        for c in chunk.tolist():
            register = (t0[register & 0xFF] ^ t1[(register >> 8) & 0xFF] ^ t2[(register >> 16) & 0xFF]
                        ^ t3[register >> 24] ^ c)
    return _crc_bytes(register, buf[k * length:]) ^ 0xFFFFFFFF


def _unmask(masked: int) -> int:
    rot = (masked - _MASK_DELTA) & 0xFFFFFFFF
    return ((rot >> 17) | (rot << 15)) & 0xFFFFFFFF


# -- Protobuf wire format and the SSTable (LevelDB table) the .index file is ------------------------------------------

_TABLE_MAGIC = 0xDB4775248B80FB57  # LevelDB's table magic number, the last 8 bytes of the file
_FOOTER = 48
# tensorflow/core/framework/types.proto DataType -> numpy dtype (bfloat16 is read as uint16 bits)
_DTYPES = {1: np.float32, 2: np.float64, 3: np.int32, 4: np.uint8, 5: np.int16, 6: np.int8, 9: np.int64,
           10: np.bool_, 14: "bfloat16", 17: np.uint16, 19: np.float16, 22: np.uint32, 23: np.uint64}


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7


def _fields(buf: bytes) -> list[tuple[int, Any]]:
    """(field number, value) pairs of one protobuf message: ints for varint/fixed, bytes for length-delimited."""
    out, pos = [], 0
    while pos < len(buf):
        key, pos = _varint(buf, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(buf, pos)
        elif wire == 1:
            value, pos = struct.unpack_from("<Q", buf, pos)[0], pos + 8
        elif wire == 2:
            n, pos = _varint(buf, pos)
            value, pos = buf[pos:pos + n], pos + n
        elif wire == 5:
            value, pos = struct.unpack_from("<I", buf, pos)[0], pos + 4
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")
        out.append((number, value))
    return out


def _block(data: bytes, offset: int, size: int, source: Path) -> list[tuple[bytes, bytes]]:
    """The (key, value) entries of one SSTable block (keys are prefix-compressed against the previous one), after
    its checksum: each block is followed by a type byte and the masked crc32c of both, which TensorFlow checks, so
    a flipped byte in a variable's entry (its dtype, shape or offset) is refused, not read as another tensor."""
    trailer = data[offset + size:offset + size + 5]
    if len(trailer) != 5:
        raise IndexError(f"a block of {size} bytes at offset {offset} runs past the end of the file ({len(data)} bytes)")
    expected = _unmask(struct.unpack("<I", trailer[1:])[0])
    if (actual := crc32c(data[offset:offset + size + 1])) != expected:
        raise BertkitError(f"{source} is corrupt: a block of {size} bytes at offset {offset} fails its checksum "
                           f"(crc32c {actual:#010x}, recorded {expected:#010x}); copy the checkpoint's .index and "
                           ".data-* files again (TensorFlow writes them together)")
    if trailer[0] != 0:
        raise BertkitError(f"{source}: block compressed with type {trailer[0]} (snappy); bertkit reads the "
                           "uncompressed bundles TensorFlow writes for checkpoints: re-save it with TensorFlow")
    block = data[offset:offset + size]
    num_restarts = struct.unpack_from("<I", block, len(block) - 4)[0]
    end = len(block) - 4 - 4 * num_restarts
    entries, pos, key = [], 0, b""
    while pos < end:
        shared, pos = _varint(block, pos)
        unshared, pos = _varint(block, pos)
        value_len, pos = _varint(block, pos)
        key = key[:shared] + block[pos:pos + unshared]
        pos += unshared
        entries.append((key, block[pos:pos + value_len]))
        pos += value_len
    return entries


def read_sstable(path: Path) -> dict[bytes, bytes]:
    """Every (key, value) of a LevelDB-format table file, as TensorFlow's tensor bundle index writes it."""
    data = path.read_bytes()
    if len(data) < _FOOTER or struct.unpack_from("<Q", data, len(data) - 8)[0] != _TABLE_MAGIC:
        raise BertkitError(f"{path} is not a TensorFlow checkpoint index (no SSTable magic number at its end); "
                           "pass the checkpoint prefix, e.g. bert_model.ckpt (beside bert_model.ckpt.index)")
    try:
        footer = data[len(data) - _FOOTER:]
        _, pos = _varint(footer, 0)  # metaindex handle (unused: bundles have no filter blocks)
        _, pos = _varint(footer, pos)
        index_offset, pos = _varint(footer, pos)
        index_size, _ = _varint(footer, pos)
        table: dict[bytes, bytes] = {}
        for _, handle in _block(data, index_offset, index_size, path):
            offset, p = _varint(handle, 0)
            size, _ = _varint(handle, p)
            table.update(_block(data, offset, size, path))
    except (IndexError, struct.error) as e:  # an offset or length pointing outside the file
        raise _corrupt(path, e) from None
    return table


def _corrupt(path: Path, e: Exception) -> BertkitError:
    return BertkitError(f"{path} is corrupt ({type(e).__name__}: {e}); copy the checkpoint's .index and .data-* "
                        "files again (TensorFlow writes them together)")


@dataclass(frozen=True)
class BundleEntry:
    """One variable's ``BundleEntryProto`` (tensorflow/core/protobuf/tensor_bundle.proto)."""

    dtype: int
    shape: tuple[int, ...]
    shard: int
    offset: int
    size: int
    sliced: bool
    crc32c: int | None = None  # masked, as stored; None when the writer recorded none


def _entry(value: bytes) -> BundleEntry:
    f = dict(_fields(value))  # each field of a BundleEntryProto appears once
    # TensorShapeProto: repeated Dim dim = 2 { int64 size = 1 }
    dims = [dim for n, dim in _fields(_of_type(f.get(2, b""), bytes)) if n == 2]
    shape = tuple(_of_type(next((v for k, v in _fields(_of_type(dim, bytes)) if k == 1), 0), int) for dim in dims)
    for number in (1, 3, 4, 5, 6):
        _of_type(f.get(number, 0), int)
    return BundleEntry(dtype=f.get(1, 0), shape=shape, shard=f.get(3, 0), offset=f.get(4, 0), size=f.get(5, 0),
                       sliced=7 in f, crc32c=f.get(6))  # 6: fixed32 crc32c, masked; 7: slices


_DT_STRING = 7


def _strings(buf: np.ndarray, count: int) -> tuple[list[bytes] | None, bytes]:
    """A string tensor's elements and the bytes its checksum covers. TensorFlow writes each element's length as a
    varint, the masked crc32c of those lengths, then the bytes; the entry's crc32c is over the lengths as uint32s,
    that checksum and the bytes. Lengths that do not fit the buffer: None (the checksum then fails)."""
    raw = bytes(buf)
    lengths, pos = [], 0
    try:
        for _ in range(count):
            n, pos = _varint(raw, pos)
            lengths.append(n)
    except IndexError:
        return None, raw
    if pos + 4 + sum(lengths) != len(raw):
        return None, raw
    starts = np.cumsum([pos + 4] + lengths)
    checked = struct.pack(f"<{count}I", *(n & 0xFFFFFFFF for n in lengths)) + raw[pos:]
    return [raw[a:b] for a, b in zip(starts[:-1], starts[1:])], checked


def _of_type(value: Any, kind: type) -> Any:
    if not isinstance(value, kind):  # a field of another wire type than its .proto's
        raise ValueError(f"a field holds {type(value).__name__} where the bundle's format has {kind.__name__}")
    return value


_CHECKPOINT_STATE = re.compile(r'^model_checkpoint_path:\s*"((?:[^"\\]|\\.)*)"', re.MULTILINE)


def checkpoint_prefix(path: str | Path) -> Path:
    """The prefix (``.../bert_model.ckpt``) of the checkpoint ``path`` names, as tf.train.load_checkpoint takes it:
    the prefix itself, one of its files (.index, .data-*, .meta), or a directory, whose ``checkpoint`` file names the
    latest save (tf.train.Saver's and tf.train.CheckpointManager's), else its one checkpoint (Google's downloads
    hold a single bert_model.ckpt and no ``checkpoint`` file)."""
    path = Path(path)
    if not path.is_dir():
        return path.with_name(re.sub(r"\.(index|meta|data-\d{5}-of-\d{5})$", "", path.name))
    state = path / "checkpoint"
    if state.is_file() and (m := _CHECKPOINT_STATE.search(state.read_text(encoding="utf-8", errors="replace"))):
        latest = Path(_unescape(m.group(1)))
        # A relative name is in the directory. An absolute one (tf.compat.v1.train.Saver's default) is looked for in
        # the directory first: a copied or moved run's `checkpoint` file still names the original's files.
        for candidate in ((path / latest,) if not latest.is_absolute() else (path / latest.name, latest)):
            if candidate.with_name(candidate.name + ".index").is_file():
                return candidate
        raise MissingFileError(f"{state} names {latest} as the latest checkpoint, but {path} has no "
                               f"{latest.name}.index: pass the prefix of one it holds ({_prefixes(path)})")
    found = _prefixes(path)
    if not found and (path / "saved_model.pb").is_file():
        raise BertkitError(f"{path} is a TensorFlow SavedModel, not a checkpoint: its variables are the TensorFlow 2 "
                           f"checkpoint {path / 'variables' / 'variables'}, which read_tf_checkpoint reads; "
                           "convert-tf-checkpoint converts google-research/bert's bert_model.ckpt (its downloads, "
                           "run_pretraining.py's, run_classifier.py's, run_squad.py's)")
    if len(found) != 1:
        raise MissingFileError(f"{path} is a directory holding {len(found)} TensorFlow checkpoints"
                               f"{f' ({found})' if found else ''} and no `checkpoint` file naming the latest: pass "
                               "the checkpoint prefix, e.g. bert_model.ckpt (the name before .index)")
    return path / found[0]


def _unescape(text: str) -> str:
    """A protobuf text-format string's contents: C escapes, non-ASCII bytes as octal (``\\303\\274`` for ü)."""
    simple = {b"n": b"\n", b"t": b"\t", b"r": b"\r"}
    raw = re.sub(rb"\\([0-7]{1,3}|.)", lambda e: bytes([int(e[1], 8) & 0xFF]) if e[1][:1].isdigit()
                 else simple.get(e[1], e[1]), text.encode("utf-8"))
    return raw.decode("utf-8", errors="replace")


def _prefixes(directory: Path) -> list[str]:
    return sorted(p.name[:-len(".index")] for p in directory.glob("*.index") if p.is_file())


def read_tf_checkpoint(prefix: str | Path, skip: re.Pattern | None = None) -> dict[str, np.ndarray]:
    """Variables of a TF checkpoint (``prefix`` as TensorFlow names it: ``.../bert_model.ckpt``, one of its files, or
    its directory: ``checkpoint_prefix``) as arrays; ``skip`` names variables not to read (their bytes are never
    touched), e.g. optimizer slots."""
    prefix = checkpoint_prefix(prefix)
    index = prefix.with_name(prefix.name + ".index")
    if not index.is_file():
        raise MissingFileError(f"{index} not found: pass the checkpoint prefix (bert_model.ckpt, the name before "
                               ".index and .data-00000-of-00001) or its directory")
    table = read_sstable(index)
    try:
        header = dict(_fields(table.pop(b"", b"")))
        entries = {raw_name.decode("utf-8"): _entry(value) for raw_name, value in sorted(table.items())}
    except (IndexError, struct.error, ValueError) as e:  # a bad varint, wire type or name: the bytes are damaged
        raise _corrupt(index, e) from None
    num_shards = int(header.get(1, 1))
    if header.get(2, 0) != 0:
        raise BertkitError(f"{index}: the checkpoint was written big-endian; bertkit reads little-endian bundles")
    shards: dict[int, tuple[Path, np.ndarray]] = {}
    out: dict[str, np.ndarray] = {}
    try:
        for name, e in entries.items():
            if skip is not None and skip.search(name):
                continue
            if e.sliced:
                raise BertkitError(f"{index}: variable {name} is stored in slices (partitioned); not supported")
            if e.dtype not in _DTYPES and e.dtype != _DT_STRING:
                raise BertkitError(f"{index}: variable {name} has TensorFlow dtype {e.dtype} (complex, quantized or "
                                   "a resource); bertkit reads numeric and string tensors")
            if e.shard not in shards:
                data_file = prefix.with_name(f"{prefix.name}.data-{e.shard:05d}-of-{num_shards:05d}")
                if not data_file.is_file():
                    raise MissingFileError(f"{data_file} not found: a checkpoint needs its .index and every "
                                           ".data-* shard in the same directory")
                # an empty file (a shard of empty tensors only) cannot be mapped
                shards[e.shard] = data_file, (np.memmap(data_file, dtype=np.uint8, mode="r")
                                              if data_file.stat().st_size else np.zeros(0, np.uint8))
            data_file, data = shards[e.shard]
            buf = data[e.offset:e.offset + e.size]
            if len(buf) != e.size:
                raise BertkitError(f"{index}: variable {name} lies past the end of its data file (truncated copy?)")
            strings, checked = _strings(buf, int(np.prod(e.shape))) if e.dtype == _DT_STRING else (None, buf)
            if e.crc32c is not None and (actual := crc32c(checked)) != (expected := _unmask(e.crc32c)):
                raise BertkitError(f"{data_file}: variable {name} fails its checksum (crc32c {actual:#010x}, "
                                   f"{index.name} records {expected:#010x}): the data file is corrupt; copy the "
                                   "checkpoint again")
            if e.dtype == _DT_STRING:  # bytes objects, as tf.train.load_checkpoint returns them
                if strings is None:
                    raise BertkitError(f"{index}: the lengths of string variable {name} do not fit its {e.size} "
                                       "bytes: the checkpoint is corrupt; copy it again")
                out[name] = np.empty(len(strings), dtype=object)
                out[name][:] = strings
                out[name] = out[name].reshape(e.shape)
                continue
            dtype = _DTYPES[e.dtype]
            if dtype == "bfloat16":
                bits = np.frombuffer(buf, dtype="<u2").astype(np.uint32) << 16
                arr = bits.view(np.float32)
            else:
                arr = np.frombuffer(buf, dtype=np.dtype(dtype).newbyteorder("<"))
            if arr.size != int(np.prod(e.shape)):
                raise BertkitError(f"{index}: variable {name} has {arr.size} values but its shape {list(e.shape)} "
                                   "needs a different number: the index is corrupt; copy the checkpoint again")
            out[name] = np.array(arr.reshape(e.shape))  # a copy: the memmap closes with this function
    finally:
        shards.clear()
    return out


# -- Google's variable names -> the published (Hugging Face) names ----------------------------------------------------

# Google's scopes are the published modules ("bert/encoder/layer_3/output/dense" -> "bert.encoder.layer.3.output.
# dense") and its leaves their parameters; dense kernels are (in, out) in TF, so transposed.
_LEAVES = {"kernel": "weight", "bias": "bias", "gamma": "weight", "beta": "bias"}
# Variables Google's code creates outside that pattern: the MLM output bias (the decoder is the word embedding matrix
# itself), and the (num_outputs, hidden) output_weights of the NSP, run_classifier.py's and run_squad.py's heads,
# already PyTorch's layout.
_HEADS = {"cls/predictions/output_bias": "cls.predictions.bias",
          "cls/seq_relationship/output_weights": "cls.seq_relationship.weight",
          "cls/seq_relationship/output_bias": "cls.seq_relationship.bias",
          "output_weights": "classifier.weight", "output_bias": "classifier.bias",
          "cls/squad/output_weights": "qa_outputs.weight", "cls/squad/output_bias": "qa_outputs.bias"}
# Optimizer state and bookkeeping in training checkpoints: carries no model weights. Slots are named after the
# optimizer (AdamWeightDecayOptimizer's own adam_m/adam_v, NVIDIA's LAMBOptimizer's lamb_m/lamb_v, or tf.train.
# Optimizer's slot names); tf.train.AdamOptimizer also keeps beta1_power and beta2_power at the root. A TensorFlow 2
# checkpoint's variables (object paths ending .ATTRIBUTES/...) are not read either: the converter refuses such a
# checkpoint on its object graph, which is read, without first reading every weight (1.3 GB for BERT-LARGE).
_SKIP = re.compile(r"(^|/)(adam_m|adam_v|lamb_m|lamb_v|AdamWeightDecayOptimizer(_1)?|Adam|Adam_1|Momentum)$"
                   r"|^beta[12]_power$|^global_step$|^good_steps$|^loss_scale|/\.ATTRIBUTES/")
# The model class a checkpoint holds, by the first of these variables it has (a masked LM without the next-sentence
# head is written as one, not as a pre-training model with a random next-sentence head).
_ARCHITECTURE = (("cls/squad/output_weights", "BertForQuestionAnswering"),
                 ("output_weights", "BertForSequenceClassification"),
                 ("cls/seq_relationship/output_weights", "BertForPreTraining"),
                 ("cls/predictions/output_bias", "BertForMaskedLM"))


def published_name(name: str) -> tuple[str, bool] | None:
    """The published name of Google's variable ``name`` and whether it is transposed; None for a name no BERT
    module has."""
    if name in _HEADS:
        return _HEADS[name], False
    if not name.startswith(("bert/", "cls/predictions/transform/dense/", "cls/predictions/transform/LayerNorm/")):
        return None
    scope, _, leaf = name.rpartition("/")
    module = re.sub(r"/layer_(\d+)/", r"/layer/\1/", scope + "/").strip("/").replace("/", ".")
    if leaf.endswith("_embeddings"):
        return f"{module}.{leaf}.weight", False
    return (f"{module}.{_LEAVES[leaf]}", leaf == "kernel") if leaf in _LEAVES else None


def google_name(published: str) -> str:
    """Google's variable name for the published weight name ``published`` (``published_name``'s inverse)."""
    heads = {h: g for g, h in _HEADS.items()}
    if published in heads:
        return heads[published]
    name = published if published.startswith(("bert.", "cls.")) else f"bert.{published}"
    scope, _, leaf = re.sub(r"\.layer\.(\d+)\.", r".layer_\1.", name).replace(".", "/").rpartition("/")
    if scope.endswith("_embeddings"):
        return scope
    if scope.endswith("LayerNorm"):
        leaf = {"weight": "gamma", "bias": "beta"}[leaf]
    return f"{scope}/{'kernel' if leaf == 'weight' else leaf}"


def tf_to_published(variables: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
    """Google-named arrays -> a state dict under the published names (kernels transposed); a variable no BERT
    module has is an error. Which encoder weights are missing, or past the config's layers, the strict load says."""
    names = {g: published_name(g) for g in variables if not _SKIP.search(g)}
    unknown = sorted(g for g, n in names.items() if n is None)
    if unknown:
        raise BertkitError(f"the checkpoint holds variables bertkit does not know: {unknown[:8]}"
                           f"{' ...' if len(unknown) > 8 else ''}")
    return {h: torch.from_numpy(np.ascontiguousarray(variables[g].T if t else variables[g]))
            for g, (h, t) in names.items()}


def _guess_lower_case(vocab: Path) -> bool:
    """Uncased vocabularies (Google's uncased_L-* models) hold no upper-case letter outside [SPECIAL] tokens."""
    with open(vocab, encoding="utf-8") as f:
        for line in f:
            token = line.strip()
            if not (token.startswith("[") and token.endswith("]")) and token != token.lower():
                return False
    return True


def convert_tf_checkpoint(tf_checkpoint: str | Path, bert_config: str | Path, vocab: str | Path,
                          output_dir: str | Path, *, do_lower_case: bool | None = None) -> dict[str, Any]:
    """Convert a google-research/bert checkpoint to a Hugging Face-layout directory: config.json,
    model.safetensors (heads included when present), vocab.txt, tokenizer_config.json; returns a summary.

    The weights are loaded strictly into the matching bertkit model before anything is written.
    ``do_lower_case`` None guesses from the vocabulary (an uncased one has no upper-case tokens).
    """
    from bertkit.config import BertConfig
    from bertkit.heads import MODEL_CLASSES
    from bertkit.tokenization import BertTokenizer

    bert_config, vocab, output_dir = Path(bert_config), Path(vocab), Path(output_dir)
    # before the checkpoint is read (1.3 GB for BERT-LARGE): the save would refuse it only then
    refuse_non_directory(output_dir, "convert_tf_checkpoint")
    for path, what in ((bert_config, "bert_config.json"), (vocab, "vocab.txt")):
        if not path.is_file():
            raise MissingFileError(f"{path} {'is a directory' if path.is_dir() else 'not found'}: pass the "
                                   f"checkpoint's {what} (it comes beside bert_model.ckpt)")
    existing = [n for n in ("config.json", "model.safetensors", "vocab.txt", "tokenizer_config.json",
                            "special_tokens_map.json", "tokenizer.json", "added_tokens.json")
                if (output_dir / n).exists()]
    if existing:  # bertkit never replaces files it did not create (the CLI's --overwrite removes its own first)
        raise BertkitError(f"{output_dir} already holds {', '.join(existing)}; choose a new output directory")
    config = BertConfig.from_dict(read_json_object(bert_config, "pass the checkpoint's bert_config.json"))
    # model_max_length: where truncation=True cuts, in bertkit and transformers; the default 512 overran a model of
    # fewer positions (an IndexError in the position embeddings)
    tokenizer = BertTokenizer(vocab, do_lower_case=_guess_lower_case(vocab) if do_lower_case is None
                              else do_lower_case, model_max_length=config.max_position_embeddings)
    if len(tokenizer) != config.vocab_size:  # before reading the checkpoint (1.3 GB for BERT-LARGE)
        raise BertkitError(f"{vocab} has {len(tokenizer)} tokens but {bert_config} says vocab_size "
                           f"{config.vocab_size}; pass the vocab.txt that came with this checkpoint")
    variables = read_tf_checkpoint(tf_checkpoint, skip=_SKIP)
    if "_CHECKPOINTABLE_OBJECT_GRAPH" in variables:  # tf.train.Checkpoint's object graph, a string tensor
        raise BertkitError(f"{tf_checkpoint} is a TensorFlow 2 object-based checkpoint (tf.train.Checkpoint: variables "
                           "named by object path, as tensorflow/models' BERT writes them), not one of "
                           "google-research/bert's (tf.compat.v1.train.Saver's names, bert/encoder/layer_0/...), which "
                           "bertkit converts: convert the bert_model.ckpt of google-research/bert's download of the "
                           "same model, or save the variables with tf.compat.v1.train.Saver under those names")
    published = tf_to_published(variables)
    arch = next((a for g, a in _ARCHITECTURE if g in variables), "BertModel")
    num_labels = int(published["classifier.weight"].shape[0]) if "classifier.weight" in published else None
    if num_labels is not None and config.num_labels != num_labels:  # run_classifier.py saves no label names
        config = config.with_labels(num_labels)
    model = MODEL_CLASSES[arch](config)
    loaded = model.load_published_state_dict(published, source=str(tf_checkpoint)).loaded  # strict: names and shapes
    # A head's or the pooler's weight the checkpoint lacks would be written as initialised, then load everywhere as
    # if it were the checkpoint's (the load above only warns: it serves fine-tuning a head from an encoder).
    fresh = [key for key in model.published_state_dict() if key not in loaded]
    if fresh:
        raise BertkitError(f"{tf_checkpoint} holds a {arch} without {', '.join(map(google_name, fresh))}: converted, "
                           "those weights would be random numbers saved as the checkpoint's; convert the "
                           "checkpoint these variables were saved in")
    with staged(output_dir) as out:  # the model and its tokenizer appear together, or not at all
        model.save_pretrained(out)  # config.json (architectures: [arch]) and model.safetensors
        tokenizer.save_pretrained(out)
    logger.info("converted %d variables of %s to %s (%s, do_lower_case=%s)", len(published), tf_checkpoint,
                output_dir, arch, tokenizer.do_lower_case)
    return {"output_dir": str(output_dir), "architecture": arch, "tensors": len(published),
            "parameters": sum(t.numel() for t in published.values()), "do_lower_case": tokenizer.do_lower_case}
