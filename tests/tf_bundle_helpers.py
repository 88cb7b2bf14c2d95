"""A TensorFlow tensor bundle written without TensorFlow (``write_bundle``), for the tests of bertkit's reader
of google-research/bert checkpoints (test_tf_checkpoint.py) and of its errors on corrupt ones (test_reliability.py).
"""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
        n >>= 7
        if not n:
            return bytes(out)


def _field(number: int, value: int | bytes) -> bytes:
    if isinstance(value, bytes):
        return _varint(number << 3 | 2) + _varint(len(value)) + value
    return _varint(number << 3) + _varint(value)


def reference_crc32c(data: bytes) -> int:
    """CRC-32C one bit at a time (RFC 3720's definition), independent of bertkit's vectorised one."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def _mask(crc: int) -> int:
    """tsl's crc32c::Mask: how TensorFlow stores a checksum (a tensor's, and each SSTable block's)."""
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _masked_crc32c(data: bytes) -> bytes:
    """BundleEntryProto field 6 (fixed32): the crc32c TensorFlow stores, masked."""
    return _varint(6 << 3 | 5) + struct.pack("<I", _mask(reference_crc32c(data)))


def _block(entries: list[tuple[bytes, bytes]]) -> bytes:
    body = b"".join(_varint(0) + _varint(len(k)) + _varint(len(v)) + k + v for k, v in entries)
    return body + struct.pack("<II", 0, 1)  # one restart point, at 0


def write_table(path, entries: list[tuple[bytes, bytes]]) -> None:
    """An SSTable (LevelDB format, uncompressed) of ``entries``, sorted by key: one data block, its index block."""
    table = bytearray()
    handles = []
    for block in (_block(entries), _block([]), None):  # data, metaindex, index
        if block is None:
            block = _block([(entries[-1][0] + b"\xff", _varint(handles[0][0]) + _varint(handles[0][1]))])
        handles.append((len(table), len(block)))
        # the trailer: no compression, then the masked crc32c of the block and that byte (TensorFlow checks it)
        table += block + b"\x00" + struct.pack("<I", _mask(reference_crc32c(block + b"\x00")))
    footer = _varint(handles[1][0]) + _varint(handles[1][1]) + _varint(handles[2][0]) + _varint(handles[2][1])
    table += footer.ljust(40, b"\x00") + struct.pack("<Q", 0xDB4775248B80FB57)
    Path(path).write_bytes(bytes(table))


def bundle_entries(tensors: dict[str, np.ndarray]) -> tuple[list[tuple[bytes, bytes]], bytes]:
    """The index entries (the header first) and the data shard of a bundle holding ``tensors`` as float32."""
    data, entries = bytearray(), [(b"", _field(1, 1))]  # header: num_shards 1, little-endian
    for name in sorted(tensors):
        arr = np.ascontiguousarray(tensors[name], dtype=np.float32)
        shape = b"".join(_field(2, _field(1, d)) for d in arr.shape)
        entries.append((name.encode(), _field(1, 1) + _field(2, shape) + _field(4, len(data)) + _field(5, arr.nbytes)
                        + _masked_crc32c(arr.tobytes())))
        data += arr.tobytes()
    return entries, bytes(data)


def write_bundle(prefix, tensors: dict[str, np.ndarray]) -> None:
    """A minimal TF tensor bundle: one data shard, one SSTable data block."""
    entries, data = bundle_entries(tensors)
    write_table(f"{prefix}.index", entries)
    Path(f"{prefix}.data-00000-of-00001").write_bytes(data)
