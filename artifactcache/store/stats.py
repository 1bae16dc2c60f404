"""Cache statistics: an append-only event log, folded into totals now and then.

Each event is one short JSON line appended with a single ``write`` on an
O_APPEND descriptor, so concurrent writers never interleave or clobber each
other, and a hit costs one small append instead of rewriting a shared file.

Writers hold a shared flock on the log while appending; compaction (when the log
passes ``COMPACT_BYTES``) holds an exclusive one, renames the log aside, folds
it into ``stats.json`` and deletes it. A writer that locked the renamed inode
sees the path moved and appends to the fresh log instead, so no event is lost.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from pathlib import Path
from typing import Any

from ._fs import STATE_MAX, flock_file, read_small, write_atomic

EVENTS = ("hit", "miss", "build", "pulled", "push", "remote_error")
COMPACT_BYTES = 256 << 10
_APPEND = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW
_COUNTERS = {"hit": "hits", "miss": "misses", "build": "builds", "pulled": "pulled"}


def _zero() -> dict[str, Any]:
    return {
        "hits": 0,
        "misses": 0,
        "builds": 0,
        "pulled": 0,
        "pushes": 0,
        "remote_errors": 0,
        "bytes_served": 0,
        "build_seconds": 0.0,
        "build_seconds_saved": 0.0,
    }


def _fold(totals: dict[str, Any], line: str) -> None:
    try:
        ev = json.loads(line)
        kind = ev["e"]
    except (ValueError, KeyError, TypeError):
        return  # a torn line from a crash mid-write: skip it, keep the rest
    if kind in _COUNTERS:
        totals[_COUNTERS[kind]] += 1
    elif kind == "push":
        totals["pushes"] += 1
    elif kind == "remote_error":
        totals["remote_errors"] += 1
    if kind in ("hit", "pulled"):
        totals["build_seconds_saved"] += float(ev.get("s", 0.0))
        totals["bytes_served"] += int(ev.get("b", 0))
    if kind == "build":
        totals["build_seconds"] += float(ev.get("s", 0.0))


class StatsLog:
    def __init__(self, base: Path) -> None:
        self.log = base / "stats.log"
        self.totals = base / "stats.json"

    def record(self, event: str, key: str, seconds: float = 0.0, nbytes: int = 0) -> None:
        if event not in EVENTS:
            raise ValueError(f"unknown stats event {event!r}")
        line = json.dumps(
            {"e": event, "k": key, "s": round(seconds, 6), "b": nbytes, "t": round(time.time(), 3)},
            separators=(",", ":"),
        )
        data = (line + "\n").encode()
        try:
            while True:
                fd = os.open(self.log, _APPEND, 0o600)
                try:
                    fcntl.flock(fd, fcntl.LOCK_SH)
                    if self._is_current(fd):
                        os.write(fd, data)
                        size = os.fstat(fd).st_size
                        break
                finally:
                    os.close(fd)
        except OSError:
            return  # a read-only cache still serves hits; it just cannot count them
        if size > COMPACT_BYTES:
            self.compact()

    def _is_current(self, fd: int) -> bool:
        try:
            return os.stat(self.log, follow_symlinks=False).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            return False

    def _read_totals(self) -> dict[str, Any]:
        totals = _zero()
        try:
            saved = json.loads(read_small(self.totals, STATE_MAX))
            for k in totals:
                totals[k] = type(totals[k])(saved.get(k, totals[k]))
        except (OSError, ValueError, TypeError):
            pass
        return totals

    def compact(self) -> None:
        try:
            fd = os.open(self.log, os.O_RDWR | os.O_NOFOLLOW)
        except OSError:
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            if not self._is_current(fd) or os.fstat(fd).st_size <= COMPACT_BYTES:
                return  # another process compacted first
            aside = self.log.with_name(f"stats.log.{os.getpid()}.folding")
            os.rename(self.log, aside)
            # Two generations of the log could be folded at once: serialize the
            # read-modify-write of the totals.
            with flock_file(self.totals.with_name("stats.json.lock")):
                totals = self._read_totals()
                with open(fd, closefd=False, encoding="utf-8", errors="replace") as f:
                    for line in f:
                        _fold(totals, line)
                write_atomic(self.totals, json.dumps(totals).encode())
            os.unlink(aside)
        finally:
            os.close(fd)

    def read(self) -> dict[str, Any]:
        totals = self._read_totals()
        try:
            with open(self.log, encoding="utf-8", errors="replace") as f:
                for line in f:
                    _fold(totals, line)
        except FileNotFoundError:
            pass
        return totals
