"""Profiles each acache build worker with cProfile when ``ACACHE_WORKER_PROFILE`` names a
folder: put this folder first on PYTHONPATH.

For the question "where do the inductor decode step's ~65 CPU-seconds in its worker go"
(docs/perf-notes.md, attempt 52): only processes running
``artifactcache.backends.shared.build_worker`` are profiled; each writes
``ACACHE_WORKER_PROFILE/worker-<pid>.prof`` at exit (``python -m pstats`` reads it, or
``python benchmarks/workerprofile/top.py FOLDER``), timed by the main thread's CPU
clock. Not imported by acache; a measuring aid only. First on PYTHONPATH, it shadows the
interpreter's own sitecustomize (and childlog/'s: use one at a time).
"""

from __future__ import annotations

import atexit
import os
import sys

_DIR = os.environ.get("ACACHE_WORKER_PROFILE")


def _is_build_worker() -> bool:
    """A worker runs ``python -c "...build_worker..."``: sys.argv holds only "-c"."""
    try:
        with open("/proc/self/cmdline", "rb") as f:
            return b"build_worker" in f.read()
    except OSError:
        return any("build_worker" in a for a in sys.argv)


if _DIR and _is_build_worker():
    import cProfile
    import time

    # CPU time of the main thread, where Inductor lowers, generates and tunes; wall time
    # would rank the waits first (the parent's config on stdin, the compile pool).
    _profile = cProfile.Profile(time.thread_time)

    def _dump() -> None:
        _profile.disable()
        os.makedirs(_DIR, exist_ok=True)
        _profile.dump_stats(os.path.join(_DIR, f"worker-{os.getpid()}.prof"))

    atexit.register(_dump)
    _profile.enable()
