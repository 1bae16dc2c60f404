"""Class attributes of Inductor replaced process-wide while at least one scope is open.

inductor/autotune_cache.py and cpu_isa.py each replace private methods of torch's classes for the
span of a build or load. The replacement is process-wide, and builds and loads may
overlap in threads (a pass step opened later re-enters a load's scope), so one
``ProcessPatches`` per user installs its replacements when the first scope opens and
puts torch's own back when the last one closes: never a half-patched class, never a
replacement kept as if it were torch's.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any


class ProcessPatches:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.depth = 0  # scopes open now
        self._real: dict[tuple[Any, str], Any] = {}

    def replace(self, owner: Any, name: str, new: Any) -> None:
        """For an ``install`` to call: ``owner.name`` becomes ``new`` until the last
        scope closes."""
        self._real[(owner, name)] = getattr(owner, name)
        setattr(owner, name, new)

    @contextlib.contextmanager
    def scope(self, install: Callable[[], None]) -> Iterator[None]:
        """Open a scope; the first one open runs ``install`` (under the lock)."""
        with self._lock:
            if self.depth == 0:
                install()
            self.depth += 1
        try:
            yield
        finally:
            with self._lock:
                self.depth -= 1
                if self.depth == 0:
                    for (owner, name), real in self._real.items():
                        setattr(owner, name, real)
                    self._real.clear()
