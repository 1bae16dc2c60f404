"""What this host lets the process use: CPUs and memory, as a container sees them.

A container's cgroup caps what the machine's own counters show: a container given 2 CPUs
and 8 GB of a 64-core, 512 GB host sees 64 CPUs in its affinity and 500 GB available in
/proc/meminfo. Builds size their worker count and the weights they may load from these,
so both read the cgroup too (v2, or v1's cpu and memory controllers), as the container
sees its own cgroup at ``root``. Torch-free: the store, the CLI and sizing import it.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
# Where cgroup v1 mounts the cpu controller: alone, or joined with cpuacct.
_CGROUP_V1_CPU_DIRS = ("cpu", "cpu,cpuacct")


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def cgroup_cpu_limit(root: Path = CGROUP_ROOT) -> int | None:
    """The CPUs this process's cgroup CPU quota amounts to, ceil(quota / period) and at
    least 1; None where there is none.

    cgroup v2: ``cpu.max`` holds "<quota> <period>", or "max <period>" for no quota.
    cgroup v1: ``cpu.cfs_quota_us`` (-1 for none) over ``cpu.cfs_period_us``. Both as a
    container sees its own cgroup at ``root``.
    """
    v2 = _read(root / "cpu.max")
    if v2 is not None:
        quota, _, period = v2.partition(" ")
    else:
        quota = period = ""
        for d in _CGROUP_V1_CPU_DIRS:
            q, p = _read(root / d / "cpu.cfs_quota_us"), _read(root / d / "cpu.cfs_period_us")
            if q is not None and p is not None:
                quota, period = q, p
                break
    try:
        q, p = int(quota), int(period)
    except ValueError:  # "max", or no such files
        return None
    if q <= 0 or p <= 0:
        return None
    return max(1, math.ceil(q / p))


def usable_cores(cgroup_root: Path | None = None) -> int:
    """The CPUs this process may run on (its affinity), capped by its cgroup CPU quota
    (under ``cgroup_root``, else CGROUP_ROOT): a container given 2 CPUs of a 64-core host
    sees all 64 in its affinity."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    limit = cgroup_cpu_limit(CGROUP_ROOT if cgroup_root is None else cgroup_root)
    return cores if limit is None else min(cores, limit)


# Where cgroup v1 mounts the memory controller.
_CGROUP_V1_MEMORY_DIR = "memory"
# cgroup v1 writes "no limit" as a huge page-aligned number (PAGE_COUNTER_MAX pages);
# anything this large is no limit.
_NO_MEMORY_LIMIT = 1 << 60


def cgroup_memory_available(root: Path | None = None) -> int | None:
    """Bytes this process's cgroup still allows: its memory limit less its working set
    (usage less the inactive file cache, which the kernel reclaims before it kills: the
    figure container tools report); None where there is no limit.

    cgroup v2: ``memory.max`` ("max" for none) and ``memory.current``.
    cgroup v1: ``memory/memory.limit_in_bytes`` and ``memory/memory.usage_in_bytes``.
    Under ``root``, else CGROUP_ROOT.
    """
    root = CGROUP_ROOT if root is None else root
    v1 = _CGROUP_V1_MEMORY_DIR
    files = (
        ("memory.max", "memory.current", "memory.stat", "inactive_file"),
        (f"{v1}/memory.limit_in_bytes", f"{v1}/memory.usage_in_bytes", f"{v1}/memory.stat",
         "total_inactive_file"),
    )  # fmt: skip
    for limit_file, usage_file, stat_file, inactive_key in files:
        limit = _read(root / limit_file)
        if limit is None:
            continue
        try:
            cap = int(limit)
        except ValueError:  # "max"
            return None
        if cap >= _NO_MEMORY_LIMIT:
            return None
        try:
            used = int(_read(root / usage_file) or 0)
        except ValueError:
            used = 0
        used -= min(used, _stat(root / stat_file).get(inactive_key, 0))
        return max(0, cap - used)
    return None


def _stat(path: Path) -> dict[str, int]:
    """A cgroup ``memory.stat`` file as {name: bytes}; {} where unreadable."""
    out: dict[str, int] = {}
    for line in (_read(path) or "").splitlines():
        name, _, value = line.partition(" ")
        if value.strip().isdigit():
            out[name] = int(value)
    return out
