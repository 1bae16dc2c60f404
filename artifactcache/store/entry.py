"""What the store hands out: entries, gc plans, verify and prune results."""

from __future__ import annotations

import functools
import os
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import IntegrityError
from . import _fs
from . import manifest as schema
from .manifest import MANIFEST


def read_stored_manifest(path: str | os.PathLike[str]) -> Any:
    """The parsed manifest.json of a local entry (the manifest plus its provenance).

    OSError if unreadable, a symlink or not a regular file; ValueError past
    ``schema.STORED_MAX_BYTES`` or not JSON. Not checked against the schema.
    """
    limit = schema.STORED_MAX_BYTES
    return schema.parse(_fs.read_small(path, limit), limit)


@dataclass(frozen=True)
class Entry:
    key: str
    path: Path
    manifest: dict[str, Any]

    factors = property(lambda self: self.manifest.get("factors", {}))
    meta = property(lambda self: self.manifest.get("meta", {}))
    label = property(lambda self: self.manifest.get("label") or {})
    files = property(lambda self: self.manifest.get("files", {}))
    created = property(lambda self: float(self.manifest.get("created", 0.0)))
    build_seconds = property(lambda self: float(self.manifest.get("build_seconds", 0.0)))
    arch_key = property(lambda self: self.manifest.get("arch_key"))
    depends_on = property(lambda self: tuple(self.manifest.get("depends_on", ())))
    provenance = property(lambda self: public_provenance(self.manifest))

    def file(self, rel: Any) -> Path:
        """The path of a file the manifest names; IntegrityError unless it is the entry's."""
        return entry_file(self.path, rel, self.files)

    @property
    def size(self) -> int:
        return sum(int(f.get("size", 0)) for f in self.files.values())

    @functools.cached_property  # one stat per Entry: ls sorts and prints by it
    def last_used(self) -> float:
        """The entry dir's mtime: a hit sets it with utime (no rewrite of anything)."""
        try:
            return os.stat(self.path, follow_symlinks=False).st_mtime
        except OSError:
            return self.created

    def summary(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "path": str(self.path),
            "label": self.label,
            "size": self.size,
            "files": len(self.files),
            "created": self.created,
            "last_used": self.last_used,
            "build_seconds": self.build_seconds,
            "arch_key": self.arch_key,
            "depends_on": list(self.depends_on),
            "provenance": self.provenance,
        }


@dataclass(frozen=True)
class EntryInfo:
    """What `ls`, `gc` and `stats` need of an entry, without its manifest.

    Built from the summary index (state/index.json), so listing 10,000 entries
    parses one file instead of 10,000 manifests. Never used to verify anything.
    """

    key: str
    dir: str
    label: dict[str, Any]
    size: int
    nfiles: int
    created: float
    build_seconds: float
    arch_key: str | None
    last_used: float  # the entry dir's mtime when listed
    depends_on: tuple[str, ...] = ()  # entries this one reads at load time
    provenance: dict[str, Any] = field(default_factory=dict)  # public_provenance()

    @property
    def path(self) -> Path:
        return Path(self.dir)

    @staticmethod
    def record(manifest: dict[str, Any]) -> dict[str, Any]:
        """The index record of a manifest (the fields above that it determines)."""
        e = Entry(manifest["key"], Path(), manifest)
        return {
            "label": e.label,
            "size": e.size,
            "nfiles": len(e.files),
            "created": e.created,
            "build_seconds": e.build_seconds,
            "arch_key": e.arch_key,
            "depends_on": list(e.depends_on),
            "provenance": e.provenance,
        }

    def summary(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "path": self.dir,
            "label": self.label,
            "size": self.size,
            "files": self.nfiles,
            "created": self.created,
            "last_used": self.last_used,
            "build_seconds": self.build_seconds,
            "arch_key": self.arch_key,
            "depends_on": list(self.depends_on),
            "provenance": self.provenance,
        }


@dataclass(frozen=True)
class GcPlan:
    entries: list[EntryInfo]  # to delete, least recently used first
    bytes: int  # what deleting them frees
    total_bytes: int  # the cache's entries before
    planned_at: float = field(default_factory=time.time)


@dataclass
class GcResult:
    freed: int  # bytes
    evicted: list[str] = field(default_factory=list)
    in_use: list[str] = field(default_factory=list)  # skipped: another process was loading them
    kept: list[str] = field(default_factory=list)  # skipped: hit since the plan, or still needed


@dataclass(frozen=True)
class VerifyResult:
    key: str
    ok: bool
    problem: str | None = None
    # False when the entry could not be read (an OS error): it was left in place.
    quarantined: bool = False


@dataclass(frozen=True)
class PruneResult:
    staging: int = 0
    locks: int = 0
    quarantine: int = 0
    other: int = 0
    bytes: int = 0
    warnings: list[str] = field(default_factory=list)
    dry_run: bool = False  # counted, nothing removed


def tree_bytes(path: Path) -> int:
    try:
        files, _ = _fs.walk_files(path)
    except OSError:
        return 0
    return sum(st.st_size for st in files.values())


def check_manifest(manifest: Any, key: str) -> str | None:
    """Why a manifest is unusable, or None: the one schema (store/manifest.py)."""
    return schema.problem(manifest, key)


def public_provenance(manifest: dict[str, Any]) -> dict[str, Any]:
    """Where the entry came from, for ls and show (its envelope left out).

    An entry published before provenance was recorded is ``{"source": "unknown"}``:
    it is served as before, but never pushed (push cannot tell what it vouches for).
    """
    prov = manifest.get("provenance") or {"source": "unknown"}
    return {k: v for k, v in prov.items() if k != "envelope"}


def entry_file(entry_dir: Path, rel: Any, files: dict[str, Any] | None = None) -> Path:
    """The path of a file a manifest names, refused unless it is one of the entry's files.

    Every loader opens what its manifest's ``meta`` names through this: ``rel``
    must be a safe relative path, listed in the manifest's (verified) ``files``,
    and a regular file reached through no symlink, so a manifest can never make a
    loader open (or dlopen) anything outside the verified entry. ``files`` is read
    from the entry's manifest when not given. IntegrityError otherwise.
    """
    name = entry_dir.name[:12]
    if why := schema.path_problem(rel):
        raise IntegrityError(
            f"entry {name} names a file outside itself ({why}); refused: rebuild it with --force"
        )
    if files is None:
        try:
            files = read_stored_manifest(entry_dir / MANIFEST).get("files")
        except (OSError, ValueError, AttributeError):
            files = None
    if not isinstance(files, dict) or rel not in files:
        raise IntegrityError(
            f"entry {name} names {rel!r}, which is not one of its files; refused: "
            "rebuild it with --force"
        )
    path = entry_dir / rel
    try:
        st = os.lstat(path)
        inside = os.path.realpath(path) == os.path.join(os.path.realpath(entry_dir), rel)
    except OSError:
        st, inside = None, False
    if st is None or not stat.S_ISREG(st.st_mode) or not inside:
        raise IntegrityError(
            f"entry {name}: {rel} is not a regular file inside the entry (a symlink?); "
            "refused: run `acache verify`"
        )
    return path
