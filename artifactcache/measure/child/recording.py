"""RecordingStore: the probe's Store, which stamps the lookup and sees whether it built."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from contextlib import AbstractContextManager

    from ...store.entry import Entry
    from ...store.protocol import BuildFn, Store


class RecordingStore:
    """A Store around another that timestamps the lookup and sees whether we built.

    api.load() calls get_or_build(); the other methods go to the inner store as they are.
    """

    def __init__(self, inner: Store, stamps: dict[str, float]) -> None:
        self._inner = inner
        self._stamps = stamps
        self.source: str | None = None
        self.entry: Entry | None = None

    @property
    def base(self) -> Path:
        return self._inner.base

    def get(self, key: str) -> Entry | None:
        return self._inner.get(key)

    def open(self, key: str) -> Entry:
        return self._inner.open(key)

    def record_dependency(self, key: str) -> None:
        self._inner.record_dependency(key)

    def reading(self, key: str) -> AbstractContextManager[None]:
        return self._inner.reading(key)

    def get_or_build(
        self,
        key: str,
        factors: dict[str, Any],
        build: BuildFn,
        *,
        force: bool = False,
        label: dict[str, Any] | None = None,
    ) -> tuple[Entry, str]:
        def timed_build(workdir: Path) -> dict[str, Any] | None:
            self._stamps["build_start"] = time.perf_counter()
            meta = build(workdir)
            self._stamps["build_done"] = time.perf_counter()
            return meta

        self._stamps["store_call"] = time.perf_counter()
        entry, source = self._inner.get_or_build(
            key, factors, timed_build, force=force, label=label
        )
        self.source = source
        self.entry = entry
        return entry, source
