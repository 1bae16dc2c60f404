"""The Store protocol: what api/recipe.py (and so every backend's dependencies) asks of a store.

A small set of methods, like sccache's ``Storage`` trait: look up (``get``,
``open``), build once (``get_or_build``), note a load-time dependency, and hold
an entry while it is read. LocalStore implements them; TieredStore puts the remote
behind them; the measurement probe wraps one to timestamp the lookup. Each states
these methods itself (no ``__getattr__`` forwarding), so a missing one is an
``isinstance`` failure, not an ``AttributeError`` halfway through a build.
Maintenance (scan, gc, verify, prune) is LocalStore's alone: the CLI's cache
commands open a LocalStore.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from .entry import Entry

# workdir -> metadata for the manifest (None: no metadata)
BuildFn = Callable[[Path], "dict[str, Any] | None"]


@runtime_checkable
class Store(Protocol):
    @property
    def base(self) -> Path:
        """The versioned root (``<cache>/v1``); keys memoize weights digests under it."""
        ...

    def get(self, key: str) -> Entry | None:
        """The verified entry for a full key, or None on a miss."""
        ...

    def open(self, key: str) -> Entry:
        """The verified entry for a key or unique prefix; KeyLookupError / IntegrityError."""
        ...

    def get_or_build(
        self,
        key: str,
        factors: dict[str, Any],
        build: BuildFn,
        *,
        force: bool = False,
        label: dict[str, Any] | None = None,
    ) -> tuple[Entry, str]:
        """(entry, "local" | "pulled" | "built"): one build per key across processes."""
        ...

    def record_dependency(self, key: str) -> None:
        """Inside a build: the entry being built reads entry ``key`` when it is loaded."""
        ...

    def reading(self, key: str) -> AbstractContextManager[None]:
        """Hold ``key`` against gc and rm while it is verified and loaded."""
        ...
