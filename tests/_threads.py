"""Calling one function from several threads released at the same moment."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any


def call_at_once(fn: Callable[[], Any], n: int) -> list[Any]:
    """``fn()`` in ``n`` threads that a barrier lets go together; their results."""
    start = threading.Barrier(n)
    results: list[Any] = []

    def worker() -> None:
        start.wait()
        results.append(fn())

    threads = [threading.Thread(target=worker) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results
