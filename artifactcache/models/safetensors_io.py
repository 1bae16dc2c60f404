"""Reading safetensors files onto a GPU at memory speed: our own header parse, then
byte ranges read by several threads through pinned staging buffers.

Why not ``safe_open(device="cuda")``: it materializes one tensor at a time, each
through a pageable host copy, which ran at 4.4 GB/s on an H200 host from the page
cache. safetensors (0.8) exposes no data offsets, so the header is parsed here; the
format is stable and documented: an 8-byte little-endian header length N, N bytes of
JSON mapping each tensor name to ``{"dtype", "shape", "data_offsets": [begin, end]}``
(offsets relative to the byte after the header), plus an optional ``__metadata__``.

Each thread owns two staging buffers (pinned on CUDA) and a stream. It reads a batch
(up to ``chunk_bytes`` of consecutive file bytes, so the many small norm weights
travel together) into one buffer with ``readinto`` on an unbuffered file (CPython
releases the GIL around it, so threads copy out of the page cache in parallel),
queues the host-to-device copies with ``non_blocking=True`` on its stream, records an
event, and reads the next batch into its other buffer; a buffer is refilled only
after its event has completed. The same bookkeeping runs on CPU destinations (no
streams), which is how it is tested without a GPU; a CPU *load* maps the files
instead (weights.py says why).
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import queue
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from .. import settings
from ..errors import ArgumentError, WeightsError
from ..host import usable_cores

THREADS_ENV = "ACACHE_LOAD_THREADS"
CHUNK_MB_ENV = "ACACHE_LOAD_CHUNK_MB"
DEFAULT_MAX_THREADS = 8  # page-cache copies stop scaling well before a host's core count
DEFAULT_CHUNK_MB = settings.SETTINGS[CHUNK_MB_ENV].default  # 16
_HEADER_LIMIT = 100_000_000  # safetensors' own bound on the JSON header
_ALIGN = 4096  # pieces start at multiples of this inside a tensor: element-aligned for any dtype

# safetensors dtype code -> (torch dtype name, bytes per element). Float codes are what a
# model can load; the others are named so that the refusal can say what the tensor is.
_DTYPES: dict[str, tuple[str, int]] = {
    "F64": ("float64", 8), "F32": ("float32", 4), "F16": ("float16", 2),
    "BF16": ("bfloat16", 2), "F8_E4M3": ("float8_e4m3fn", 1), "F8_E5M2": ("float8_e5m2", 1),
    "I64": ("int64", 8), "I32": ("int32", 4), "I16": ("int16", 2), "I8": ("int8", 1),
    "U64": ("uint64", 8), "U32": ("uint32", 4), "U16": ("uint16", 2), "U8": ("uint8", 1),
    "BOOL": ("bool", 1),
}  # fmt: skip
_FLOATS = ("F64", "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2")


@dataclass(frozen=True)
class StoredTensor:
    """Where one tensor's bytes are in a safetensors file."""

    name: str
    path: Path
    code: str  # the safetensors dtype code, e.g. "BF16"
    shape: tuple[int, ...]
    offset: int  # absolute, in the file
    nbytes: int

    @property
    def is_float(self) -> bool:
        return self.code in _FLOATS

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, _DTYPES[self.code][0])

    def describe_dtype(self) -> str:
        return f"torch.{_DTYPES[self.code][0]}"


def _corrupt(path: Path, why: str) -> WeightsError:
    return WeightsError(f"{path}: not a readable safetensors file ({why})")


def _is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def read_header(path: Path) -> list[StoredTensor]:
    """Every tensor of ``path`` in file order; a one-line WeightsError for a corrupt header."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            head = f.read(8)
            if len(head) < 8:
                raise _corrupt(path, f"{size} bytes, shorter than the 8-byte header length")
            n = int.from_bytes(head, "little")
            if n > min(size - 8, _HEADER_LIMIT):
                raise _corrupt(path, f"header length {n} exceeds the file's {size} bytes")
            raw = f.read(n)
    except OSError as e:
        raise WeightsError(f"{path}: cannot read ({e.strerror or e})") from None
    try:
        header = json.loads(raw)
    except ValueError as e:  # UnicodeDecodeError is a ValueError too
        raise _corrupt(path, f"header is not valid JSON: {e}") from None
    if not isinstance(header, dict):
        raise _corrupt(path, "header is not a JSON object")
    base = 8 + n
    out = []
    for name, info in header.items():
        if name == "__metadata__":
            continue
        out.append(_stored(path, name, info, base, size))
    return sorted(out, key=lambda t: t.offset)


def _stored(path: Path, name: str, info: object, base: int, size: int) -> StoredTensor:
    if not isinstance(info, dict):
        raise _corrupt(path, f"entry of tensor '{name}' is not an object")
    code, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
    if not isinstance(code, str) or code not in _DTYPES:
        raise WeightsError(f"{path}: tensor '{name}' has dtype {code!r}, expected a float dtype")
    if not isinstance(shape, list) or not all(_is_int(d) and d >= 0 for d in shape):
        raise _corrupt(path, f"tensor '{name}' has shape {shape!r}")
    if (
        not isinstance(offsets, list)
        or len(offsets) != 2
        or not all(_is_int(o) for o in offsets)
        or not 0 <= offsets[0] <= offsets[1]
        or base + offsets[1] > size
    ):
        raise _corrupt(path, f"tensor '{name}' has data_offsets {offsets!r} outside the file")
    nbytes = offsets[1] - offsets[0]
    if nbytes != math.prod(shape) * _DTYPES[code][1]:
        raise _corrupt(
            path, f"tensor '{name}' holds {nbytes} bytes, its dtype and shape need "
            f"{math.prod(shape) * _DTYPES[code][1]}",
        )  # fmt: skip
    return StoredTensor(name, path, code, tuple(shape), base + offsets[0], nbytes)


# ------------------------------------------------------------------ options --


def _positive_env(name: str) -> int | None:
    # Bounded (settings: 1 to 2**16): 10**30 threads or MiB is a typo that would exhaust
    # the host, not a setting.
    return settings.get(name)


def resolve_threads(threads: int | None) -> int:
    """``threads``, else $ACACHE_LOAD_THREADS, else min(8, the CPUs this process may use:
    its affinity under its cgroup quota); one-line error if < 1."""
    if threads is None:
        threads = _positive_env(THREADS_ENV) or min(DEFAULT_MAX_THREADS, usable_cores())
    if not _is_int(threads) or threads < 1:
        raise ArgumentError(f"the weights loader's thread count must be >= 1, got {threads!r}")
    return threads


def resolve_chunk_bytes(chunk_bytes: int | None) -> int:
    """``chunk_bytes``, else $ACACHE_LOAD_CHUNK_MB MiB, else 16 MiB; a multiple of 4 KiB."""
    if chunk_bytes is None:
        chunk_bytes = (_positive_env(CHUNK_MB_ENV) or DEFAULT_CHUNK_MB) << 20
    if not _is_int(chunk_bytes) or chunk_bytes < _ALIGN or chunk_bytes % _ALIGN:
        raise ArgumentError(
            f"the weights loader's chunk size must be a positive multiple of {_ALIGN} bytes, "
            f"got {chunk_bytes!r}"
        )
    return chunk_bytes


# ------------------------------------------------------------------ reading --


@dataclass(frozen=True)
class Piece:
    """A slice of one stored tensor, bound for the same slice of its destination."""

    src: StoredTensor
    dest: torch.Tensor  # the whole destination: contiguous, its final dtype and device
    start: int  # bytes into the stored tensor; a multiple of _ALIGN
    nbytes: int

    @property
    def file_offset(self) -> int:
        return self.src.offset + self.start

    def dest_bytes(self) -> torch.Tensor:
        """The destination's bytes this piece fills (same dtype as stored)."""
        return (
            self.dest.detach().reshape(-1).view(torch.uint8)[self.start : self.start + self.nbytes]
        )

    def dest_elements(self) -> torch.Tensor:
        """The destination's elements this piece fills (any dtype)."""
        item = _DTYPES[self.src.code][1]
        first = self.start // item
        return self.dest.detach().reshape(-1)[first : first + self.nbytes // item]

    @property
    def converts(self) -> bool:
        return self.src.torch_dtype != self.dest.dtype


def split(pairs: Sequence[tuple[StoredTensor, torch.Tensor]], chunk_bytes: int) -> list[Piece]:
    """Pieces of at most ``chunk_bytes`` each, in file order."""
    pieces = []
    for src, dest in sorted(pairs, key=lambda p: (str(p[0].path), p[0].offset)):
        for start in range(0, src.nbytes, chunk_bytes):
            pieces.append(Piece(src, dest, start, min(chunk_bytes, src.nbytes - start)))
    return pieces


def batches(pieces: Sequence[Piece], chunk_bytes: int) -> list[list[Piece]]:
    """Runs of pieces that are consecutive in one file and fit one staging buffer together."""
    out: list[list[Piece]] = []
    size = 0
    for p in pieces:
        last = out[-1][-1] if out else None
        if (
            last is not None
            and last.src.path == p.src.path
            and last.file_offset + last.nbytes == p.file_offset
            and size + p.nbytes <= chunk_bytes
        ):
            out[-1].append(p)
            size += p.nbytes
        else:
            out.append([p])
            size = p.nbytes
    return out


class _Files:
    """One thread's unbuffered handles, so seek + readinto never races another thread."""

    def __init__(self) -> None:
        self._open: dict[Path, io.FileIO] = {}

    def read_exact(self, path: Path, offset: int, into: memoryview) -> None:
        f = self._open.get(path)
        if f is None:
            try:
                f = self._open[path] = io.FileIO(path, "rb")
            except OSError as e:
                raise WeightsError(f"{path}: cannot read ({e.strerror or e})") from None
        f.seek(offset)
        done = 0
        while done < len(into):
            try:
                n = f.readinto(into[done:])
            except OSError as e:
                raise WeightsError(f"{path}: cannot read ({e.strerror or e})") from None
            if not n:
                raise WeightsError(
                    f"{path}: the file ends at byte {offset + done}, before the tensor data its "
                    "header lists (was it truncated or rewritten while loading?)"
                )
            done += n

    def close(self) -> None:
        for f in self._open.values():
            f.close()


def _writable(t: torch.Tensor) -> memoryview:
    """A CPU uint8 tensor's memory as a writable buffer."""
    return memoryview(t.numpy()).cast("B")


def _deliver(staged: torch.Tensor, piece: Piece, cuda: bool) -> None:
    """Copy a piece from host memory into its destination, converting its dtype if needed."""
    if not piece.converts:
        piece.dest_bytes().copy_(staged, non_blocking=cuda)
        return
    if cuda:
        # Converting during a pinned->device copy would make torch convert on the host
        # first (pageable, synchronous); convert on the device instead.
        raw = torch.empty(piece.nbytes, dtype=torch.uint8, device=piece.dest.device)
        raw.copy_(staged, non_blocking=True)
    elif staged.storage_offset() % _DTYPES[piece.src.code][1]:
        raw = staged.clone()  # a batch keeps the file's layout, which need not be aligned
    else:
        raw = staged
    piece.dest_elements().copy_(raw.view(piece.src.torch_dtype))


def _drain(work: queue.SimpleQueue[list[Piece]], failed: threading.Event) -> Iterator[list[Piece]]:
    while not failed.is_set():
        try:
            yield work.get_nowait()
        except queue.Empty:
            return


def _staged_worker(
    work: queue.SimpleQueue[list[Piece]],
    failed: threading.Event,
    chunk_bytes: int,
    device: torch.device,
    after: torch.cuda.Event | None,
) -> None:
    """Read batches into two staging buffers in turn and copy each to the destination.

    On CUDA the buffers are pinned and the copies asynchronous on this thread's stream;
    a buffer is read into again only after the event recorded behind its copies has
    completed. Returns when everything it queued is on the device.
    """
    cuda = device.type == "cuda"
    files = _Files()
    stream = torch.cuda.Stream(device) if cuda else None
    where = torch.cuda.device(device) if cuda else contextlib.nullcontext()
    on_stream = torch.cuda.stream(stream) if cuda else contextlib.nullcontext()
    try:
        with where, on_stream:
            if stream is not None and after is not None:
                stream.wait_event(after)  # the destinations' memory is free on this stream too
            bufs = [torch.empty(chunk_bytes, dtype=torch.uint8, pin_memory=cuda) for _ in "ab"]
            views = [_writable(b) for b in bufs]
            done: list[torch.cuda.Event | None] = [None, None]
            for i, batch in enumerate(_drain(work, failed)):
                b = i % 2
                if (ev := done[b]) is not None:
                    ev.synchronize()  # the copies out of this buffer have finished
                first, total = batch[0].file_offset, sum(p.nbytes for p in batch)
                files.read_exact(batch[0].src.path, first, views[b][:total])
                for p in batch:
                    at = p.file_offset - first
                    _deliver(bufs[b][at : at + p.nbytes], p, cuda)
                if stream is not None:
                    # blocking: a thread waiting for its buffer sleeps instead of spinning
                    # on a core that another thread's read needs.
                    done[b] = ev = torch.cuda.Event(blocking=True)
                    ev.record(stream)
    finally:
        files.close()
        if stream is not None:
            # Also after an error: nothing may still write into memory the caller frees.
            stream.synchronize()


def read_into(
    pairs: Sequence[tuple[StoredTensor, torch.Tensor]], *, threads: int, chunk_bytes: int
) -> None:
    """Fill each destination with its stored tensor's bytes (converted to its dtype).

    Destinations must be contiguous and on one device. Returns when every byte is
    there (on CUDA: the copies have completed). On any error the other threads stop
    at their next batch, then it is raised.
    """
    if not pairs:
        return
    devices = {dest.device for _, dest in pairs}
    if len(devices) != 1:
        raise ValueError(f"destinations on several devices: {sorted(map(str, devices))}")
    device = devices.pop()
    work: queue.SimpleQueue[list[Piece]] = queue.SimpleQueue()
    todo = batches(split(pairs, chunk_bytes), chunk_bytes)
    for batch in todo:
        work.put(batch)
    after = None
    if device.type == "cuda":
        # Workers write on their own streams: order them after whatever the caller's
        # stream did with this memory before (the caching allocator may have reused it).
        after = torch.cuda.Event()
        after.record(torch.cuda.current_stream(device))
    failed = threading.Event()
    errors: list[BaseException] = []

    def run() -> None:
        try:
            _staged_worker(work, failed, chunk_bytes, device, after)
        except BaseException as e:  # handed to the caller below, after every thread stopped
            errors.append(e)
            failed.set()

    workers = [threading.Thread(target=run, daemon=True) for _ in range(min(threads, len(todo)))]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    if errors:
        raise errors[0]
