"""How an aoti build schedules its two steps: one after the other in the building
process, or each in a worker process of its own at the same time.

Why processes: Inductor's lowering, codegen and autotuning run in Python, holding the
GIL, so two threads would take turns. Why a fresh interpreter running this module's
``main`` (``worker_argv``) rather than a fork: the building
process may hold a CUDA context, which a forked child cannot use. Why not
multiprocessing's spawn: it re-imports the caller's main module, and a script that
calls ``build()`` without a ``__main__`` guard would then build again inside each worker.

A worker is told (pickled on its stdin) the recipe, the options, the weights and the
codegen-relevant process state the key names (fp32 matmul precision, TF32), plus the
deterministic-algorithms switch and, where this process imported Inductor, its config.
It rebuilds the model as the serial path does (``build_model_for``: the same weights,
fused projections, quantization) and runs the serial path's own ``aoti.build_step``.
So its files are the serial build's: ``<step>/`` of the entry, one ``.so`` each, and
timings under the same keys. A worker needs real tensors on the device, but not the
real weights' values: the compile reads the constants' device, dtype and strides, and
autotuning times kernels on inputs it generates itself. It still loads the checkpoint
when there is one, so a build from a bad checkpoint fails as it does serially.

The workers inherit the environment, so they use the TORCHINDUCTOR_CACHE_DIR and
TRITON_CACHE_DIR a serial build in this process would. Inductor writes its caches
atomically and under file locks, as its own compile workers share them. The parent
runs the compiler probe (cxx.py) while the workers import, build the model and
export, and sends each worker the resulting Inductor config before it compiles.

Where no worker succeeds: an ``AcacheError`` it raised is raised here with the same
class and message; any other exception (a bug, an Inductor crash) becomes a
``BuildWorkerFailed``, which keeps the worker's traceback as acache keeps a bug's.
A worker that dies or exceeds ``ACACHE_BUILD_TIMEOUT`` is a one-line ``BackendError``.
The other worker is stopped at once, its process group killed (Inductor's own compile
workers included), and a worker whose parent dies exits on its own.
"""

from __future__ import annotations

import importlib
import os
import pickle
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from ..devices import is_cuda
from ..errors import AcacheError, BackendError

if TYPE_CHECKING:
    from .base import BuildContext, BuildOptions

JOBS_ENV = "ACACHE_BUILD_JOBS"
TIMEOUT_ENV = "ACACHE_BUILD_TIMEOUT"
DEFAULT_TIMEOUT_S = 7200.0
# Usable cores from which a CPU build runs its steps concurrently by default. On the
# 2-core dev VM the concurrent tiny-llama build was no faster than the serial one
# (docs/perf-notes.md, attempt 12): one compile already keeps more than one core busy,
# and the workers' start-up costs CPU time of its own. 8 allows ~4 cores per worker.
MIN_CPU_CORES = 8
_POLL_S = 0.1
LOG_TAIL_LINES = 40
_STOP_GRACE_S = 5.0


class BuildWorkerFailed(RuntimeError):
    """A worker's step failed with an exception that is no AcacheError: acache's bug or
    the compiler's, reported with the worker's traceback."""


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def build_jobs(device: str, n_steps: int) -> int:
    """How many steps to build at once: ACACHE_BUILD_JOBS, else all of them on CUDA and
    on CPUs with at least MIN_CPU_CORES usable cores, else 1 (the serial path)."""
    raw = os.environ.get(JOBS_ENV, "").strip()
    if raw:
        try:
            n = int(raw)
        except ValueError:
            n = 0
        if n < 1:
            raise BackendError(
                f"{JOBS_ENV} must be a whole number >= 1 (1 builds the aoti steps one "
                f"after the other in this process), not {raw!r}"
            )
        return min(n, n_steps)
    if is_cuda(device) or usable_cores() >= MIN_CPU_CORES:
        return n_steps
    return 1


def planned_jobs(recipe: Any, opts: BuildOptions, n_steps: int) -> int:
    """build_jobs(), but serial by default where the workers would not fit in memory.

    Each worker holds the model and its KV cache, so concurrency needs that memory once
    per worker, where the serial path (and the fit check before any build) needs it
    once. An explicit ACACHE_BUILD_JOBS is taken as asked.
    """
    from ..sizing import FIT_FRACTION, available_memory, memory_needed

    jobs = build_jobs(opts.device, n_steps)
    if jobs == 1 or os.environ.get(JOBS_ENV, "").strip():
        return jobs
    free = available_memory(opts.device)
    if free is not None and jobs * memory_needed(recipe, opts.dtype)["total"] > FIT_FRACTION * free:
        return 1
    return jobs


def build_timeout() -> float:
    raw = os.environ.get(TIMEOUT_ENV, "").strip()
    if not raw:
        return DEFAULT_TIMEOUT_S
    try:
        seconds = float(raw)
    except ValueError:
        seconds = 0.0
    if not seconds > 0:  # also refuses nan
        raise BackendError(f"{TIMEOUT_ENV} must be a number of seconds > 0, not {raw!r}")
    return seconds


# ------------------------------------------------------------ process state --


def process_state() -> dict[str, Any]:
    """What of this process's torch state a worker must share: the matmul precision the
    key names (code_factors.matmul_precision), and the deterministic-algorithms switch
    Inductor reads; plus Inductor's config where this process has imported it (an API
    user may have changed it; otherwise the worker's defaults are this process's)."""
    import torch

    from ..code_factors import matmul_precision

    state: dict[str, Any] = {
        "matmul": matmul_precision(),
        "deterministic": torch.are_deterministic_algorithms_enabled(),
        "deterministic_warn_only": torch.is_deterministic_algorithms_warn_only_enabled(),
        "inductor_config": None,
    }
    if "torch._inductor.config" in sys.modules:
        from torch._inductor import config

        state["inductor_config"] = config.save_config_portable()
    return state


def apply_process_state(state: dict[str, Any]) -> None:
    """Make this (worker) process's torch state the parent's; a state that does not
    stick is a BackendError, since the key would then describe another artifact."""
    import torch

    from ..code_factors import matmul_precision

    m = state["matmul"]
    # Only what differs: torch refuses to report a precision set through both its
    # legacy (allow_tf32) and its new API, and the precision sets cuda's TF32 itself.
    if torch.get_float32_matmul_precision() != m["fp32_precision"]:
        torch.set_float32_matmul_precision(m["fp32_precision"])
    if bool(torch.backends.cuda.matmul.allow_tf32) != m["cuda_tf32"]:
        torch.backends.cuda.matmul.allow_tf32 = m["cuda_tf32"]
    if bool(torch.backends.cudnn.allow_tf32) != m["cudnn_tf32"]:
        torch.backends.cudnn.allow_tf32 = m["cudnn_tf32"]
    if matmul_precision() != m:
        raise BackendError(
            f"a build worker could not take this process's matmul precision {m} "
            f"(it has {matmul_precision()}); set {JOBS_ENV}=1 to build in this process"
        )
    wanted = (state["deterministic"], state["deterministic_warn_only"])
    if wanted != (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
    ):  # only then: setting it imports torch._dynamo and Inductor (seconds)
        torch.use_deterministic_algorithms(wanted[0], warn_only=wanted[1])
    if state["inductor_config"] is not None:
        from torch._inductor import config

        config.load_config(state["inductor_config"])


# ------------------------------------------------------------------ parent --


@dataclass(frozen=True)
class StepJob:
    """What one worker builds, and where it reports."""

    step: str
    recipe: Any
    opts: BuildOptions
    weights: Any
    workdir: Path
    scratch: Path
    result: Path  # the worker's report: a pickled dict, written last
    state: dict[str, Any] = field(default_factory=dict)
    parent_pid: int = 0


def worker_argv() -> list[str]:
    """The worker's command line. It imports the acache this process runs (the key names
    its sources), wherever that came from: the folder holding this package goes first on
    its path, in place of the working directory that `-m` or `-c` would put there."""
    here = str(Path(__file__).resolve().parents[2])
    boot = f"import sys; sys.path[0] = {here!r}; from {__name__} import main; sys.exit(main())"
    return [sys.executable, "-c", boot]


class _Worker:
    def __init__(self, job: StepJob, log: Path) -> None:
        self.job, self.log = job, log
        self.spawned = time.monotonic()
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(
                worker_argv(),
                stdin=subprocess.PIPE,
                stdout=out,  # never this process's stdout: `--json` output stays clean
                stderr=subprocess.STDOUT,
                # Its own process group: stop() takes Inductor's compile workers too.
                start_new_session=True,
            )

    def send(self, obj: Any) -> None:
        assert self.proc.stdin is not None
        try:
            pickle.dump(obj, self.proc.stdin)
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            pass  # it died; wait() reports how

    def report(self) -> dict[str, Any] | None:
        try:
            return pickle.loads(self.job.result.read_bytes())
        except (OSError, EOFError, pickle.UnpicklingError):
            return None

    def stop(self) -> None:
        if self.proc.stdin is not None:
            try:
                self.proc.stdin.close()
            except OSError:
                pass
        if self.proc.poll() is not None:
            return
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                return
            try:
                self.proc.wait(_STOP_GRACE_S)
                return
            except subprocess.TimeoutExpired:
                continue

    def forward_log(self, tail_lines: int | None = None) -> None:
        """What the worker printed (Inductor's warnings), as a serial build shows it; the
        last ``tail_lines`` lines only, where given (a failed worker's last words)."""
        try:
            text = self.log.read_bytes()
        except OSError:
            return
        if tail_lines is not None:
            text = b"\n".join(text.splitlines()[-tail_lines:]) + b"\n" if text else text
        if text:
            sys.stderr.write(text.decode(errors="replace"))
            sys.stderr.flush()


def _acache_error(module: str, name: str, message: str) -> AcacheError:
    """The worker's AcacheError, rebuilt here: its own class where that takes the
    message alone (every one in errors.py does), else a BackendError."""
    try:
        cls = getattr(importlib.import_module(module), name)
        if isinstance(cls, type) and issubclass(cls, AcacheError):
            return cls(message)
    except Exception:  # an unimportable module or another constructor: the message stays
        pass
    return BackendError(message)


def worker_failure(step: str, report: dict[str, Any] | None, code: int) -> Exception:
    """What a failed worker's step raises here, from its report and exit code."""
    if report is not None and "error" in report:
        err = report["error"]
        if err["acache"]:
            return _acache_error(err["module"], err["type"], err["message"])
        return BuildWorkerFailed(
            f"the aoti {step} step failed in its build worker "
            f"(rerun with {JOBS_ENV}=1 to build in this process):\n{err['traceback']}"
        )
    how = f"signal {-code}" if code < 0 else f"exit code {code}"
    hint = ", out of memory?" if code == -signal.SIGKILL else ""
    return BackendError(
        f"the aoti {step} step's build worker died ({how}{hint}) before finishing; "
        f"rerun with {JOBS_ENV}=1 to build in this process"
    )


def _in_thread(fn: Callable[[], Any]) -> Future:
    """fn's result as a Future, from a daemon thread: a failed build is reported (and
    its process may exit) without waiting for a probe still running, which finishes on
    its own."""
    fut: Future = Future()

    def run() -> None:
        try:
            fut.set_result(fn())
        except BaseException as e:  # handed to the waiting thread, which raises it
            fut.set_exception(e)

    threading.Thread(target=run, daemon=True, name="acache-cxx-probe").start()
    return fut


def _wait(workers: list[_Worker], probe: Future, deadline: float, timeout: float) -> None:
    """Until every worker succeeded, handing each the probe's config once it is known.

    The first failure (a worker's, the probe's, or the deadline) raises at once, so a
    worker that fails while the probe still runs is reported without waiting for it.
    """
    pending, sent = list(workers), False
    while pending:
        if not sent and probe.done():
            cfg = probe.result()  # raises what the probe raised
            for w in workers:
                w.send(cfg)
            sent = True
        for w in list(pending):
            code = w.proc.poll()
            if code is None:
                continue
            pending.remove(w)
            report = w.report()
            if code != 0 or report is None or "error" in report:
                raise worker_failure(w.job.step, report, code)
        if pending and time.monotonic() > deadline:
            raise BackendError(
                f"the aoti {pending[0].job.step} step took longer than {timeout:g} s to "
                f"build; set {TIMEOUT_ENV} to a longer time in seconds"
            )
        time.sleep(_POLL_S)


def build_concurrently(
    ctx: BuildContext,
    workdir: Path,
    scratch: Path,
    steps: Iterable[str],
    probe: Callable[[], dict[str, Any]],
) -> tuple[dict[str, str], dict[str, float]]:
    """Each step in a worker at once; (step -> .so relative to workdir, timings).

    ``probe`` returns the Inductor config; it runs on a thread here (it waits on its own
    child process) while the workers start. Timings: the serial path's keys, plus
    ``compiler_probe`` and each step's ``_child_start`` (spawn to the worker's first
    line), ``_imports``, ``_model``, ``_probe_wait`` and ``_worker`` (spawn to its report).
    """
    timeout = build_timeout()
    deadline = time.monotonic() + timeout
    state = process_state()
    timings: dict[str, float] = {}

    def timed_probe() -> dict[str, Any]:
        t0 = time.perf_counter()
        cfg = probe()
        timings["compiler_probe"] = round(time.perf_counter() - t0, 3)
        return cfg

    with tempfile.TemporaryDirectory(prefix="acache-aoti-build-") as tmp:
        workers: list[_Worker] = []
        try:
            for step in steps:
                job = StepJob(step, ctx.recipe, ctx.opts, ctx.weights, workdir, scratch,
                              Path(tmp) / f"{step}.report", state, os.getpid())  # fmt: skip
                worker = _Worker(job, Path(tmp) / f"{step}.log")
                workers.append(worker)  # before the send, so `finally` stops it
                try:
                    worker.send(job)
                except (pickle.PicklingError, TypeError, AttributeError) as e:
                    raise BackendError(
                        f"the aoti {step} step's options cannot be sent to a build worker "
                        f"({type(e).__name__}: {e}); set {JOBS_ENV}=1 to build serially"
                    ) from None
            _wait(workers, _in_thread(timed_probe), deadline, timeout)
        except BaseException:
            # The error stays one line; what the workers printed last (an import
            # failure, a compiler crash) goes to stderr before their logs are deleted.
            for w in workers:
                w.stop()
                w.forward_log(tail_lines=LOG_TAIL_LINES)
            raise
        finally:
            for w in workers:
                w.stop()
        sos: dict[str, str] = {}
        for w in workers:
            w.forward_log()
            report = w.report()
            assert report is not None  # _wait checked it
            sos[w.job.step] = report["so"]
            step = w.job.step
            timings[f"{step}_child_start"] = round(report["started"] - w.spawned, 3)
            timings[f"{step}_worker"] = round(report["finished"] - w.spawned, 3)
            timings.update(report["timings"])
    return sos, timings


# ------------------------------------------------------------------ worker --


def _exit_with_parent(parent_pid: int) -> None:
    """A worker outlives no parent: its build could never be published."""

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, daemon=True, name="acache-parent-watch").start()


def _run(job: StepJob, stdin: BinaryIO, started: float, t_imports: float) -> dict[str, Any]:
    from .aoti import BACKEND, build_step
    from .base import BuildContext
    from .runner import build_model_for, device_of

    # From this worker's first line: unpickling the job imported torch already.
    timings = {f"{job.step}_imports": round(time.perf_counter() - t_imports, 3)}
    apply_process_state(job.state)
    t0 = time.perf_counter()
    ctx = BuildContext(recipe=job.recipe, opts=job.opts, weights=job.weights)
    dev = device_of(job.opts)
    model = build_model_for(ctx, dev, BACKEND.name)
    timings[f"{job.step}_model"] = round(time.perf_counter() - t0, 3)

    def config() -> dict[str, Any]:
        return pickle.load(stdin)  # sent once the parent's compiler probe is done

    so = build_step(model, job.recipe, dev, job.step, config, job.workdir, job.scratch, timings)
    return {"so": so, "timings": timings, "started": started, "finished": time.monotonic()}


def main() -> int:
    started, t_imports = time.monotonic(), time.perf_counter()
    stdin = sys.stdin.buffer
    job: StepJob = pickle.load(stdin)
    _exit_with_parent(job.parent_pid)
    try:
        report = _run(job, stdin, started, t_imports)
        code = 0
    except BaseException as e:  # reported to the parent, which decides how it surfaces
        import traceback

        report = {
            "error": {
                "acache": isinstance(e, AcacheError),
                "module": type(e).__module__,
                "type": type(e).__qualname__,
                "message": str(e),
                "traceback": "".join(traceback.format_exception(e)),
            }
        }
        code = 1
    tmp = job.result.with_suffix(".tmp")
    tmp.write_bytes(pickle.dumps(report))
    os.replace(tmp, job.result)  # whole or absent: the parent never reads half a report
    return code


if __name__ == "__main__":
    sys.exit(main())
