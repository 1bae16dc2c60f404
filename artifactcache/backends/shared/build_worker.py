"""The build worker: one step of one aoti or inductor build, in a fresh interpreter
(build_jobs.py starts it).

It reads its ``StepJob`` (pickled) on stdin, rebuilds the model as the serial path does,
runs the job's backend's ``worker_step``, and writes its report (pickled, atomically)
where the job says; see build_jobs.py for why workers are processes and how their
failures surface.
"""

from __future__ import annotations

import importlib
import os
import pickle
import sys
import threading
import time
from typing import Any, BinaryIO

from ...errors import AcacheError, BackendError
from .build_jobs import WAITING_FOR_PROBE, StepJob
from .build_plan import apply_process_state

# The backends whose steps a worker builds: each has BACKEND.worker_step.
WORKER_BACKENDS = ("aoti", "inductor")


def _exit_with_parent(parent_pid: int) -> None:
    """A worker outlives no parent: its build could never be published."""

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, daemon=True, name="acache-parent-watch").start()


def _run(job: StepJob, stdin: BinaryIO, started: float, t_imports: float) -> dict[str, Any]:
    job.mark("importing")
    from ..base import BuildContext
    from .runner import build_model_for, device_of

    if job.backend not in WORKER_BACKENDS:
        raise BackendError(f"no build worker for the {job.backend!r} backend")
    package = __package__.rpartition(".")[0]  # artifactcache.backends
    backend = importlib.import_module(f"{package}.{job.backend}.backend").BACKEND

    # From this worker's first line: unpickling the job imported torch already.
    timings = {f"{job.step}_imports": round(time.perf_counter() - t_imports, 3)}
    apply_process_state(job.state)
    job.mark("building the model")
    t0 = time.perf_counter()
    ctx = BuildContext(recipe=job.recipe, opts=job.opts, weights=job.weights)
    dev = device_of(job.opts)
    model = build_model_for(ctx, dev, backend.name)
    timings[f"{job.step}_model"] = round(time.perf_counter() - t0, 3)

    def config() -> dict[str, Any]:
        job.mark(WAITING_FOR_PROBE)
        cfg = pickle.load(stdin)  # sent once the parent's compiler probe is done
        job.mark("compiling")
        return cfg

    built = backend.worker_step(model, job, dev, config, timings)
    return {"file": built, "timings": timings, "started": started, "finished": time.monotonic()}


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
