"""host: the CPUs and memory a container's cgroup leaves this process."""

from __future__ import annotations

import os

import pytest
from _cgroup_util import cgroup_tree

from artifactcache import host, sizing
from artifactcache.host import cgroup_memory_available, usable_cores

V1 = ("cpu/cpu.cfs_quota_us", "cpu/cpu.cfs_period_us")
V1_JOINED = ("cpu,cpuacct/cpu.cfs_quota_us", "cpu,cpuacct/cpu.cfs_period_us")


@pytest.mark.parametrize(
    ("files", "want"),
    [
        ({}, 8),  # no cgroup files: the affinity
        ({"cpu.max": "max 100000"}, 8),  # v2, no quota
        ({"cpu.max": "150000 100000"}, 2),  # 1.5 CPUs: rounded up
        ({"cpu.max": "20000 100000"}, 1),  # a fifth of a CPU: at least 1
        ({"cpu.max": "1600000 100000"}, 8),  # more than the affinity: the affinity
        (dict(zip(V1, ("-1", "100000"), strict=True)), 8),  # v1, no quota
        (dict(zip(V1, ("300000", "100000"), strict=True)), 3),
        (dict(zip(V1_JOINED, ("200000", "100000"), strict=True)), 2),
    ],
)
def test_usable_cores_honour_the_cgroup_cpu_quota(tmp_path, monkeypatch, files, want):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)), raising=False)
    assert usable_cores(cgroup_tree(tmp_path, files)) == want


@pytest.mark.parametrize(
    ("files", "want"),
    [
        ({}, None),  # no cgroup files
        ({"memory.max": "max", "memory.current": "100"}, None),  # v2, no limit
        ({"memory.max": "8000", "memory.current": "3000"}, 5000),
        ({"memory.max": "8000", "memory.current": "9000"}, 0),  # over: nothing left
        ({"memory.max": "8000"}, 8000),  # no usage file: the limit
        # page cache the kernel can drop is not used memory (the working set is)
        ({"memory.max": "8000", "memory.current": "7000",
          "memory.stat": "anon 1000\ninactive_file 5000\nactive_file 1000"}, 6000),
        ({"memory/memory.limit_in_bytes": "4096", "memory/memory.usage_in_bytes": "4000",
          "memory/memory.stat": "total_inactive_file 3000"}, 3096),
        ({"memory/memory.limit_in_bytes": "9223372036854771712",
          "memory/memory.usage_in_bytes": "5"}, None),  # v1's "no limit"
        ({"memory/memory.limit_in_bytes": "4096", "memory/memory.usage_in_bytes": "1024"},
         3072),
        ({"memory.max": "lots"}, None),  # unreadable: no limit rather than a wrong one
    ],
)  # fmt: skip
def test_the_cgroup_memory_limit_less_its_usage(tmp_path, files, want):
    assert cgroup_memory_available(cgroup_tree(tmp_path, files)) == want


def test_available_memory_on_cpu_is_capped_by_thecgroup_tree(tmp_path, monkeypatch):
    """A container given 1 MiB of a big host: the fit check sees 1 MiB, not the host's RAM."""
    root = cgroup_tree(tmp_path, {"memory.max": str(2**20), "memory.current": "0"})
    monkeypatch.setattr(host, "CGROUP_ROOT", root)
    monkeypatch.setattr(sizing, "_meminfo_available", lambda: 10**12)
    assert sizing.available_memory("cpu") == 2**20
    (root / "memory.max").write_text("max\n")
    assert sizing.available_memory("cpu") == 10**12


def test_the_weights_loader_threads_follow_the_usable_cores(monkeypatch):
    from artifactcache.models import safetensors_io

    monkeypatch.delenv(safetensors_io.THREADS_ENV, raising=False)
    monkeypatch.setattr(safetensors_io, "usable_cores", lambda: 2)
    assert safetensors_io.resolve_threads(None) == 2
    monkeypatch.setattr(safetensors_io, "usable_cores", lambda: 64)
    assert safetensors_io.resolve_threads(None) == safetensors_io.DEFAULT_MAX_THREADS
