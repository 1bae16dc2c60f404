"""The build workers' GPU timing lock: exclusive across processes, re-entrant in one,
and entered by every Inductor GPU benchmark once installed."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from artifactcache.backends.shared.gpu_timing import LOCK_NAME, GpuTimingLock

_HOLDER = """
import sys, time
sys.path[0] = {root!r}
from pathlib import Path
from artifactcache.backends.shared.gpu_timing import GpuTimingLock
lock = GpuTimingLock(Path({path!r}))
with lock():
    print("held", flush=True)
    time.sleep({hold})
"""
_ROOT = str(Path(__file__).resolve().parents[1])


def test_a_second_process_waits_for_the_holder(tmp_path: Path):
    path = tmp_path / LOCK_NAME
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER.format(root=_ROOT, path=str(path), hold=1.5)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        t0 = time.monotonic()
        with GpuTimingLock(path)():
            waited = time.monotonic() - t0
    finally:
        holder.wait(30)
    assert waited >= 0.5, waited  # it got the lock only once the holder let go


def test_the_lock_is_reentrant_and_released_after_the_outermost_exit(tmp_path: Path):
    path = tmp_path / LOCK_NAME
    lock = GpuTimingLock(path)
    with lock():
        with lock():  # a benchmark method calling another: no deadlock
            pass
        assert lock._fd is not None  # still held by the outer one
    assert lock._fd is None
    # Released: another process takes it at once.
    other = subprocess.run(
        [sys.executable, "-c", _HOLDER.format(root=_ROOT, path=str(path), hold=0)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert other.stdout.strip() == "held"


def test_inductor_gpu_benchmarks_enter_the_lock(tmp_path: Path, monkeypatch):
    """Installed through torch's hook where it has one, else by wrapping the benchmark
    methods; either way a GPU benchmark call runs inside the lock."""
    benchmarking = pytest.importorskip("torch._inductor.runtime.benchmarking")
    from artifactcache.backends.shared.torch_private import gpu_benchmarks_under

    entered: list[str] = []

    class Recording(GpuTimingLock):
        def __call__(self):
            entered.append("lock")
            return super().__call__()

    for name in ("benchmark_gpu", "benchmark_gpu_with_cuda_graph"):
        for cls in vars(benchmarking).values():
            if isinstance(cls, type) and name in vars(cls):
                monkeypatch.setattr(cls, name, vars(cls)[name])  # restored after the test
    if hasattr(benchmarking, "set_gpu_benchmark_lock_context"):
        monkeypatch.setattr(benchmarking, "_gpu_benchmark_lock_context", None)
        gpu_benchmarks_under(Recording(tmp_path / LOCK_NAME))
        with benchmarking.maybe_gpu_benchmark_lock():
            pass
        assert entered == ["lock"]
        # The older torches' route: the methods themselves wrapped (with torch's hook
        # unset, as on those torches: two locks on one file would wait on each other).
        benchmarking.set_gpu_benchmark_lock_context(None)
        monkeypatch.delattr(benchmarking, "set_gpu_benchmark_lock_context")
        entered.clear()
    gpu_benchmarks_under(Recording(tmp_path / LOCK_NAME))
    with pytest.raises(Exception):  # noqa: B017 - no GPU here: the call fails inside the lock
        benchmarking.InductorBenchmarker().benchmark_gpu(lambda: None)
    assert entered and entered[0] == "lock"
