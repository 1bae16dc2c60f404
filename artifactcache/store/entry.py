"""What the store hands out: entries, gc plans, verify and prune results."""

from __future__ import annotations

import functools
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import _fs

MANIFEST = "manifest.json"
_KEY = re.compile("[0-9a-f]{64}")


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


def tree_bytes(path: Path) -> int:
    try:
        files, _ = _fs.walk_files(path)
    except OSError:
        return 0
    return sum(st.st_size for st in files.values())


def check_manifest(manifest: Any, key: str) -> str | None:
    """Why a manifest is unusable, or None. Also rejects unsafe relative paths."""
    if not isinstance(manifest, dict) or manifest.get("key") != key:
        return "manifest.json does not describe this key"
    files = manifest.get("files")
    if not isinstance(files, dict):
        return "manifest.json has no file list"
    for rel, info in files.items():
        parts = rel.split("/")
        if rel == MANIFEST or rel.startswith("/") or any(p in ("", ".", "..") for p in parts):
            return f"manifest.json lists an unsafe path {rel!r}"
        if not (isinstance(info, dict) and isinstance(info.get("size"), int)):
            return f"manifest.json has no size for {rel}"
        if not str(info.get("digest", "")).startswith("blake3:"):
            return f"manifest.json has no blake3 digest for {rel}"
    deps = manifest.get("depends_on", [])
    if not (isinstance(deps, list) and all(isinstance(d, str) and _KEY.fullmatch(d) for d in deps)):
        return "manifest.json has a malformed depends_on"
    return None
