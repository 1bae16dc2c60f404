"""Triton's cache key (``triton_key()``), hashed on a thread beside a warm load.

Triton-private, not torch-private: ``triton.runtime.cache.triton_key`` is Triton's own
memoized function, which Inductor's kernel lookups call.
"""

from __future__ import annotations

import contextlib
import pkgutil
import threading
from pathlib import Path


def prefetch_triton_key() -> threading.Thread | None:
    """Start Triton's ``triton_key()`` on a thread; None where Triton has none.

    The first Triton cache lookup of a process hashes Triton's sources and its ~500 MB
    ``libtriton.so`` (0.27 s in the profile of a warm llama-7b inductor load on the
    H200, docs/perf-notes.md attempt 31). hashlib lets go of the GIL while it hashes,
    so started at the top of a load the hash runs beside the device and weights set-up
    (torch ops, which let go of it too) rather than in front of the first kernel
    (attempt 41). The result lands in Triton's own memo; a lookup before the thread
    ends computes it again: the same key, later. The packages the hash walks are
    imported here first, so the thread itself imports nothing (no import-lock
    interplay with the loading thread).
    """
    try:
        import triton.runtime.cache as cache
    except ImportError:
        return None
    root = Path(cache.__file__).resolve().parents[1]
    for sub in ("compiler", "backends", "language"):
        for _ in pkgutil.walk_packages([str(root / sub)], prefix=f"triton.{sub}."):
            pass  # walking imports each package; the modules are only found

    def hash_quietly() -> None:
        with contextlib.suppress(Exception):  # a real failure recurs, and is reported, at use
            cache.triton_key()

    thread = threading.Thread(target=hash_quietly, name="acache-triton-key", daemon=True)
    thread.start()
    return thread
