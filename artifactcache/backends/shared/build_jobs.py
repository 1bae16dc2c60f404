"""How an aoti or inductor build schedules its steps: one after the other in the
building process, or each in a worker process of its own, up to ACACHE_BUILD_JOBS at a
time.

Why processes: Inductor's lowering, codegen and autotuning run in Python, holding the
GIL, so two threads would take turns. Why a fresh interpreter running
build_worker.py's ``main`` (``worker_argv``) rather than a fork: the building
process may hold a CUDA context, which a forked child cannot use. Why not
multiprocessing's spawn: it re-imports the caller's main module, and a script that
calls ``build()`` without a ``__main__`` guard would then build again inside each worker.

A worker is told (pickled on its stdin) the backend, the recipe, the options, the
weights and the
codegen-relevant process state the key names (fp32 matmul precision, TF32), plus the
deterministic-algorithms switch and, where this process imported Inductor, its portable
config (where that leaves a change behind, a custom pass say, build_plan.py keeps the
build serial). It rebuilds the model as the serial path does (``build_model_for``: the same
weights, fused projections, quantization) and runs the backend's ``worker_step``, which
runs the serial path's own code for that one step (aoti: ``build_step``, a ``.so`` under
``<step>/``; inductor: the step's saved function, its kernels under the job's scratch
folder for the parent to merge). So its files are the serial build's, and its timings
are under the same keys. A worker needs real tensors on the device, but not the
real weights' values: the compile reads the constants' device, dtype and strides, and
autotuning times kernels on inputs it generates itself. It still loads the checkpoint
when there is one, so a build from a bad checkpoint fails as it does serially.

The workers inherit the environment, so they use the TORCHINDUCTOR_CACHE_DIR and
TRITON_CACHE_DIR a serial build in this process would (an inductor worker compiles
under fresh ones of its own, as its serial build does). Inductor writes its caches
atomically and under file locks, as its own compile workers share them. For aoti the
parent runs the compiler probe (cxx.py) while the workers import, build the model and
export, and sends each worker the resulting Inductor config before it compiles;
inductor has no probe, and its workers are sent an empty config at once.

Where no worker succeeds: an ``AcacheError`` it raised is raised here with the same
class and message; any other exception (a bug, an Inductor crash) becomes a
``BuildWorkerFailed``, which keeps the worker's traceback as acache keeps a bug's.
A step whose worker ran out of GPU memory (torch's OutOfMemoryError, or CUDA's "out of
memory" where the worker could not even create its context) is built once more, in a
worker of its own once nothing else of the build runs (a warning says so): another
build that started at the same time passes the same memory check (build_plan.py) and
takes what this one counted on. A second failure is the error, in one line.
A worker that dies before its report is a one-line ``BackendError``; one that saved its
step (the report is its last write) has built it, however it then exits (an odd exit is
a warning). Past ``ACACHE_BUILD_TIMEOUT``, the one line names what still ran: the
compiler probe, each worker's phase (from its progress file) and the steps still
waiting for a worker. The other workers are stopped at once, each one's process group
killed (Inductor's own compile workers included), and a worker whose parent dies exits
on its own.
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
from typing import TYPE_CHECKING, Any

from ...errors import AcacheError, BackendError
from ...store.manifest import path_problem
from .build_plan import JOBS_ENV, TIMEOUT_ENV, build_timeout, process_state

if TYPE_CHECKING:
    from ...choices import BuildChoices
    from ..base import BuildContext

_POLL_S = 0.1
LOG_TAIL_LINES = 40
_STOP_GRACE_S = 5.0
# How long a worker that saved its step may take to exit (Inductor's compile workers and
# CUDA wind down first) before it is stopped; its step is kept either way.
_EXIT_GRACE_S = 30.0
# What a worker is doing, as its progress file names it; before it writes one, it is
# starting (a fresh interpreter importing torch to read its job).
STARTING = "starting"
WAITING_FOR_PROBE = "waiting for the compiler probe"


class BuildWorkerFailed(RuntimeError):
    """A worker's step failed with an exception that is no AcacheError: acache's bug or
    the compiler's, reported with the worker's traceback."""


# ------------------------------------------------------------------ parent --


@dataclass(frozen=True)
class StepJob:
    """What one worker builds, and where it reports."""

    backend: str  # "aoti" or "inductor": the package whose BACKEND.worker_step runs
    step: str
    recipe: Any
    opts: BuildChoices
    weights: Any
    workdir: Path
    scratch: Path
    result: Path  # the worker's report: a pickled dict, written last
    state: dict[str, Any] = field(default_factory=dict)
    parent_pid: int = 0
    memo_dir: Path | None = None  # the cache root's memos (aoti's CPU ISA verdicts)

    @property
    def progress(self) -> Path:
        """Where the worker names the phase it is in (one line, replaced whole)."""
        return self.result.with_suffix(".phase")

    def mark(self, phase: str) -> None:
        """Name the worker's phase, for the parent's timeout message (only that: a write
        that fails fails no build)."""
        tmp = self.progress.with_suffix(".phase-tmp")
        try:
            tmp.write_text(phase)
            os.replace(tmp, self.progress)
        except OSError:
            pass

    @property
    def what(self) -> str:
        """The step by backend and name, as messages say it: "the aoti decode step"."""
        return f"the {self.backend} {self.step} step"

    def phase(self) -> str:
        try:
            return self.progress.read_text().strip() or STARTING
        except OSError:
            return STARTING


def worker_argv() -> list[str]:
    """The worker's command line. It imports the acache this process runs (the key names
    its sources), wherever that came from: the folder holding this package goes first on
    its path, in place of the working directory that `-m` or `-c` would put there."""
    here = str(Path(__file__).resolve().parents[len(__name__.split(".")) - 1])
    worker = __name__.rpartition(".")[0] + ".build_worker"
    boot = f"import sys; sys.path[0] = {here!r}; from {worker} import main; sys.exit(main())"
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

    def odd_exit(self, grace: float) -> str | None:
        """How a worker that saved its step ended, where that was not a plain exit 0:
        its code, or that it was stopped after ``grace`` seconds still running."""
        try:
            code = self.proc.wait(max(grace, 0.0))
        except subprocess.TimeoutExpired:
            self.stop()
            return "was still running after saving its step, and was stopped"
        return None if code == 0 else f"exited with {_exit_status(code)} after saving its step"

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
    """The worker's AcacheError, rebuilt here: its own class with the worker's message
    as it was (a class whose constructor words its argument, TorchPrivateAPIMissing's,
    is not constructed again), else a BackendError."""
    try:
        cls = getattr(importlib.import_module(module), name)
        if isinstance(cls, type) and issubclass(cls, AcacheError):
            err = cls.__new__(cls)
            Exception.__init__(err, message)
            return err
    except Exception:  # an unimportable module, an odd class: the message stays
        pass
    return BackendError(message)


def _exit_status(code: int) -> str:
    return f"signal {-code}" if code < 0 else f"exit code {code}"


def worker_failure(what: str, report: dict[str, Any] | None, code: int) -> Exception:
    """What a failed worker's step (``what``: StepJob.what) raises here, from its report
    and exit code."""
    if report is not None and "error" in report:
        err = report["error"]
        if err["acache"]:
            return _acache_error(err["module"], err["type"], err["message"])
        if out_of_memory(report):  # the GPU's state, not a bug: no traceback
            first = (err["message"].strip().splitlines() or ["?"])[0]
            return BackendError(
                f"{what} ran out of GPU memory in its build worker, also when built "
                f"alone ({first}): free the GPU's memory (nvidia-smi shows who holds it) "
                "and build again"
            )
        return BuildWorkerFailed(
            f"{what} failed in its build worker "
            f"(rerun with {JOBS_ENV}=1 to build in this process):\n{err['traceback']}"
        )
    how = _exit_status(code)
    hint = ", out of memory?" if code == -signal.SIGKILL else ""
    return BackendError(
        f"{what}'s build worker died ({how}{hint}) before finishing; "
        f"rerun with {JOBS_ENV}=1 to build in this process"
    )


def out_of_memory(report: dict[str, Any] | None) -> bool:
    """Whether a worker's report says its step ran out of GPU memory: torch's
    OutOfMemoryError, or CUDA's own error where the worker's first allocation creates
    its context (torch.AcceleratorError, RuntimeError before torch 2.8): an aoti build
    beside another 7B one on an H100 stopped so, 2026-12-06."""
    err = (report or {}).get("error")
    if not err or err["acache"]:
        return False
    if err["type"] == "OutOfMemoryError":
        return True
    cuda_error = err["type"] in ("AcceleratorError", "RuntimeError")
    return cuda_error and "CUDA error: out of memory" in err["message"]


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


def saved_step(w: _Worker, report: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """The worker's report (``report``, or read here) where it says its step is built;
    None while it has none.

    The report is the worker's last write, after its step's files are in place, so a
    worker that saved one has built its step, however it exits afterwards (a crash in
    interpreter shutdown, a hang there). A report of a library that is not there is a
    BackendError; one that carries an error is that error (worker_failure).
    """
    report = report if report is not None else w.report()
    if report is None:
        return None
    if "error" in report:
        raise worker_failure(w.job.what, report, 1)
    # The file's path goes into the manifest, which loaders follow: inside workdir only.
    if path_problem(report.get("file")) or not (w.job.workdir / report["file"]).is_file():
        raise BackendError(
            f"{w.job.what}'s build worker reported {report.get('file')!r}, which "
            f"is not there; rerun with {JOBS_ENV}=1 to build in this process"
        )
    return report


def timeout_error(
    pending: list[_Worker],
    probe: Future,
    timeout: float,
    queued: list[str] | None = None,
    backend: str = "",
) -> BackendError:
    """What ran past the timeout, by name: the compiler probe, each unfinished worker
    with the phase it was in (a step hung at its start, its model, its export, its
    compile, or waiting for that probe), and the steps still waiting for a worker."""
    running = [] if probe.done() else ["the C++ compiler probe (in this process)"]
    running += [f"the {w.job.step} step ({w.job.phase()})" for w in pending]
    waiting = [f"the {step} step (for a worker: {JOBS_ENV})" for step in queued or []]
    backend = backend or (pending[0].job.backend if pending else "")
    what = f"the {backend} build" if backend else "the build"
    parts = [f"still running: {'; '.join(running)}"] if running else []
    parts += [f"waiting: {'; '.join(waiting)}"] if waiting else []
    return BackendError(
        f"{what} took longer than {timeout:g} s{''.join('; ' + p for p in parts)}; set "
        f"{TIMEOUT_ENV} to a longer time in seconds"
    )


def _wait(
    workers: list[_Worker],
    probe: Future,
    deadline: float,
    timeout: float,
    queued: list[str],
    start: Callable[[str], _Worker],
    drop: Callable[[_Worker], None] = lambda w: None,
) -> None:
    """Until every worker saved its step, handing each the probe's config once it is known,
    and starting a ``queued`` step each time a worker saves one (``start`` adds its worker
    to ``workers``). A step that ran out of GPU memory is held (``drop`` takes its
    worker) and started again once no other worker runs; only once.

    The first failure (a worker's, the probe's, or the deadline) raises at once, so a
    worker that fails while the probe still runs is reported without waiting for it.
    """
    pending, cfg, queued = list(workers), None, list(queued)
    held: list[str] = []  # out of memory beside other workers: built again alone
    retried: set[str] = set()

    def launch(step: str) -> None:
        nxt = start(step)
        pending.append(nxt)
        if cfg is not None:
            nxt.send(cfg)

    while pending or held:
        if not pending:
            launch(held.pop(0))
        if cfg is None and probe.done():
            cfg = probe.result()  # raises what the probe raised
            for w in workers:
                w.send(cfg)
        for w in list(pending):
            code = w.proc.poll()  # before the report: an exited worker wrote all it will
            report = w.report()
            if out_of_memory(report) and w.job.step not in retried:
                retried.add(w.job.step)
                held.append(w.job.step)
                pending.remove(w)
                drop(w)
            elif saved_step(w, report) is not None:
                pending.remove(w)
                if queued:
                    launch(queued.pop(0))
            elif code is not None:
                raise worker_failure(w.job.what, report, code)
        if pending and time.monotonic() > deadline:
            raise timeout_error(pending, probe, timeout, queued + held)
        time.sleep(_POLL_S)


def _warn(ctx: BuildContext, message: str) -> None:
    if ctx.progress:
        ctx.progress(f"warning: {message}")
    else:
        sys.stderr.write(f"warning: {message}\n")
        sys.stderr.flush()


def build_concurrently(
    backend: str,
    ctx: BuildContext,
    workdir: Path,
    scratch: Path,
    steps: Iterable[str],
    probe: Callable[[], dict[str, Any]] | None,
    jobs: int | None = None,
) -> tuple[dict[str, str], dict[str, float]]:
    """Each step in a worker running ``backend``'s ``worker_step``, ``jobs`` at a time
    (None: all at once); (step -> its file relative to workdir, timings). A queued
    step's worker starts when a running one has saved its step; that worker exits right
    after (one that lingers is stopped after
    _EXIT_GRACE_S, below), so about ``jobs`` models are in memory at once.

    ``probe`` returns what each worker is sent once it is known (aoti: the Inductor
    config); it runs on a thread here (it waits on its own child process) while the
    workers start. None (inductor): no probe, each worker is sent ``{}`` at once.
    Timings: the serial path's keys, plus ``compiler_probe`` (where there is one) and
    each step's ``_child_start`` (spawn to the worker's first
    line), ``_imports``, ``_model``, ``_probe_wait`` and ``_worker`` (spawn to its report).
    """
    timeout = build_timeout()
    deadline = time.monotonic() + timeout
    state = process_state()
    timings: dict[str, float] = {}

    def timed_probe() -> dict[str, Any]:
        assert probe is not None
        t0 = time.perf_counter()
        cfg = probe()
        timings["compiler_probe"] = round(time.perf_counter() - t0, 3)
        return cfg

    probed: Future = Future()
    if probe is None:
        probed.set_result({})

    with tempfile.TemporaryDirectory(prefix=f"acache-{backend}-build-") as tmp:
        workers: list[_Worker] = []

        def start(step: str) -> _Worker:
            job = StepJob(backend, step, ctx.recipe, ctx.opts, ctx.weights, workdir, scratch,
                          Path(tmp) / f"{step}.report", state, os.getpid(),
                          ctx.memo_dir)  # fmt: skip
            worker = _Worker(job, Path(tmp) / f"{step}.log")
            workers.append(worker)  # before the send, so `finally` stops it
            try:
                worker.send(job)
            except (pickle.PicklingError, TypeError, AttributeError) as e:
                raise BackendError(
                    f"{job.what}'s options cannot be sent to a build worker "
                    f"({type(e).__name__}: {e}); set {JOBS_ENV}=1 to build serially"
                ) from None
            return worker

        def drop(w: _Worker) -> None:
            # Its report goes too: the step's next worker reports to the same file.
            w.stop()
            workers.remove(w)
            w.job.result.unlink(missing_ok=True)
            _warn(ctx, f"{w.job.what} ran out of GPU memory beside other work; building "
                       "it again once nothing else of this build runs")  # fmt: skip

        order = list(steps)
        at_once = len(order) if jobs is None else max(1, jobs)
        try:
            for step in order[:at_once]:
                start(step)
            if probe is not None:
                probed = _in_thread(timed_probe)
            _wait(workers, probed, deadline, timeout, order[at_once:], start, drop)
            exits_by = time.monotonic() + _EXIT_GRACE_S
            odd = {w.job.step: w.odd_exit(exits_by - time.monotonic()) for w in workers}
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
        files: dict[str, str] = {}
        for w in workers:
            w.forward_log()
            if how := odd[w.job.step]:
                _warn(ctx, f"{w.job.what}'s build worker {how}; its step is kept")
            report = w.report()
            assert report is not None  # _wait checked it
            files[w.job.step] = report["file"]
            step = w.job.step
            timings[f"{step}_child_start"] = round(report["started"] - w.spawned, 3)
            timings[f"{step}_worker"] = round(report["finished"] - w.spawned, 3)
            timings.update(report["timings"])
    return files, timings
