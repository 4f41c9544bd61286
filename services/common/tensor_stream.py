"""Chunked tensor streams: how models and updates cross the wire below gRPC's message limit.

A stream is a header (tensor specs and total size), chunks of the concatenated raw little-endian
bytes (C order, header order), and a trailer carrying the XXH3-128 digest of everything sent. The
receiver checks every chunk as it arrives (offset continuity, size, finiteness of the values)
and spools it — in memory while small, on disk beyond ``spool_bytes`` — so a stream that dies
half-way or fails its checksum leaves nothing behind, and memory stays bounded whatever the
model size or the number of concurrent senders. Never pickles: dtypes come from an allow-list.

Why XXH3 and not SHA-256: the checksum guards against truncation, reordering and corruption bugs
(ours, gRPC's, a proxy's). Authenticity and tamper-proofing come from mutual TLS, and an
authenticated worker can send any bytes it likes anyway (validation and robust aggregation deal
with that), so a cryptographic hash buys nothing here, at about ten times the CPU on each side
(SHA-256 ~1.5 GB/s, XXH3-128 ~20 GB/s on one core of the benchmark box).
"""

from __future__ import annotations

import mmap
import tempfile
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import xxhash
from numpy.typing import NDArray

from powertrip.v1 import common_pb2

MiB = 1 << 20
# Under the aggregator's 1 MiB mmap threshold (services/common/memory.py), so the per-chunk
# buffers (gRPC's message bytes, protobuf's copy, the chunk's data) come from the heap rather
# than a fresh mmap + page faults + munmap each: a 256 MiB upload ran ~1.7x faster than with
# 2 MiB chunks and peaked lower under 8 concurrent uploads (benchmarks/README.md, upload).
DEFAULT_CHUNK_BYTES = 512 << 10
ALLOWED_DTYPES = ("float16", "float32", "float64", "int32", "int64")
FINITE_BLOCK = 1 << 16  # elements per isfinite() call: a small reused mask, no big temporary


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
        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize


def specs_of(params: Mapping[str, NDArray]) -> list[TensorSpec]:
    return [TensorSpec(n, tuple(int(s) for s in a.shape), a.dtype.name) for n, a in params.items()]


def stream_header(params: Mapping[str, NDArray]) -> common_pb2.TensorStreamHeader:
    specs = specs_of(params)
    return common_pb2.TensorStreamHeader(
        tensors=[common_pb2.TensorSpec(name=s.name, shape=s.shape, dtype=s.dtype) for s in specs],
        total_bytes=sum(s.nbytes for s in specs),
    )


def chunk_views(
    params: Mapping[str, NDArray], chunk_bytes: int = DEFAULT_CHUNK_BYTES
) -> Iterator[tuple[int, list[memoryview]]]:
    """(offset, views) per chunk: the views, concatenated, are the chunk's bytes. Nothing is
    copied yet, so a sender can copy once, straight into what it puts on the wire. Tensors are
    made contiguous little-endian one at a time: sending holds one tensor plus one chunk."""
    offset = 0
    pending: list[memoryview] = []
    pending_bytes = 0
    for spec in specs_of(params):
        arr = np.ascontiguousarray(params[spec.name], dtype=np.dtype(spec.dtype).newbyteorder("<"))
        view = memoryview(arr.reshape(-1).view(np.uint8))
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
    params: Mapping[str, NDArray], chunk_bytes: int = DEFAULT_CHUNK_BYTES
) -> Iterator[
    common_pb2.TensorStreamHeader | common_pb2.TensorChunk | common_pb2.TensorStreamTrailer
]:
    """Header, chunks, trailer. Chunks are cut lazily, so sending needs one chunk of memory."""
    yield stream_header(params)
    digest = new_digest()
    for offset, views in chunk_views(params, chunk_bytes):
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


class TensorStreamReceiver:
    """Validates and spools one incoming stream; ``pieces()`` replays it once it is complete.

    ``expected`` pins the tensor set, shapes and dtypes (an update must match the model); without
    it any allowed spec up to ``max_total_bytes`` is accepted (a worker receiving the model).
    """

    def __init__(
        self,
        expected: list[TensorSpec] | None = None,
        max_total_bytes: int = 8 << 30,
        max_chunk_bytes: int = 4 * MiB,
        spool_bytes: int = 1 * MiB,  # in memory up to here: each concurrent stream's share
    ) -> None:
        self._expected = expected
        self._max_total = max_total_bytes
        self._max_chunk = max_chunk_bytes
        # Closed by close()/__exit__: the spool outlives this call by design.
        self._spool = tempfile.SpooledTemporaryFile(max_size=spool_bytes)  # noqa: SIM115
        self._digest = new_digest()
        self.specs: list[TensorSpec] = []
        self.total_bytes = 0
        self.received = 0
        self.complete = False
        self._bounds: list[tuple[int, int, np.dtype]] = []  # (start, end, dtype) per tensor
        self._carry = b""  # the start of an element split across two chunks
        self._mask = np.empty(FINITE_BLOCK, dtype=bool)  # isfinite's output, reused

    def close(self) -> None:
        self._spool.close()

    def __enter__(self) -> TensorStreamReceiver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def header(self, msg: common_pb2.TensorStreamHeader) -> None:
        if self.specs:
            raise StreamError("sequence", "a second tensor header in one stream")
        specs = [TensorSpec(t.name, tuple(int(d) for d in t.shape), t.dtype) for t in msg.tensors]
        if not specs:
            raise StreamError("tensor_set", "the tensor header lists no tensors")
        for s in specs:
            if s.dtype not in ALLOWED_DTYPES:
                raise StreamError("dtype", f"tensor {s.name!r} has unsupported dtype {s.dtype!r}")
            if any(d < 0 for d in s.shape):
                raise StreamError("shape", f"tensor {s.name!r} has a negative dimension")
        if self._expected is not None:
            _match(specs, self._expected)
        total = sum(s.nbytes for s in specs)
        if total != msg.total_bytes:
            raise StreamError(
                "size", f"header says {msg.total_bytes} bytes but the tensors hold {total}"
            )
        if total > self._max_total:
            raise StreamError("size", f"stream of {total} bytes exceeds {self._max_total}")
        start = 0
        for s in specs:
            self._bounds.append((start, start + s.nbytes, np.dtype(s.dtype).newbyteorder("<")))
            start += s.nbytes
        self.specs, self.total_bytes = specs, total

    def chunk(self, msg: common_pb2.TensorChunk) -> None:
        if not self.specs:
            raise StreamError("sequence", "a chunk arrived before the tensor header")
        if msg.offset_bytes != self.received:
            raise StreamError(
                "sequence",
                f"chunk at offset {msg.offset_bytes}, expected {self.received} "
                "(missing, duplicated or out-of-order chunk)",
            )
        data = msg.data
        if not data or len(data) > self._max_chunk:
            raise StreamError("size", f"chunk of {len(data)} bytes (limit {self._max_chunk})")
        if self.received + len(data) > self.total_bytes:
            raise StreamError("size", "chunks exceed the size announced in the header")
        self._check_finite(self.received, data)
        self._digest.update(data)
        self._spool.write(data)
        self.received += len(data)

    def trailer(self, msg: common_pb2.TensorStreamTrailer) -> None:
        if self.received != self.total_bytes:
            raise StreamError(
                "truncated", f"stream ended after {self.received} of {self.total_bytes} bytes"
            )
        if msg.xxh3_128 != self._digest.hexdigest():
            raise StreamError("checksum", "XXH3-128 checksum of the received bytes does not match")
        self.complete = True

    def consume(self, messages: Iterable[Any]) -> None:
        """Feed a request stream whose ``oneof part`` carries header / chunk / trailer."""
        for msg in messages:
            part = msg.WhichOneof("part")
            if part == "header":
                self.header(msg.header)
            elif part == "chunk":
                self.chunk(msg.chunk)
            elif part == "trailer":
                self.trailer(msg.trailer)
            else:
                raise StreamError("sequence", f"unexpected {part!r} inside a tensor stream")
        if not self.complete:
            raise StreamError("truncated", "the tensor stream ended without its trailer")

    def _check_finite(self, offset: int, data: bytes) -> None:
        """Scan the values in ``data``, carrying a partial element across chunk boundaries.

        Works on memoryview slices of the chunk (no copy); only an element split across two
        chunks is joined, a few bytes. Tensors end on element boundaries, so the carry never
        crosses from one tensor into the next."""
        view = memoryview(data)
        end = offset + len(view)
        for (lo, hi, dtype), spec in zip(self._bounds, self.specs, strict=True):
            if hi <= offset or lo >= end:
                continue
            part = view[max(lo, offset) - offset : min(hi, end) - offset]
            size = dtype.itemsize
            if self._carry:
                take = min(size - len(self._carry), len(part))
                self._carry += bytes(part[:take])
                part = part[take:]
                if len(self._carry) < size:
                    continue
                self._scan(self._carry, dtype, spec.name)
                self._carry = b""
            usable = len(part) - len(part) % size
            if usable < len(part):
                self._carry = bytes(part[usable:])
            if usable:
                self._scan(part[:usable], dtype, spec.name)

    def _scan(self, buf: bytes | memoryview, dtype: np.dtype, name: str) -> None:
        if dtype.kind != "f":
            return
        values = np.frombuffer(buf, dtype=dtype)
        for i in range(0, values.size, FINITE_BLOCK):
            block = values[i : i + FINITE_BLOCK]
            if not np.isfinite(block, out=self._mask[: block.size]).all():
                raise StreamError("non_finite", f"tensor {name!r} contains NaN or Inf")

    def pieces(self, piece_bytes: int = 4 * MiB) -> Iterator[tuple[str, int, NDArray]]:
        """(tensor name, first flat element index, values) covering every tensor in order.

        The values are a view of ONE buffer that every piece is read into (``readinto``, no
        fresh multi-MiB allocation, hence no mmap/munmap and page faults per piece): a piece is
        valid until the next one is asked for. A caller that keeps values must copy them (the
        FedAvg fold adds them into its sums, a robust rule copies them into its own update,
        ``arrays()`` into the result).
        """
        if not self.complete:
            raise RuntimeError("stream is not complete")
        self._spool.seek(0)
        # A page-aligned anonymous map, not a bytearray: reading the spool into a malloc'd
        # multi-MiB buffer ran at ~2.6 GB/s on the benchmark VM, into this one at ~15 GB/s.
        # Unmapped when the last view of it goes.
        buf = memoryview(mmap.mmap(-1, max(piece_bytes, 16)))
        for (lo, hi, dtype), spec in zip(self._bounds, self.specs, strict=True):
            step = max(dtype.itemsize, piece_bytes - piece_bytes % dtype.itemsize)
            pos = lo
            while pos < hi:
                n = min(step, hi - pos)
                if self._spool.readinto(buf[:n]) != n:
                    raise RuntimeError("the spool is shorter than the stream it holds")
                values = np.frombuffer(buf[:n], dtype=dtype)
                yield (
                    spec.name,
                    (pos - lo) // dtype.itemsize,
                    values.astype(dtype.newbyteorder("="), copy=False),
                )
                pos += n
            if lo == hi:
                yield spec.name, 0, np.empty(0, dtype=dtype)

    def arrays(self) -> dict[str, NDArray]:
        """The whole stream as arrays (for a model the receiver must hold anyway)."""
        out = {s.name: np.empty(s.shape, dtype=np.dtype(s.dtype)) for s in self.specs}
        for name, start, values in self.pieces():
            flat = out[name].reshape(-1)
            flat[start : start + values.size] = values
        return out


def _match(got: list[TensorSpec], expected: list[TensorSpec]) -> None:
    want = {s.name: s for s in expected}
    names = {s.name for s in got}
    if names != want.keys() or len(got) != len(expected):
        missing = sorted(want.keys() - names)
        extra = sorted(names - want.keys())
        raise StreamError(
            "tensor_set",
            f"update tensors differ from the model: missing {missing}, unexpected {extra}",
        )
    for s in got:
        w = want[s.name]
        if s.shape != w.shape:
            raise StreamError("shape", f"tensor {s.name!r} has shape {s.shape}, expected {w.shape}")
        if s.dtype != w.dtype:
            raise StreamError("dtype", f"tensor {s.name!r} has dtype {s.dtype}, expected {w.dtype}")
