"""A child process for the store's multi-process tests (not collected by pytest).

Run as ``python _store_worker.py MODE ROOT KEY MARKER [N]``. A fresh interpreter
(not fork) so blake3's thread pool and the flocks start clean, as in real use.
Each stage reached is appended to MARKER, so the parent knows where a SIGKILL
landed.

Modes:
  race     wait for MARKER + ".go", then get_or_build (slow build); print the result
  slow     get_or_build with a build and a publish slowed by sleeps (SIGKILL trials)
  record   record N "hit" events (stats under concurrency, with compaction forced)
  read     open KEY under store.reading(KEY), mark "reading", hold it until MARKER + ".go"
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import artifactcache.store.local as local
from artifactcache.store import stats


def mark(marker: str, stage: str) -> None:
    fd = os.open(marker, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    os.write(fd, f"{stage}\n".encode())
    os.close(fd)


def main() -> None:
    mode, root, key, marker = sys.argv[1:5]
    factors = {"schema": 1, "test": key[:8]}
    store = local.LocalStore(root)

    if mode == "record":
        stats.COMPACT_BYTES = 2048  # force many compactions while others append
        mark(marker, "start")
        for _ in range(int(sys.argv[5])):
            store.record("hit", key, 1.0, 10)
        return

    if mode == "read":
        with store.reading(key):
            store.open(key)
            mark(marker, "reading")
            go = Path(marker + ".go")
            while not go.exists():
                time.sleep(0.005)
        return

    if mode == "race":
        mark(marker, "ready")
        go = Path(marker + ".go")
        while not go.exists():
            time.sleep(0.001)

        def build(d: Path) -> dict:
            mark(marker + ".builds", str(os.getpid()))
            (d / "a.bin").write_bytes(os.urandom(4096))
            time.sleep(0.3)  # long enough that every other process is waiting on the lock
            return {"pid": os.getpid()}

        entry, source = store.get_or_build(key, factors, build)
        print(json.dumps({"source": source, "created": entry.created, "files": entry.files}))
        return

    if mode == "slow":
        local.PUBLISH_HOOK = lambda stage: (mark(marker, stage), time.sleep(0.03))
        mark(marker, "start")

        def slow_build(d: Path) -> dict:
            mark(marker, "build")
            for i in range(3):
                (d / f"part{i}.bin").write_bytes(os.urandom(64 << 10))
                time.sleep(0.03)
            (d / "sub").mkdir()
            (d / "sub" / "meta.txt").write_text("x")
            return {}

        store.get_or_build(key, factors, slow_build)
        mark(marker, "done")
        return

    raise SystemExit(f"unknown mode {mode}")


if __name__ == "__main__":
    main()
