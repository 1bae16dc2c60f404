"""CPU seconds for a build's phase record: this process's, and its finished children's.

A phase whose own CPU seconds fall far under its wall seconds either waited for a core
or waited for child processes: g++ on AOTInductor's C++ wrapper and kernels runs as a
child that the compile waits for, and its CPU seconds show up here once it exits.
Inductor's pool of compile workers outlives the phase, so their seconds do not.
"""

from __future__ import annotations

try:
    import resource
except ImportError:  # not POSIX: no children's figure
    resource = None  # type: ignore[assignment]


def children_cpu_seconds() -> float:
    """User + system CPU seconds of this process's children that have exited and been
    waited for, so far; 0.0 where the platform does not say."""
    if resource is None:
        return 0.0
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime
