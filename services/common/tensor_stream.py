"""Chunked tensor streams: how models and updates cross the wire below gRPC's message limit.

A stream is a header (tensor specs and total size), chunks of the concatenated raw little-endian
bytes (C order, header order), and a trailer carrying the XXH3-128 digest of everything sent.
This module is the format and the sending side; ``tensor_receiver`` checks and spools a stream
chunk by chunk. Never pickles: dtypes come from an allow-list.

Why XXH3 and not SHA-256: the checksum guards against truncation, reordering and corruption bugs
(ours, gRPC's, a proxy's). Authenticity and tamper-proofing come from mutual TLS, and an
authenticated worker can send any bytes it likes anyway (validation and robust aggregation deal
with that), so a cryptographic hash buys nothing here, at about ten times the CPU on each side
(SHA-256 ~1.5 GB/s, XXH3-128 ~20 GB/s on one core of the benchmark box).

A float32 tensor may travel as bfloat16 (``bf16=True``: half the bytes;
``powertrip.services.common.bf16``).
A site's update may travel in per-rank shards (``shard_specs``, ``shard_of``: rows
``shard_rows(dim0, count, index)`` of every tensor, 0-d tensors in shard 0 only).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import xxhash
from numpy.typing import NDArray

from powertrip.learning.shards import shard_rows
from powertrip.services.common.bf16 import BF16, bf16_bits
from powertrip.v1 import common_pb2

MiB = 1 << 20
# Under the aggregator's 1 MiB mmap threshold (services/common/memory.py), so the per-chunk
# buffers (gRPC's message bytes, protobuf's copy, the chunk's data) come from the heap rather
# than a fresh mmap + page faults + munmap each: a 256 MiB upload ran ~1.7x faster than with
# 2 MiB chunks and peaked lower under 8 concurrent uploads (benchmarks/README.md, upload).
DEFAULT_CHUNK_BYTES = 512 << 10
ALLOWED_DTYPES = ("float16", "float32", "float64", "int32", "int64", BF16)
#: what a coded update's parts may be (``update_codec``); only where the receiver pins the specs
CODED_DTYPES = ("int8", "uint8", "uint32")


def wire_dtype(name: str) -> np.dtype:
    """The little-endian numpy dtype a tensor's bytes are read as (bfloat16: its uint16 bits)."""
    return np.dtype("<u2") if name == BF16 else np.dtype(name).newbyteorder("<")


def new_digest() -> Any:
    """The stream checksum (XXH3-128; see the module docstring for why not SHA-256)."""
    return xxhash.xxh3_128()


class StreamError(ValueError):
    """A stream that cannot be accepted; ``reason`` is a bounded metric label."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]
    dtype: str

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * wire_dtype(self.dtype).itemsize


def _wire_name(dtype: np.dtype, bf16: bool) -> str:
    return BF16 if bf16 and dtype == np.float32 else dtype.name


def specs_of(params: Mapping[str, NDArray], bf16: bool = False) -> list[TensorSpec]:
    """The tensors as sent; ``bf16``: float32 tensors travel as bfloat16."""
    return [
        TensorSpec(n, tuple(int(s) for s in a.shape), _wire_name(np.dtype(a.dtype), bf16))
        for n, a in params.items()
    ]


def shard_specs(specs: Sequence[TensorSpec], count: int, index: int) -> list[TensorSpec]:
    """What shard ``index`` of ``count`` of a model of ``specs`` holds: rows
    ``shard_rows(dim0, count, index)`` of every tensor; a 0-d tensor whole in shard 0, and not
    at all in the others. The aggregator checks each shard's header against it."""
    out = []
    for s in specs:
        if not s.shape:
            if index == 0:
                out.append(s)
            continue
        lo, hi = shard_rows(s.shape[0], count, index)
        out.append(TensorSpec(s.name, (hi - lo, *s.shape[1:]), s.dtype))
    return out


def shard_of(params: Mapping[str, NDArray], count: int, index: int) -> dict[str, NDArray]:
    """Shard ``index`` of ``count`` of a whole model, as views (no copy): what rank ``index``
    of an FSDP2 job holds (``shard_specs``)."""
    out = {}
    for name, a in params.items():
        if np.ndim(a) == 0:
            if index == 0:
                out[name] = a
            continue
        lo, hi = shard_rows(a.shape[0], count, index)
        out[name] = a[lo:hi]
    return out


def wire_array(a: NDArray, dtype: str) -> NDArray:
    """``a`` as the contiguous little-endian array whose bytes travel for a spec of ``dtype``."""
    if dtype == BF16:
        return bf16_bits(np.asarray(a, dtype=np.float32))
    return np.ascontiguousarray(a, dtype=np.dtype(dtype).newbyteorder("<"))


def stream_header(
    params: Mapping[str, NDArray], bf16: bool = False
) -> common_pb2.TensorStreamHeader:
    specs = specs_of(params, bf16)
    return common_pb2.TensorStreamHeader(
        tensors=[common_pb2.TensorSpec(name=s.name, shape=s.shape, dtype=s.dtype) for s in specs],
        total_bytes=sum(s.nbytes for s in specs),
    )


def chunk_views(
    params: Mapping[str, NDArray], chunk_bytes: int = DEFAULT_CHUNK_BYTES, bf16: bool = False
) -> Iterator[tuple[int, list[memoryview]]]:
    """(offset, views) per chunk: the views, concatenated, are the chunk's bytes. Nothing is
    copied yet, so a sender can copy once, straight into what it puts on the wire. Tensors are
    made contiguous little-endian (or bfloat16) one at a time: sending holds one tensor (its
    bfloat16 copy: half of it) plus one chunk."""
    offset = 0
    pending: list[memoryview] = []
    pending_bytes = 0
    for spec in specs_of(params, bf16):
        arr = wire_array(params[spec.name], spec.dtype)
        view = arr.reshape(-1).view(np.uint8).data
        pos = 0
        while pos < len(view):
            take = min(chunk_bytes - pending_bytes, len(view) - pos)
            pending.append(view[pos : pos + take])
            pending_bytes += take
            pos += take
            if pending_bytes == chunk_bytes:
                yield offset, pending
                offset += pending_bytes
                pending, pending_bytes = [], 0
    if pending:
        yield offset, pending


def encode(
    params: Mapping[str, NDArray], chunk_bytes: int = DEFAULT_CHUNK_BYTES, bf16: bool = False
) -> Iterator[
    common_pb2.TensorStreamHeader | common_pb2.TensorChunk | common_pb2.TensorStreamTrailer
]:
    """Header, chunks, trailer. Chunks are cut lazily, so sending needs one chunk of memory."""
    yield stream_header(params, bf16)
    digest = new_digest()
    for offset, views in chunk_views(params, chunk_bytes, bf16):
        data = b"".join(views)
        digest.update(data)
        yield common_pb2.TensorChunk(offset_bytes=offset, data=data)
    yield common_pb2.TensorStreamTrailer(xxh3_128=digest.hexdigest())


def wrap_tensor_stream(parts: Iterable[object], message: type) -> Iterator:
    """Put each part of a tensor stream into the same-named field of a ``oneof part`` request."""
    for part in parts:
        if isinstance(part, common_pb2.TensorChunk):
            yield message(chunk=part)
        elif isinstance(part, common_pb2.TensorStreamHeader):
            yield message(header=part)
        else:
            yield message(trailer=part)
