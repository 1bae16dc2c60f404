"""Maintenance of the local store: scan, verify, remove, gc, prune, stats.

A mixin of :class:`~artifactcache.store.local.LocalStore`, split out to keep each
module short; it uses only the store's own primitives (lock, entry_path, _check).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from ..errors import IntegrityError
from ..keys import is_full_key
from . import _fs
from .entry import (
    MANIFEST,
    Entry,
    EntryInfo,
    GcPlan,
    PruneResult,
    VerifyResult,
    check_manifest,
    tree_bytes,
)

_KEY = re.compile("[0-9a-f]{64}")


class MaintenanceMixin:
    base: Path

    def _key_dirs(self) -> Iterator[tuple[str, os.DirEntry[str]]]:
        """(prefix dir name, dir entry) of everything under entries/."""
        with os.scandir(self.base / "entries") as top:
            for sub in sorted(top, key=lambda d: d.name):
                if sub.is_dir(follow_symlinks=False):
                    with os.scandir(sub.path) as it:
                        yield from ((sub.name, d) for d in it)

    def _leftover_warnings(self) -> list[str]:
        out = []
        for sub in ("staging", "quarantine"):
            if n := len(os.listdir(self.base / sub)):
                out.append(f"{n} item(s) in {sub}/ (`acache prune` removes leftovers)")
        return out

    def scan(self) -> tuple[list[Entry], list[str]]:
        """Every readable entry, with its manifest (unverified), and warnings about the rest.

        Walks (tolerating anything unexpected, like huggingface_hub's scan_cache_dir)::

            v1/entries/
              ab/                      prefix dir: the key's first two hex digits
                abcdef...(64 hex)/     an entry -> Entry(key, path, manifest)
                  manifest.json        missing or malformed -> a warning, entry skipped
                  <files>
                junk                   not a 64-hex key under its prefix -> a warning
            v1/staging/, v1/quarantine/  anything there -> a warning (`acache prune`)
        """
        entries: list[Entry] = []
        warnings: list[str] = []
        for prefix, d in self._key_dirs():
            manifest, warning = self._one_manifest(prefix, d)
            if warning:
                warnings.append(warning)
            else:
                entries.append(Entry(d.name, Path(d.path), manifest))  # type: ignore[arg-type]
        return entries, warnings + self._leftover_warnings()

    def ls(self) -> tuple[list[EntryInfo], list[str]]:
        """Like scan, but from the summary index: one parse, plus one lstat per entry.

        The index (state/index.json) caches each manifest's summary keyed by the
        entry dir's inode; entries are immutable and a forced rebuild swaps in a
        new dir, so a matching inode means a matching manifest. Misses fall back
        to reading the manifest, and the index is rewritten (best effort).
        """
        index_path = self.base / "state" / "index.json"
        try:
            index = json.loads(_fs.read_small(index_path))
            index = index if isinstance(index, dict) else {}
        except (OSError, ValueError):
            index = {}
        fresh: dict[str, dict] = {}
        out: list[EntryInfo] = []
        warnings: list[str] = []
        for prefix, d in self._key_dirs():
            name = d.name
            try:
                st = d.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue  # removed while we listed
            rec = index.get(name)
            if not (isinstance(rec, dict) and rec.get("ino") == st.st_ino):
                manifest, warning = self._one_manifest(prefix, d)
                if warning:
                    warnings.append(warning)
                    continue
                rec = {**EntryInfo.record(manifest), "ino": st.st_ino}  # type: ignore[arg-type]
            fresh[name] = rec
            fields = {k: v for k, v in rec.items() if k != "ino"}
            out.append(EntryInfo(key=name, dir=d.path, last_used=st.st_mtime, **fields))
        if fresh != index:
            with contextlib.suppress(OSError):
                _fs.write_atomic(index_path, json.dumps(fresh, separators=(",", ":")).encode())
        return out, warnings + self._leftover_warnings()

    def _one_manifest(self, prefix: str, d: os.DirEntry[str]) -> tuple[dict | None, str | None]:
        name = d.name
        if not _KEY.fullmatch(name) or prefix != name[:2]:
            return None, f"unexpected item entries/{prefix}/{name}; remove it"
        try:
            manifest = json.loads(_fs.read_small(os.path.join(d.path, MANIFEST)))
            if check_manifest(manifest, name):
                raise ValueError("malformed")
        except (OSError, ValueError):
            return None, f"entry {name[:12]} has no valid manifest; run `acache verify`"
        return manifest, None

    def verify(
        self, keys: Iterable[str] | None = None, progress: Callable[[int, int], None] | None = None
    ) -> list[VerifyResult]:
        """Re-hash every file of the given (default: all) entries; quarantine failures."""
        todo = [self.resolve(k) for k in keys] if keys else [d.name for _, d in self._key_dirs()]
        out = []
        for i, key in enumerate(todo):
            if not is_full_key(key):
                continue
            entry, problem = self._check(key, full=True)
            if entry is None and problem is None:
                problem = "vanished while verifying"
            out.append(VerifyResult(key, problem is None, problem))
            if progress:
                progress(i + 1, len(todo))
        return out

    def remove(self, keys: Iterable[str]) -> int:
        """Delete entries (by key or prefix); returns bytes freed."""
        freed = 0
        for key in [self.resolve(k) for k in keys]:
            freed += self._remove(key)
        return freed

    def _remove(self, key: str, not_used_since: float | None = None) -> int:
        path = self.entry_path(key)
        with self.lock(key):
            try:
                if not_used_since is not None and os.lstat(path).st_mtime > not_used_since:
                    return 0  # a hit after the gc plan: keep it
                trash = self.base / "staging" / f"{uuid.uuid4().hex}.trash"
                os.rename(path, trash)  # disappears in one step, then is deleted
            except FileNotFoundError:
                return 0
            with contextlib.suppress(FileNotFoundError):
                self._memo_path(key).unlink()
        size = tree_bytes(trash)
        _fs.rmtree(trash)
        return size

    def gc_plan(self, max_size: int | None = None, older_than: float | None = None) -> GcPlan:
        """Entries to evict: those unused for ``older_than`` seconds, then LRU until <= max_size."""
        entries, _ = self.ls()
        by_age = sorted(entries, key=lambda e: e.last_used)
        now, total = time.time(), sum(e.size for e in entries)
        victims = [e for e in by_age if older_than is not None and now - e.last_used > older_than]
        left = total - sum(e.size for e in victims)
        for e in by_age:
            if max_size is None or left <= max_size:
                break
            if e not in victims:
                victims.append(e)
                left -= e.size
        victims.sort(key=lambda e: e.last_used)
        return GcPlan(victims, sum(e.size for e in victims), total, planned_at=now)

    def execute(self, plan: GcPlan) -> int:
        """Carry out a gc plan; entries hit since it was made are kept. Returns bytes freed."""
        return sum(self._remove(e.key, not_used_since=plan.planned_at) for e in plan.entries)

    def prune(self, grace_seconds: float = 3600.0) -> PruneResult:
        """Remove dead builds' staging dirs, unheld lock files, quarantine, stale memos.

        A staging dir is dead when nobody holds its flock (the builder exited or
        was killed); no age or pid guess is involved. ``grace_seconds`` only
        applies to stray temp files, which carry no lock.
        """
        counts = {"staging": 0, "locks": 0, "quarantine": 0, "other": 0}
        freed, warnings, now = 0, [], time.time()
        for item in (self.base / "staging").iterdir():
            fd = None
            if item.is_dir() and not item.is_symlink():
                fd = _fs.try_lock_dir(item)
                if fd is None:
                    continue  # its builder is alive and holds the flock
            try:
                freed += tree_bytes(item)
                _fs.rmtree(item)
                counts["staging"] += 1
            except OSError as e:
                warnings.append(f"could not remove {item}: {e.strerror}")
            finally:
                if fd is not None:
                    os.close(fd)
        for item in (self.base / "locks").iterdir():
            with _fs.flock_file(item, blocking=False) as held:
                if held:
                    item.unlink()  # safe: lockers re-check the inode after locking
                    counts["locks"] += 1
        for item in (self.base / "quarantine").iterdir():
            freed += tree_bytes(item) if item.is_dir() else 0
            _fs.rmtree(item)
            counts["quarantine"] += 1
        for item in [*(self.base / "state").iterdir(), *self.base.glob("*.folding")]:
            key = item.name.split(".")[0]
            orphan = is_full_key(key) and not self.entry_path(key).exists()
            stray = item.name.endswith((".tmp", ".folding"))
            if orphan or (stray and now - item.lstat().st_mtime > grace_seconds):
                _fs.rmtree(item)
                counts["other"] += 1
        return PruneResult(**counts, bytes=freed, warnings=warnings)

    def stats(self) -> dict[str, Any]:
        """Counters from the event log plus what the store holds now."""
        totals = self._stats.read()  # type: ignore[attr-defined]
        entries, _ = self.ls()
        totals["entries"] = len(entries)
        totals["bytes"] = sum(e.size for e in entries)
        return totals

    def peek(self, key: str) -> Entry:
        """An entry's manifest by key or prefix, unverified and not counted as a hit."""
        key = self.resolve(key)  # type: ignore[attr-defined]
        path = self.entry_path(key)  # type: ignore[attr-defined]
        try:
            manifest = json.loads(_fs.read_small(path / MANIFEST))
        except (OSError, ValueError):
            manifest = None
        if check_manifest(manifest, key):
            raise IntegrityError(f"entry {key[:12]} has no valid manifest; run `acache verify`")
        return Entry(key, path, manifest)
