"""What the split-KV decode kernel pulls into L2 for the projection after attention.

A decode step's attention is bound by latency, not bandwidth: at the seed context one
program a (row, kv head), tens of programs over ~1 MB of cache a layer, so DRAM idles
for its microseconds, and the GEMV after it (o_proj; phi-2's out-projection) then starts
cold. models/decode_attention.py's ``partial`` kernel takes that weight and a byte
count: extra programs past the (row, kv head) pairs each issue one prefetch a thread
into L2 and exit, so the GEMV finds the weight's first bytes read (docs/perf-notes.md,
attempt 71; ``--extra attention_prefetch=MiB``, backends/shared/model_options.py).

- Mode 1, Hopper's bulk prefetch (``cp.async.bulk.prefetch.L2.global``, sm_90 and
  later): one instruction of PREFETCH_CHUNK bytes a thread, no registers held, no wait.
- Mode 3, ``prefetch.global.L2`` a 128-byte line at a time: the sweep's other form
  (benchmarks/attention_prefetch.py swaps ``PREFETCH_BY``); level with mode 1 at 1 KiB.
- Mode 2, Triton's interpreter (which runs no PTX): a load a chunk, the tests' stand-in,
  which checks that the extra programs leave the attention alone.

The asm is pure, so torch's analysis of the kernel (which Inductor and aoti run before
they lower it) finds the weight never written and copies none; its opaque zero feeds a
store that is never taken, or Triton would drop the asm as unused.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .lazy_kernels import interpreting

# What each prefetching thread pulls into L2 in one instruction (a multiple of 16, as
# the bulk prefetch takes; 1 KiB was the best of 1 and 4 KiB on three models), and the
# threads of a prefetching program at the kernel's 4 warps (each thread one chunk).
PREFETCH_CHUNK = 1024
PREFETCH_THREADS = 128
# One bulk prefetch of $3 bytes at $1 where $2 is non-zero; $0 is the opaque zero.
BULK_PTX = (
    "{ .reg .pred p; setp.ne.b32 p, $2, 0;"
    " @p cp.async.bulk.prefetch.L2.global [$1], $3; mov.u32 $0, 0; }"
)
# One 128-byte line at $1 where $2 is non-zero (mode 3).
LINE_PTX = "{ .reg .pred p; setp.ne.b32 p, $2, 0; @p prefetch.global.L2 [$1]; mov.u32 $0, 0; }"
# The form a GPU of sm_90 or later runs: 1 (bulk) or 3 (lines).
PREFETCH_BY = 1


@dataclass(frozen=True)
class Prefetch:
    """A launch's prefetch: ``mode`` 0 (none), 1, 2 or 3 (the module docstring), over
    ``chunks`` of PREFETCH_CHUNK bytes by ``programs`` extra programs."""

    mode: int = 0
    chunks: int = 0
    threads: int = PREFETCH_THREADS  # a program's: 32 x the launch's warps

    @property
    def programs(self) -> int:
        return -(-self.chunks // self.threads) if self.mode else 0


def plan(
    after_bytes: int, weight_bytes: int, mode: int, threads: int = PREFETCH_THREADS
) -> Prefetch:
    """The prefetch of the first ``after_bytes`` (at most the weight's ``weight_bytes``)
    in whole chunks, by ``mode`` (0: none), ``threads`` a program."""
    chunks = min(after_bytes, weight_bytes) // PREFETCH_CHUNK
    return Prefetch(mode, chunks, threads) if mode and chunks > 0 else Prefetch()


def mode(device: torch.device) -> int:
    """How the kernel prefetches on ``device``: PREFETCH_BY on sm_90 and later, a load a
    chunk under the interpreter, nothing elsewhere (no bulk prefetch there)."""
    if interpreting():
        return 2
    if device.type == "cuda" and torch.cuda.get_device_capability(device) >= (9, 0):
        return PREFETCH_BY
    return 0
