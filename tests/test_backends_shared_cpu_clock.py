"""The children's CPU seconds a build's phases record (backends/shared/cpu_clock.py)."""

from __future__ import annotations

import subprocess
import sys

from artifactcache.backends.shared.cpu_clock import children_cpu_seconds


def test_a_finished_child_s_cpu_seconds_are_counted():
    before = children_cpu_seconds()
    busy = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass"
    subprocess.run([sys.executable, "-c", busy], check=True)
    # The child spun for at least 0.3 CPU-seconds of its own; its interpreter start adds more.
    assert children_cpu_seconds() - before >= 0.3
