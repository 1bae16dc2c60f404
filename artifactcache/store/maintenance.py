"""Maintenance of the local store: scan, verify, remove, gc, prune, stats.

A mixin of :class:`~artifactcache.store.local.LocalStore`, split out to keep each
module short; it uses only the store's own primitives (lock, entry_path, _check).
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from ..errors import EntryInUse, FilesystemError, IntegrityError
from . import _fs
from .entry import (
    MANIFEST,
    Entry,
    EntryInfo,
    GcPlan,
    GcResult,
    PruneResult,
    VerifyResult,
    check_manifest,
    read_stored_manifest,
    tree_bytes,
)
from .keyformat import is_full_key

_KEY = re.compile("[0-9a-f]{64}")
_INDEX_FIELDS = frozenset(EntryInfo.record({"key": "0" * 64})) | {"ino"}


def prefix_listings(
    entries: Path,
) -> Iterator[tuple[os.DirEntry[str], list[os.DirEntry[str]] | None, OSError | None]]:
    """Each item under ``entries/``, by name: (prefix dir, what it holds, None); (item,
    None, None) for anything that is not a directory; (prefix dir, None, the error) for
    one that cannot be listed. OSError when ``entries/`` itself cannot be listed. The
    store's scans and doctor's read-only count walk the tree through this."""
    with os.scandir(entries) as top:
        items = sorted(top, key=lambda d: d.name)
    for item in items:
        if not item.is_dir(follow_symlinks=False):
            yield item, None, None
            continue
        try:
            with os.scandir(item.path) as it:
                found = list(it)
        except OSError as e:
            yield item, None, e
            continue
        yield item, found, None


class MaintenanceMixin:
    base: Path

    def _key_dirs(
        self, warnings: list[str] | None = None
    ) -> Iterator[tuple[str, os.DirEntry[str]]]:
        """(prefix dir name, dir entry) of everything under entries/.

        Anything else there (a file or symlink where a prefix dir belongs, a
        prefix dir we may not read) is skipped, with a line in ``warnings``.
        """
        notes = [] if warnings is None else warnings
        for sub, found, error in prefix_listings(self.base / "entries"):
            if error is not None:
                notes.append(f"cannot list entries/{sub.name} ({_fs.describe(error)})")
            elif found is None:
                notes.append(f"unexpected item entries/{sub.name} (not a directory); remove it")
            else:
                yield from ((sub.name, d) for d in found)

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
        for prefix, d in self._key_dirs(warnings):
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
        index = _fs.read_memo(index_path)
        fresh: dict[str, dict] = {}
        out: list[EntryInfo] = []
        warnings: list[str] = []
        for prefix, d in self._key_dirs(warnings):
            name = d.name
            try:
                st = d.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue  # removed while we listed
            rec = index.get(name)
            if not (_valid_record(rec) and rec.get("ino") == st.st_ino):  # type: ignore[union-attr]
                manifest, warning = self._one_manifest(prefix, d)
                if warning:
                    warnings.append(warning)
                    continue
                rec = {**EntryInfo.record(manifest), "ino": st.st_ino}  # type: ignore[arg-type]
            fresh[name] = rec
            fields = {k: v for k, v in rec.items() if k != "ino"}
            fields["depends_on"] = tuple(fields["depends_on"])
            out.append(EntryInfo(key=name, dir=d.path, last_used=st.st_mtime, **fields))
        if fresh != index:
            _fs.write_memo(index_path, fresh, separators=(",", ":"))
        return out, warnings + self._leftover_warnings()

    def _one_manifest(self, prefix: str, d: os.DirEntry[str]) -> tuple[dict | None, str | None]:
        name = d.name
        if not _KEY.fullmatch(name) or prefix != name[:2]:
            return None, f"unexpected item entries/{prefix}/{name}; remove it"
        try:
            manifest = read_stored_manifest(os.path.join(d.path, MANIFEST))
            problem = check_manifest(manifest, name)
        except (OSError, ValueError) as e:
            problem = f"manifest.json is unreadable ({e})"
        if problem:
            return None, f"entry {name[:12]} skipped: {problem}; run `acache verify`"
        return manifest, None

    def verify(
        self,
        keys: Iterable[str] | None = None,
        progress: Callable[[int, int], None] | None = None,
        warnings: list[str] | None = None,
    ) -> list[VerifyResult]:
        """Re-hash every file of the given (default: all) entries; quarantine failures.

        An entry the OS will not let us read (EACCES, EMFILE, EIO, ...) is reported
        with ``ok=False, quarantined=False`` and left in place. Stray items under
        entries/ are skipped, with a line in ``warnings``.
        """
        notes = [] if warnings is None else warnings
        if keys:
            todo = [self.resolve(k) for k in keys]  # type: ignore[attr-defined]
        else:
            todo = []
            for prefix, d in self._key_dirs(notes):
                if _KEY.fullmatch(d.name) and d.name[:2] == prefix:
                    todo.append(d.name)
                else:
                    notes.append(f"unexpected item entries/{prefix}/{d.name}; remove it")
        out = []
        for i, key in enumerate(todo):
            try:
                entry, problem = self._check(key, full=True)  # type: ignore[attr-defined]
            except FilesystemError as e:
                out.append(VerifyResult(key, False, str(e), quarantined=False))
            else:
                if entry is None and problem is None:
                    out.append(VerifyResult(key, False, "vanished while verifying"))
                else:
                    out.append(VerifyResult(key, problem is None, problem, problem is not None))
            if progress:
                progress(i + 1, len(todo))
        return out

    # ---------------------------------------------------- remove and gc --

    def _dependents(self) -> tuple[dict[str, set[str]], dict[str, tuple[str, ...]]]:
        """(key -> keys of the entries that depend on it, key -> what it depends on)."""
        entries, _ = self.ls()
        needs = {e.key: e.depends_on for e in entries}
        dependents: dict[str, set[str]] = {}
        for key, deps in needs.items():
            for d in deps:
                if d != key:
                    dependents.setdefault(d, set()).add(key)
        return dependents, needs

    def remove(self, keys: Iterable[str]) -> int:
        """Delete entries (by key or prefix); returns bytes freed.

        Refuses (EntryInUse, nothing deleted) an entry that others depend on,
        unless they are removed in the same call. An entry that another process is
        loading is skipped; the others are removed, then EntryInUse names it.
        """
        full = list(dict.fromkeys(self.resolve(k) for k in keys))  # type: ignore[attr-defined]
        dependents, needs = self._dependents()
        for key in full:
            if outside := sorted(dependents.get(key, set()) - set(full)):
                more = f" and {len(outside) - 1} more" if len(outside) > 1 else ""
                raise EntryInUse(
                    f"entry {key[:12]} is needed by entry {outside[0][:12]}{more}; "
                    "remove those first, or name them in the same `acache rm`"
                )
        result = self._remove_all(_dependents_first(full, needs), dependents)
        if result.in_use:
            n = len(result.evicted)
            others = f"{n} other {'entry' if n == 1 else 'entries'} removed"
            raise EntryInUse(
                f"entry {result.in_use[0][:12]} is being loaded by another process, not removed "
                f"({others}); retry when the load is done"
            )
        return result.freed

    def _remove_all(
        self, order: list[str], dependents: dict[str, set[str]], not_used_since: float | None = None
    ) -> GcResult:
        """Remove ``order`` (dependents first); keep a dependency whose dependent stays."""
        result = GcResult(freed=0)
        gone: set[str] = set()
        for key in order:
            if dependents.get(key, set()) - gone:
                result.kept.append(key)
                continue
            status, freed = self._remove(key, not_used_since)
            if status == "in_use":
                result.in_use.append(key)
            elif status == "kept":
                result.kept.append(key)
            else:  # removed, or already gone
                gone.add(key)
                result.evicted.append(key)
                result.freed += freed
        return result

    def _remove(self, key: str, not_used_since: float | None = None) -> tuple[str, int]:
        """("removed" | "gone" | "kept" | "in_use", bytes freed) for one entry."""
        path = self.entry_path(key)  # type: ignore[attr-defined]
        readers = self.readers_lock_path(key)  # type: ignore[attr-defined]
        try:
            with self.lock(key), _fs.flock_file(readers, blocking=False) as free:  # type: ignore[attr-defined]
                if not free:
                    return "in_use", 0  # a loader holds the shared lock
                try:
                    if not_used_since is not None and os.lstat(path).st_mtime > not_used_since:
                        return "kept", 0  # a hit after the gc plan: keep it
                    trash = self.base / "staging" / f"{uuid.uuid4().hex}.trash"
                    os.rename(path, trash)  # disappears in one step, then is deleted
                except (FileNotFoundError, NotADirectoryError):
                    return "gone", 0
                with contextlib.suppress(FileNotFoundError):
                    self._memo_path(key).unlink()  # type: ignore[attr-defined]
                readers.unlink()  # safe while held: lockers re-check the inode
            size = tree_bytes(trash)
            _fs.rmtree(trash)
        except OSError as e:
            raise FilesystemError(f"cannot remove entry {key[:12]} ({_fs.describe(e)})") from None
        return "removed", size

    def gc_plan(
        self,
        max_size: int | None = None,
        older_than: float | None = None,
        warnings: list[str] | None = None,
    ) -> GcPlan:
        """Entries to evict: those unused for ``older_than`` seconds, then LRU until <= max_size.

        An entry another one depends on is planned only together with all its
        dependents: gc never leaves a dependent without what it loads. Entries the
        scan skipped (a malformed manifest) are never planned; ``warnings`` says which.
        """
        entries, notes = self.ls()
        if warnings is not None:
            warnings.extend(notes)
        dependents, _ = self._dependents()
        by_age = sorted(entries, key=lambda e: e.last_used)
        now, total = time.time(), sum(e.size for e in entries)
        chosen = {
            e.key for e in by_age if older_than is not None and now - e.last_used > older_than
        }
        while stay := {k for k in chosen if dependents.get(k, set()) - chosen}:
            chosen -= stay
        left = total - sum(e.size for e in entries if e.key in chosen)
        waiting: list[EntryInfo] = []  # LRU dependencies whose dependents were not chosen yet
        for e in by_age:
            if max_size is None or left <= max_size:
                break
            if e.key in chosen:
                continue
            if dependents.get(e.key, set()) - chosen:
                waiting.append(e)
                continue
            chosen.add(e.key)
            left -= e.size
            while left > max_size and (
                ready := [w for w in waiting if not dependents.get(w.key, set()) - chosen]
            ):
                for w in ready:
                    waiting.remove(w)
                    chosen.add(w.key)
                    left -= w.size
        victims = [e for e in by_age if e.key in chosen]
        return GcPlan(victims, sum(e.size for e in victims), total, planned_at=now)

    def execute(self, plan: GcPlan) -> GcResult:
        """Carry out a gc plan, dependents first.

        Kept: entries hit since the plan was made, and dependencies whose
        dependent stays. In use (another process is loading them): skipped.
        """
        dependents, needs = self._dependents()  # now: an entry may have gained a dependent
        order = _dependents_first([e.key for e in plan.entries], needs)
        return self._remove_all(order, dependents, not_used_since=plan.planned_at)

    def prune(self, grace_seconds: float = 3600.0, *, dry_run: bool = False) -> PruneResult:
        """Remove dead builds' staging dirs, unheld lock files, quarantine, stale memos.

        A staging dir is dead when nobody holds its flock (the builder exited or
        was killed); no age or pid guess is involved. ``grace_seconds`` only
        applies to stray temp files, which carry no lock. ``dry_run`` counts what
        would go, by the same tests, and removes nothing.
        """
        counts = {"staging": 0, "locks": 0, "quarantine": 0, "other": 0}
        freed, warnings, now = 0, [], time.time()

        def rmtree(item: Path) -> None:
            if not dry_run:
                _fs.rmtree(item)

        for item in (self.base / "staging").iterdir():
            fd = None
            if item.is_dir() and not item.is_symlink():
                fd = _fs.try_lock_dir(item)
                if fd is None:
                    continue  # its builder is alive and holds the flock
            try:
                freed += tree_bytes(item)
                rmtree(item)
                counts["staging"] += 1
            except OSError as e:
                warnings.append(f"could not remove {item}: {e.strerror}")
            finally:
                if fd is not None:
                    os.close(fd)
        for item in (self.base / "locks").iterdir():
            try:
                if not stat.S_ISREG(item.lstat().st_mode):
                    rmtree(item)  # junk: only lock files belong here
                    counts["other"] += 1
                    continue
                with _fs.flock_file(item, blocking=False) as held:
                    if held:
                        if not dry_run:
                            item.unlink()  # safe: lockers re-check the inode after locking
                        counts["locks"] += 1
            except OSError as e:
                warnings.append(f"could not prune {item} ({_fs.describe(e)})")
        for item in (self.base / "quarantine").iterdir():
            try:
                size = tree_bytes(item) if item.is_dir() else 0
                rmtree(item)
            except OSError as e:
                warnings.append(f"could not remove {item} ({_fs.describe(e)})")
                continue
            freed += size
            counts["quarantine"] += 1
        for item in [*(self.base / "state").iterdir(), *self.base.glob("*.folding")]:
            key = item.name.split(".")[0]
            try:
                orphan = is_full_key(key) and not self.entry_path(key).exists()  # type: ignore[attr-defined]
                stray = item.name.endswith((".tmp", ".folding"))
                if orphan or (stray and now - item.lstat().st_mtime > grace_seconds):
                    rmtree(item)
                    counts["other"] += 1
            except OSError as e:
                warnings.append(f"could not prune {item} ({_fs.describe(e)})")
        return PruneResult(**counts, bytes=freed, warnings=warnings, dry_run=dry_run)

    def stats(self, warnings: list[str] | None = None) -> dict[str, Any]:
        """Counters from the event log plus what the store holds now (``warnings``: what
        the scan skipped)."""
        totals = self._stats.read()  # type: ignore[attr-defined]
        entries, notes = self.ls()
        if warnings is not None:
            warnings.extend(notes)
        totals["entries"] = len(entries)
        totals["bytes"] = sum(e.size for e in entries)
        return totals

    def peek(self, key: str) -> Entry:
        """An entry's manifest by key or prefix, unverified and not counted as a hit."""
        key = self.resolve(key)  # type: ignore[attr-defined]
        path = self.entry_path(key)  # type: ignore[attr-defined]
        try:
            manifest = read_stored_manifest(path / MANIFEST)
        except (OSError, ValueError):
            manifest = None
        if problem := check_manifest(manifest, key):
            raise IntegrityError(f"entry {key[:12]}: {problem}; run `acache verify`")
        return Entry(key, path, manifest)


def _valid_record(rec: Any) -> bool:
    """An index record of the expected fields and types (state/index.json is a cache)."""
    if not (isinstance(rec, dict) and rec.keys() == _INDEX_FIELDS):
        return False
    number = (int, float)
    return (
        isinstance(rec["size"], int)
        and isinstance(rec["nfiles"], int)
        and all(isinstance(rec[f], number) for f in ("created", "build_seconds", "ino"))
        and isinstance(rec["label"], dict)
        and isinstance(rec["provenance"], dict)
        and isinstance(rec["arch_key"], (str, type(None)))
        and isinstance(rec["depends_on"], list)
        and all(isinstance(d, str) for d in rec["depends_on"])
    )


def _dependents_first(keys: list[str], needs: dict[str, tuple[str, ...]]) -> list[str]:
    """``keys`` reordered so that an entry comes before every entry it depends on."""
    left, out = list(keys), []
    while left:
        needed = {d for k in left for d in needs.get(k, ()) if d != k}
        ready = [k for k in left if k not in needed] or left  # a cycle: no order is right
        out += ready
        left = [k for k in left if k not in ready]
    return out
