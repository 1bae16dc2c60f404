"""How an aoti or inductor build is scheduled, and what a worker takes from the building
process.

How many of its steps build at once, each in a worker process (build_jobs.py), and how
long the workers may take: ACACHE_BUILD_JOBS, else the device, the CPUs this process
may use (its affinity, capped by a cgroup CPU quota, as in a container), the free
memory, and whether this process's Inductor config can be carried to a worker at all.
The scheduling changes no file: both paths build the same ones.

What is carried (``process_state``, applied in the worker by ``apply_process_state``):
the torch state that shapes the generated code, so it is in the key's sources.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from ... import settings
from ...devices import is_cuda
from ...errors import BackendError
from ...host import usable_cores

if TYPE_CHECKING:
    from ...choices import BuildChoices

JOBS_ENV = "ACACHE_BUILD_JOBS"
TIMEOUT_ENV = "ACACHE_BUILD_TIMEOUT"
DEFAULT_TIMEOUT_S = settings.SETTINGS[TIMEOUT_ENV].default  # 7200.0
# Usable cores from which a CPU build runs its steps concurrently by default. On the
# 2-core dev VM the concurrent tiny-llama build was no faster than the serial one
# (docs/perf-notes.md, attempt 12): one compile already keeps more than one core busy,
# and the workers' start-up costs CPU time of its own. 8 allows ~4 cores per worker.
MIN_CPU_CORES = 8


def _jobs_asked() -> str:
    return settings.raw(JOBS_ENV).strip()


def _jobs_given() -> int | None:
    """ACACHE_BUILD_JOBS as a number, None when unset; a bad value is one line."""
    raw = _jobs_asked()
    if not raw:
        return None
    try:
        n = int(raw)
    except ValueError:
        n = 0
    if n < 1:
        raise BackendError(
            f"{JOBS_ENV} must be a whole number >= 1 (1 builds the steps one "
            f"after the other in this process), not {raw!r}"
        )
    return n


def build_jobs(device: str, n_steps: int) -> int:
    """How many steps to build at once: ACACHE_BUILD_JOBS, else all of them on CUDA and
    on CPUs with at least MIN_CPU_CORES usable cores, else 1 (the serial path)."""
    n = _jobs_given()
    if n is not None:
        return min(n, n_steps)
    if is_cuda(device) or usable_cores() >= MIN_CPU_CORES:
        return n_steps
    return 1


def check_build_settings() -> None:
    """Parse the build's ACACHE_* variables (jobs, timeout): the first
    bad value is its one-line error. make_context calls it with the arguments, so a bad
    one is refused before the cache is opened, not once a build holds its lock."""
    _jobs_given()
    build_timeout()


def inductor_config_left_behind() -> list[str]:
    """Inductor config entries, changed in this process, that a build worker would not
    get (process_state sends the portable config only): custom passes and the like."""
    if "torch._inductor.config" not in sys.modules:  # unimported: nothing changed
        return []
    from .torch_private import portable_inductor_config

    return portable_inductor_config()[1]


def planned_jobs(recipe: Any, opts: BuildChoices, n_steps: int) -> int:
    """build_jobs(), but serial where the workers could not build what this process would,
    or, by default, where they would not fit in memory.

    A worker compiles under the Inductor config it was sent; an entry that cannot be sent
    (a custom pass) would be missing there, and its files would not be the serial
    build's. The default is then the serial path; an explicit ACACHE_BUILD_JOBS > 1 is
    refused (one line), since no worker can do what it asks.

    Each worker holds the model and its KV cache, so concurrency needs that memory once
    per worker, where the serial path (and the fit check before any build) needs it
    once. On memory, an explicit ACACHE_BUILD_JOBS is taken as asked.
    """
    from ...sizing import FIT_FRACTION, available_memory, memory_needed

    jobs = build_jobs(opts.device, n_steps)
    if jobs == 1:
        return 1
    asked = bool(_jobs_asked())
    if left := inductor_config_left_behind():
        if asked:
            raise BackendError(
                f"this process's Inductor config sets {', '.join(left)}, which a build "
                f"worker cannot be sent; set {JOBS_ENV}=1 to build the steps in "
                "this process"
            )
        return 1
    if asked:
        return jobs
    free = available_memory(opts.device)
    if free is not None and jobs * memory_needed(recipe, opts.dtype)["total"] > FIT_FRACTION * free:
        return 1
    return jobs


def build_timeout() -> float:
    raw = settings.raw(TIMEOUT_ENV).strip()
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

    from ...code_factors import matmul_precision

    state: dict[str, Any] = {
        "matmul": matmul_precision(),
        "deterministic": torch.are_deterministic_algorithms_enabled(),
        "deterministic_warn_only": torch.is_deterministic_algorithms_warn_only_enabled(),
        "inductor_config": None,
    }
    if "torch._inductor.config" in sys.modules:
        from .torch_private import portable_inductor_config

        # Where this leaves a change behind, planned_jobs chose the serial path.
        state["inductor_config"] = portable_inductor_config()[0]
    return state


def apply_process_state(state: dict[str, Any]) -> None:
    """Make this (worker) process's torch state the parent's; a state that does not
    stick is a BackendError, since the key would then describe another artifact."""
    import torch

    from ...code_factors import matmul_precision

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
        from .torch_private import load_inductor_config

        load_inductor_config(state["inductor_config"])
