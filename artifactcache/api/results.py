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

    def phases_summary(self) -> str:
        """One line over the build's top-level phases; "" when nothing was built here."""
        return phases_summary(self.phases, steps_at_once=self.entry.meta.get("build_jobs", 1))


def build_phases(meta: dict[str, Any]) -> dict[str, float]:
    """A build's own breakdown, as its backend recorded it in the entry's meta
    (``compile_seconds``: seconds by phase, or one total)."""
    seconds = meta.get("compile_seconds")
    if isinstance(seconds, dict):
        return {
            str(k): float(v)
            for k, v in seconds.items()
            if isinstance(v, int | float) and not isinstance(v, bool)
        }
    if isinstance(seconds, int | float) and not isinstance(seconds, bool):
        return {"compile": float(seconds)}
    return {}


def phases_summary(phases: dict[str, float], *, steps_at_once: Any = 1) -> str:
    """``build phases: model 0.4 s · prefill 5.1 s · ... · wall 18.2 s``.

    Only the top-level phases: a phase named ``<another phase>_...`` (aoti's
    ``decode_export``, ``decode_worker``, ...) is left to ``--json``, which has them all.
    ``wall`` goes last; where the steps were built at once (``build_jobs``), the
    line says so, since their seconds overlap rather than add up.
    """
    top = [k for k in phases if not any(k.startswith(f"{o}_") for o in phases if o != k)]
    top = [k for k in top if k != "wall"] + [k for k in top if k == "wall"]
    if not top:
        return ""
    parts = " · ".join(f"{k} {phases[k]:.1f} s" for k in top)
    notes = []
    if isinstance(steps_at_once, int) and steps_at_once > 1:
        notes.append(f"{steps_at_once} steps at once")
    if len(top) < len(phases):
        notes.append(f"--json has all {len(phases)}")
    return f"build phases: {parts}" + (f" ({'; '.join(notes)})" if notes else "")


def resolve_store(
    store: Store | None, cache_dir: str | Path | None, allow_shared_root: bool
) -> Store:
    if store is not None:
        return store
    from ..store.local import LocalStore

    return LocalStore(cache_dir, allow_shared_root=allow_shared_root)
