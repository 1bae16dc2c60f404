"""What both paths of the API return, and the store they default to."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..store.entry import Entry
    from ..store.protocol import Store


@dataclass(frozen=True)
class KeyInfo:
    key: str
    factors: dict[str, Any]
    full_key: str  # with the weights digest, even where the entry is keyed by architecture
    arch_key: str | None  # set when the backend keeps weights outside the artifact


@dataclass(frozen=True)
class BuildResult:
    key: str
    built: bool  # False: the entry was already there (a hit, or pulled from the remote)
    seconds: float  # wall time of this call
    bytes: int
    entry: Entry
    source: str = "local"  # "local" | "built" | "pulled"

    @property
    def phases(self) -> dict[str, float]:
        """Where this call's build went, in seconds; empty when nothing was built here."""
        return build_phases(self.entry.meta) if self.built else {}


def build_phases(meta: dict[str, Any]) -> dict[str, float]:
    """A build's own breakdown, as its backend recorded it in the entry's meta
    (``compile_seconds``: seconds by phase, or one total), in the recorded order."""
    seconds = meta.get("compile_seconds")
    if isinstance(seconds, dict):
        return {str(k): float(v) for k, v in seconds.items() if isinstance(v, int | float)}
    if isinstance(seconds, int | float):
        return {"compile": float(seconds)}
    return {}


def resolve_store(
    store: Store | None, cache_dir: str | Path | None, allow_shared_root: bool
) -> Store:
    if store is not None:
        return store
    from ..store.local import LocalStore

    return LocalStore(cache_dir, allow_shared_root=allow_shared_root)
