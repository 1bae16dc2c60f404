"""The remote tier: a shared S3 bucket in front of which every host keeps its LocalStore.

Remote layout under ``s3://bucket/prefix``::

    v1/<key>/manifest.json          the local manifest, byte for byte in meaning; written LAST
    v1/<key>/<tree>/<relpath>       the entry's files; <tree> = sha256 of {relpath: digest}[:16]

Files go up first and the manifest last, with a conditional put (If-None-Match:
``*``), so a reader that finds a manifest finds every file it names, and the
first manifest to land wins. Files sit under a ``<tree>`` directory named by
their digests: two hosts whose builds of one key differ byte-wise (torch.compile
is not always deterministic) write to different trees and can never overwrite
each other's files under the winning manifest; hosts with identical builds write
identical bytes to the same tree. The loser of a race deletes its own tree.

Readers trust nothing but digests: a pull downloads into a local staging dir and
``LocalStore.publish_dir`` checks every file against the manifest before the
entry appears locally. A remote failure in a build or load path is one warning
line, a ``remote_error`` stat, and a miss. docs/remote.md names the test behind
each of these promises.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Protocol

from ..errors import IntegrityError, KeyLookupError, RemoteError
from ..keys import compute_key, is_full_key, normalize_prefix
from .entry import Entry, check_manifest
from .s3 import RemoteUnreachable, S3Store, parse_url

__all__ = [
    "RemoteStore",
    "S3Store",
    "TieredStore",
    "check_remote",
    "fetch_manifest",
    "list_entries",
    "list_remote",
    "open_tiered",
    "parse_url",
    "pull_entry",
    "push_entry",
]

LAYOUT_DIR = "v1"
MANIFEST = "manifest.json"
# After a remote gave no answer at all, a process skips it for this long, so a
# down server costs one timeout per process, not one per lookup and push.
UNREACHABLE_BACKOFF_S = 60.0
# Tests set this to act between push stages ("file:<relpath>", "manifest"); None in normal use.
PUSH_HOOK: Callable[[str], None] | None = None


class RemoteStore(Protocol):
    """Object access the tier needs; paths are relative to the remote's prefix."""

    url: str

    def get(self, path: str) -> bytes | None: ...
    def put(self, path: str, data: bytes, *, create: bool = False) -> bool: ...
    def exists(self, path: str) -> bool: ...
    def list(self, prefix: str = "", *, dirs: bool = False) -> list[str]: ...
    def delete(self, paths: list[str]) -> None: ...
    def check(self) -> dict[str, Any]: ...
    def upload_file(self, path: str, src: Path, size: int, digest: str) -> None: ...
    def download_file(self, path: str, dest: Path, size: int) -> None: ...


# ------------------------------------------------------------- layout --


def tree_id(manifest: dict[str, Any]) -> str:
    files = {rel: info["digest"] for rel, info in manifest["files"].items()}
    return hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()[:16]


def manifest_path(key: str) -> str:
    return f"{LAYOUT_DIR}/{key}/{MANIFEST}"


def file_path(key: str, tree: str, rel: str) -> str:
    return f"{LAYOUT_DIR}/{key}/{tree}/{rel}"


def _hook(stage: str) -> None:
    if PUSH_HOOK is not None:
        PUSH_HOOK(stage)


# Files up to this size move several at a time (a compiled package can hold dozens
# of small files, each a round trip); bigger ones one at a time, each with parallel parts.
SMALL_FILE = 16 << 20
FILE_CONCURRENCY = 8


def _for_each_file(fn: Callable[[str, dict], None], files: dict[str, dict]) -> None:
    items = sorted(files.items())
    small = [(r, i) for r, i in items if int(i["size"]) <= SMALL_FILE]
    with ThreadPoolExecutor(FILE_CONCURRENCY) as pool:
        futures = [pool.submit(fn, r, i) for r, i in small]
        try:
            for fut in futures:
                fut.result()
        except BaseException:
            for fut in futures:
                fut.cancel()  # fail fast: do not start the rest against a broken remote
            raise
    for rel, info in items:
        if int(info["size"]) > SMALL_FILE:
            fn(rel, info)


# ---------------------------------------------------- manifest helpers --


def fetch_manifest(remote: RemoteStore, key: str) -> dict[str, Any] | None:
    """The remote manifest of ``key``, None if absent; IntegrityError if unusable."""
    data = remote.get(manifest_path(key))
    if data is None:
        return None
    try:
        manifest = json.loads(data)
    except ValueError:
        raise IntegrityError(f"remote manifest of {key[:12]} is not valid JSON") from None
    if problem := check_manifest(manifest, key):
        raise IntegrityError(f"remote manifest of {key[:12]} is unusable ({problem})")
    # As for bundles: a manifest may only name the key its own factors hash to, so a
    # writable bucket cannot plant an artifact under another entry's key.
    try:
        ok = compute_key(manifest["factors"]) == key
    except (KeyError, TypeError):
        ok = False
    if not ok:
        raise IntegrityError(f"remote manifest of {key[:12]}: its factors do not hash to the key")
    return manifest


def push_entry(remote: RemoteStore, entry: Entry, *, replace: bool = False) -> str:
    """Upload files, then the manifest; "pushed", or "exists" when a manifest was there first.

    Every file is hashed while it is uploaded and must match the manifest
    (IntegrityError otherwise). ``replace`` overwrites the remote copy (a repair,
    when a remote file is known to be corrupt); a remote manifest that does not
    even parse is replaced always, since no reader can use it.
    """
    key, manifest = entry.key, entry.manifest
    old: dict[str, Any] | None = None
    try:
        old = fetch_manifest(remote, key)
    except IntegrityError:
        replace = True  # unusable for every reader: a verified copy may take its place
    if old is not None and not replace:
        return "exists"  # first manifest wins, whatever its bytes
    tree = tree_id(manifest)

    def upload(rel: str, info: dict) -> None:
        remote.upload_file(
            file_path(key, tree, rel), entry.path / rel, info["size"], info["digest"]
        )
        _hook(f"file:{rel}")

    _for_each_file(upload, manifest["files"])
    _hook("manifest")
    data = json.dumps(manifest, indent=1, sort_keys=True).encode()
    if remote.put(manifest_path(key), data, create=not replace):
        if old is not None and tree_id(old) != tree:  # replaced: its files are garbage now
            remote.delete([file_path(key, tree_id(old), rel) for rel in old["files"]])
        return "pushed"
    # Lost the race: another host's manifest landed between our check and our put.
    try:
        winner = fetch_manifest(remote, key)
    except IntegrityError:
        winner = None
    if winner is not None and tree_id(winner) != tree:
        remote.delete([file_path(key, tree, rel) for rel in manifest["files"]])
    return "exists"


def pull_entry(remote: RemoteStore, local: Any, key: str) -> Entry | None:
    """Download ``key`` into staging, verify it, publish it locally; None if the remote lacks it.

    IntegrityError (nothing published) when the manifest or any file is corrupt.
    """
    manifest = fetch_manifest(remote, key)
    if manifest is None:
        return None
    tree = tree_id(manifest)
    with local.new_staging_dir() as staging:
        for rel in manifest["files"]:
            try:
                (staging / rel).parent.mkdir(parents=True, exist_ok=True)
            except OSError:  # "a" and "a/b" both listed: not a tree we can publish
                raise IntegrityError(f"remote manifest of {key[:12]} lists {rel!r} twice") from None

        def download(rel: str, info: dict) -> None:
            remote.download_file(file_path(key, tree, rel), staging / rel, int(info["size"]))

        _for_each_file(download, manifest["files"])
        entry = local.publish_dir(staging, manifest)  # checks every digest, or publishes nothing
    local.record("pulled", key, entry.build_seconds, entry.size)
    return entry


def list_entries(remote: RemoteStore) -> list[dict[str, Any]]:
    """One row per remote key: complete entries carry their manifest's summary."""
    keys = sorted(k for k in remote.list(LAYOUT_DIR, dirs=True) if is_full_key(k))

    def row(key: str) -> dict[str, Any]:
        try:
            m = fetch_manifest(remote, key)
        except IntegrityError as e:
            return {"key": key, "complete": False, "problem": str(e)}
        if m is None:  # files without a manifest: an upload in progress or abandoned
            return {"key": key, "complete": False, "problem": "no manifest"}
        files = m["files"]
        return {
            "key": key,
            "complete": True,
            "label": m.get("label") or {},
            "size": sum(int(f["size"]) for f in files.values()),
            "files": len(files),
            "created": float(m.get("created", 0.0)),
            "build_seconds": float(m.get("build_seconds", 0.0)),
        }

    with ThreadPoolExecutor(8) as pool:
        return list(pool.map(row, keys))


# -------------------------------------------------------------- tiers --


class TieredStore:
    """A LocalStore with a shared remote behind it; everything else goes to the local store."""

    def __init__(self, local: Any, remote: RemoteStore, *, read_only: bool = False) -> None:
        self.local = local
        self.remote = remote
        self.read_only = read_only
        self._corrupt: set[str] = set()  # keys whose remote copy failed verification here
        self._down_until = 0.0  # time.monotonic() before which the remote is not tried

    def __getattr__(self, name: str) -> Any:
        # Only called for names TieredStore lacks: root, base, resolve, scan, gc, ...
        return getattr(self.local, name)

    def __repr__(self) -> str:
        mode = ", read_only" if self.read_only else ""
        return f"TieredStore({self.local.root}, {self.remote.url}{mode})"

    def _warn(self, message: str, key: str) -> None:
        # One line, no traceback: the build or load goes on without the remote.
        sys.stderr.write(f"warning: {message}\n")
        sys.stderr.flush()
        with contextlib.suppress(OSError):
            self.local.record("remote_error", key)

    def _down(self) -> bool:
        return time.monotonic() < self._down_until

    def _failed(self, e: Exception) -> None:
        if isinstance(e, RemoteUnreachable):
            self._down_until = time.monotonic() + UNREACHABLE_BACKOFF_S

    def _present(self, key: str) -> Entry | None:
        """A local entry published while we waited for the key's lock, verified."""
        return self.local.get(key) if os.path.lexists(self.local.entry_path(key)) else None

    def _pull_locked(self, key: str) -> Entry | None:
        """Pull under the key's lock; any remote trouble is a warning and a miss."""
        with self.local.lock(key):
            if (entry := self._present(key)) is not None or self._down():
                return entry
            try:
                return pull_entry(self.remote, self.local, key)
            except IntegrityError as e:
                self._corrupt.add(key)
                self._warn(f"remote copy of {key[:12]} failed verification ({e}); not used", key)
            except RemoteError as e:
                self._failed(e)
                self._warn(f"{e}; treating {key[:12]} as a remote miss", key)
        return None

    def _push_quietly(self, entry: Entry, *, replace: bool = False) -> None:
        if self.read_only:
            return
        retry = f"retry with `acache push {entry.key[:12]}`"
        if self._down():
            msg = f"push of {entry.key[:12]} skipped: remote {self.remote.url} is unreachable"
            self._warn(f"{msg}; the local entry is intact, {retry}", entry.key)
            return
        try:
            replace = replace or entry.key in self._corrupt
            if push_entry(self.remote, entry, replace=replace) == "pushed":
                self.local.record("push", entry.key, 0.0, entry.size)
            self._corrupt.discard(entry.key)
        except (RemoteError, IntegrityError) as e:
            self._failed(e)
            self._warn(
                f"push of {entry.key[:12]} failed ({e}); the local entry is intact, {retry}",
                entry.key,
            )

    # ----------------------------------------- what api.py and the CLI use --

    def get(self, key: str) -> Entry | None:
        entry = self.local.get(key)
        if entry is None and is_full_key(key):
            entry = self._pull_locked(key)
        return entry

    def open(self, key: str) -> Entry:
        try:
            return self.local.open(key)
        except (KeyLookupError, IntegrityError):
            full = key.strip().lower()
            if not is_full_key(full) or (entry := self._pull_locked(full)) is None:
                raise
            return entry

    def get_or_build(
        self,
        key: str,
        factors: dict[str, Any],
        build: Callable[[Path], dict[str, Any] | None],
        *,
        force: bool = False,
        label: dict[str, Any] | None = None,
    ) -> tuple[Entry, str]:
        """(entry, "local" | "pulled" | "built"): local, then remote, then build and push."""
        if force:
            entry, source = self.local.get_or_build(key, factors, build, force=True, label=label)
        else:
            if (entry := self.local.get(key)) is not None:
                return entry, "local"
            with self.local.lock(key):
                if (entry := self._present(key)) is not None:
                    return entry, "local"
                if (entry := self._pull_locked(key)) is not None:
                    return entry, "pulled"
                # We hold the lock and saw no entry: force only skips a second miss count.
                entry, source = self.local.get_or_build(
                    key, factors, build, force=True, label=label
                )
        if source == "built":
            # After the lock: local waiters need not wait for uploads. A forced rebuild
            # replaces the remote copy too, or the fleet would keep the old one forever.
            self._push_quietly(entry, replace=force)
        return entry, source

    # ------------------------------------------------- explicit commands --

    def push(self, key: str, *, replace: bool = False) -> dict[str, Any]:
        """Explicit push: errors are raised (one line), not downgraded to warnings."""
        if self.read_only:
            raise RemoteError(
                f"push refused: remote {self.remote.url} is read-only here "
                "(--remote-read-only / ACACHE_REMOTE_READ_ONLY)"
            )
        key = self.local.resolve(key)
        entry = self.local.peek(key)  # unverified, not a hit: the upload hashes every byte
        t0 = time.perf_counter()
        try:
            status = push_entry(self.remote, entry, replace=replace)
        except (RemoteError, IntegrityError):
            with contextlib.suppress(OSError):
                self.local.record("remote_error", key)
            raise
        if status == "pushed":
            self.local.record("push", key, 0.0, entry.size)
        secs = time.perf_counter() - t0
        return {"key": key, "status": status, "bytes": entry.size, "seconds": secs}

    def resolve_remote(self, prefix: str) -> str:
        """A full key, or the one remote key starting with ``prefix`` (>= 8 hex chars)."""
        p = normalize_prefix(prefix, hint="see `acache ls --remote`")
        if is_full_key(p):
            return p
        found = [k for k in self.remote.list(LAYOUT_DIR, dirs=True) if k.startswith(p)]
        if len(found) != 1:
            what = "no remote entry matches" if not found else "ambiguous remote key"
            raise KeyLookupError(f"{what} prefix {p} in {self.remote.url}")
        return found[0]

    def pull(self, key: str) -> dict[str, Any]:
        """Explicit pull: "local" if already here, else "pulled"; errors raised."""
        key = self.resolve_remote(key)
        t0 = time.perf_counter()
        with self.local.lock(key):
            entry, status = self._present(key), "local"
            if entry is None:
                try:
                    entry, status = pull_entry(self.remote, self.local, key), "pulled"
                except (RemoteError, IntegrityError) as e:
                    with contextlib.suppress(OSError):
                        self.local.record("remote_error", key)
                    if isinstance(e, IntegrityError):
                        raise IntegrityError(
                            f"remote copy of {key[:12]} failed verification ({e}); "
                            "the local cache was left unchanged"
                        ) from None
                    raise
        if entry is None:
            raise KeyLookupError(f"remote {self.remote.url} has no entry {key[:12]}")
        secs = time.perf_counter() - t0
        return {"key": key, "status": status, "bytes": entry.size, "seconds": secs}


# ---------------------------------------------------------- entry points --


def open_remote(url: str) -> S3Store:
    """The remote for ``url`` (s3://bucket/prefix); RemoteError if the URL is malformed."""
    return S3Store(url)


def open_tiered(local: Any, url: str, read_only: bool = False) -> TieredStore:
    return TieredStore(local, open_remote(url), read_only=read_only)


def list_remote(url: str) -> list[dict[str, Any]]:
    return list_entries(open_remote(url))


def check_remote(url: str) -> dict[str, Any]:
    """For `acache doctor`: {url, reachable, readable, writable, error}; never raises."""
    try:
        remote = open_remote(url)
    except RemoteError as e:
        return {
            "url": url,
            "reachable": False,
            "readable": False,
            "writable": False,
            "error": str(e),
        }
    res = remote.check()
    return {k: res[k] for k in ("url", "reachable", "readable", "writable", "error")}
