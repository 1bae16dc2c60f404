"""One GPU's kernel timings taken one build worker at a time.

The steps of a build compile at once, each in a worker process (build_jobs.py), and
Inductor times candidate kernels on the GPU in each of them: autotuning Triton configs
and coordinate descent. Two workers timing at the same moment share the GPU, and each
measures the other's kernels too, so a tuning may pick a slower config and the artifact
decodes slower for good. A worker therefore takes an exclusive file lock, shared by the
build's workers, around each timing (``torch_private.gpu_benchmarks_under``); their
compiles (CPU work) still overlap.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from pathlib import Path

try:
    import fcntl
except ImportError:  # not POSIX: no lock, as before
    fcntl = None  # type: ignore[assignment]

LOCK_NAME = ".gpu-timing.lock"
TIMING_LOCK_ENV = "ACACHE_BUILD_TIMING_LOCK"  # 0: the timings overlap, to measure the lock


class GpuTimingLock:
    """An exclusive lock across processes on ``path`` (flock), re-entrant within this
    process: Inductor's benchmark methods call one another, each taking it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._mutex = threading.RLock()
        self._depth = 0
        self._fd: int | None = None

    @contextlib.contextmanager
    def __call__(self) -> Iterator[None]:
        with self._mutex:
            if self._depth == 0:
                self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
                if fcntl is not None:
                    fcntl.flock(self._fd, fcntl.LOCK_EX)
            self._depth += 1
            try:
                yield
            finally:
                self._depth -= 1
                if self._depth == 0 and self._fd is not None:
                    os.close(self._fd)  # closing the last descriptor releases the flock
                    self._fd = None
