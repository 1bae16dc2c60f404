"""The local store: content-addressed entries on disk, layout v1.

On-disk tree (``root`` is ``$ACACHE_DIR`` or platformdirs' user cache dir)::

    <root>/                         0700, yours; refused if a symlink / foreign / shared
      v1/
        entries/ab/abcdef.../       one published entry; never changes after the rename
          manifest.json             written last: files (size, blake3), factors, label, meta
          <the artifact's files>
        locks/abcdef....lock        per-key flock: one build per key across processes
        locks/abcdef....readers     per-key shared flock: held by loaders, so gc/rm skip the entry
        staging/<uuid>/             builds in progress (flocked by their builder while alive)
        quarantine/<key>.<ns>/      entries that failed verification, moved aside
        state/<key>.verified        memo of verified (size, mtime, ctime, inode) per file
        stats.log, stats.json       append-only event log and its folded totals

An entry appears in ``entries/`` by one ``rename`` of a fully written, fsynced
staging dir, so readers see all of it or none of it. Every load verifies first
(see :meth:`LocalStore.get`); docs/cache.md lists each guarantee and its test.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import settings
from ..errors import FilesystemError, IntegrityError, KeyLookupError
from . import _fs
from . import manifest as schema
from .entry import (
    MANIFEST,
    Entry,
    EntryInfo,
    GcPlan,
    PruneResult,
    VerifyResult,
    check_manifest,
)
from .keyformat import is_full_key, normalize_prefix
from .locks import KeyLocksMixin
from .maintenance import MaintenanceMixin
from .provenance import BUILT, UNSIGNED_IMPORT, TrustMixin
from .root import prepare_root
from .stats import StatsLog
from .verify import VerifyMixin

if TYPE_CHECKING:
    from .signing import Trust

__all__ = ["Entry", "EntryInfo", "GcPlan", "LocalStore", "PruneResult", "VerifyResult"]

LAYOUT = 1
# A wait for another process's build this long is said (a hit would hide it).
WAIT_NOTICE_S = 1.0


def _say(line: str) -> None:
    """One line on stderr about what the store did on its own (as tiered.py warns)."""
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


SUBDIRS = ("entries", "locks", "staging", "quarantine", "state")
# Tests set this to observe or slow down publish stages; None in normal use.
PUBLISH_HOOK: Callable[[str], None] | None = None


def _hook(stage: str) -> None:
    if PUBLISH_HOOK is not None:
        PUBLISH_HOOK(stage)


@contextlib.contextmanager
def _os_errors(what: str) -> Iterator[None]:
    """OSError (disk full, permission denied, ...) -> one-line FilesystemError.

    Wraps every step that writes into the cache; whatever was staged is removed
    by the staging dir's own cleanup, so nothing half-written is ever published.
    """
    try:
        yield
    except OSError as e:
        full = e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
        hint = ": free some space or point --cache-dir elsewhere" if full else ""
        raise FilesystemError(
            f"{what} failed ({_fs.describe(e)}); nothing was cached{hint}"
        ) from None


def _version() -> str:
    from importlib import metadata

    try:
        return metadata.version("artifactcache")
    except metadata.PackageNotFoundError:
        return "0+unknown"


class LocalStore(KeyLocksMixin, VerifyMixin, MaintenanceMixin, TrustMixin):
    def __init__(
        self,
        root: str | os.PathLike[str] | None = None,
        *,
        allow_shared_root: bool = False,
        full_verify: bool | None = None,
        trust: Trust | Callable[[], Trust] | None = None,
        rebuild_untrusted: bool = False,
    ) -> None:
        _fs.require_digest()
        if root is None:
            root = settings.get("ACACHE_DIR")
        if root is None:
            import platformdirs

            root = platformdirs.user_cache_dir("acache")
        self.root = Path(os.path.abspath(os.path.expanduser(os.fspath(root))))
        env_allow = settings.get("ACACHE_ALLOW_SHARED_ROOT")  # "maybe": an error, not a guess
        self.allow_shared_root = allow_shared_root or env_allow
        # full_verify re-hashes every file on every hit instead of trusting the
        # stat memo (see docs/cache.md, "Verification cost").
        if full_verify is None:
            full_verify = settings.get("ACACHE_VERIFY") == "full"
        self.full_verify = full_verify
        self.base = self.root / "v1"
        prepare_root(self.root, self.base, SUBDIRS, allow_shared=self.allow_shared_root)
        self._stats = StatsLog(self.base)
        self._held = threading.local()
        self.trust = trust  # checked before a pulled entry is served (provenance.py)
        self.rebuild_untrusted = rebuild_untrusted

    # ---------------------------------------------------------- primitives --

    def entry_path(self, key: str) -> Path:
        if not is_full_key(key):
            raise KeyLookupError(f"{key!r} is not a full key (64 hex characters)")
        return self.base / "entries" / key[:2] / key

    def _memo_path(self, key: str) -> Path:
        return self.base / "state" / f"{key}.verified"

    def record_dependency(self, key: str) -> None:
        """Note that the entry being built in this thread reads entry ``key`` when loaded.

        The manifest's ``depends_on`` lists it: ``gc`` never evicts ``key`` while
        the dependent stays, and ``rm`` of ``key`` refuses while it has dependents.
        """
        self.entry_path(key)
        building: list[set[str]] = self._held.__dict__.setdefault("building", [])
        if not building:
            raise RuntimeError("record_dependency() is only meaningful inside a build")
        building[-1].add(key)

    @contextlib.contextmanager
    def new_staging_dir(self) -> Iterator[Path]:
        """A fresh dir under staging/, flocked while we live; removed unless published.

        The flock is how ``prune`` tells a live build from a SIGKILLed one: the
        kernel drops it when the process dies, whatever the pid or its age.
        """
        while True:
            d = self.base / "staging" / uuid.uuid4().hex
            with _os_errors(f"creating a staging dir in {self.base / 'staging'}"):
                os.mkdir(d, 0o700)
            try:
                fd = _fs.lock_dir(d)
            except FileNotFoundError:
                continue  # prune removed it between mkdir and flock
            try:
                if os.stat(d, follow_symlinks=False).st_ino == os.fstat(fd).st_ino:
                    break
            except FileNotFoundError:
                pass
            os.close(fd)
        try:
            yield d
        finally:
            try:
                _fs.rmtree(d)  # gone already if it was published
            finally:
                os.close(fd)

    def record(self, event: str, key: str, seconds_saved: float = 0.0, nbytes: int = 0) -> None:
        """Count a stats event: hit, miss, build, pulled, push, remote_error."""
        self._stats.record(event, key, seconds_saved, nbytes)

    # -------------------------------------------------------------- verify --

    def _quarantine(self, key: str, path: Path, problem: str) -> None:
        """Move a bad entry aside. The caller holds the key's lock."""
        dst = self.base / "quarantine" / f"{key}.{time.time_ns()}"
        with contextlib.suppress(OSError):  # read-only or vanished: the load still fails
            os.rename(path, dst)
            (dst / "QUARANTINE_REASON").write_text(problem + "\n")
            self._memo_path(key).unlink()

    def _check(self, key: str, *, full: bool | None = None) -> tuple[Entry | None, str | None]:
        path = self.entry_path(key)
        manifest, problem = self._verify(key, path, full=self.full_verify if full is None else full)
        if problem is not None:
            with self.lock(key):  # re-check under the lock: a builder may have replaced it
                manifest, problem = self._verify(key, path, full=True)
                if problem is not None:
                    self._quarantine(key, path, problem)
                    return None, problem
        return (Entry(key, path, manifest), None) if manifest is not None else (None, None)

    def _hit(self, entry: Entry) -> Entry:
        # last-used: one utime, no rewrite. An explicit time, because the kernel's
        # coarse clock (UTIME_NOW) can lag time.time(), which gc plans compare to.
        now = time.time_ns()
        with contextlib.suppress(OSError):
            os.utime(entry.path, ns=(now, now))
        self.record("hit", entry.key, entry.build_seconds, entry.size)
        return entry

    # ------------------------------------------------------------- lookups --

    def get(self, key: str) -> Entry | None:
        """A verified entry, or None; a corrupt entry is quarantined first (and said)."""
        entry, problem = self._check(key)
        if problem is not None:
            _say(
                f"warning: entry {key[:12]} failed verification ({problem}); moved to "
                f"{self.base / 'quarantine'} and treated as a miss"
            )
        if entry is not None:
            entry = self._served(entry)
        if entry is None:
            self.record("miss", key)
            return None
        return self._hit(entry)

    def open(self, key: str, *, serving: bool = True) -> Entry:
        """Like get, for a key or unique prefix; raises KeyLookupError / IntegrityError.

        ``serving=False`` (export: copying bytes, not loading them) verifies the entry
        but does not ask whether this host may still serve it (``untrusted``).
        """
        key = self.resolve(key)
        entry, problem = self._check(key)
        if problem is not None:
            raise IntegrityError(
                f"entry {key[:12]} failed verification ({problem}) and was quarantined; "
                "rebuild it (acache build) or import it again"
            )
        if entry is None:
            raise KeyLookupError(f"no entry {key[:12]} (see `acache ls`)")
        return self._hit(self._served(entry, rebuild=False) if serving else entry)  # type: ignore[arg-type]

    def resolve(self, prefix: str) -> str:
        """The one full key starting with ``prefix`` (at least 8 hex characters)."""
        p = normalize_prefix(prefix)
        try:
            names = [n for n in os.listdir(self.base / "entries" / p[:2]) if n.startswith(p)]
        except (FileNotFoundError, NotADirectoryError):  # NotADirectory: a stray file there
            names = []
        names = [n for n in names if is_full_key(n)]
        if not names:
            bad = [n for n in os.listdir(self.base / "quarantine") if n.startswith(p)]
            why = " (it failed verification and was quarantined; rebuild it)" if bad else ""
            raise KeyLookupError(f"no entry matches key prefix {p}{why} (see `acache ls`)")
        if len(names) > 1:
            raise KeyLookupError(
                f"key prefix {p} is ambiguous ({len(names)} entries match); give more characters"
            )
        return names[0]

    # ------------------------------------------------------------- publish --

    def _digest_tree(self, d: Path) -> tuple[dict[str, dict], dict[str, list]]:
        found, problems = _fs.walk_files(d)
        if problems:
            raise IntegrityError(f"rejected {d.name}: {problems[0]}")
        files, memo = {}, {}
        for rel in sorted(found):
            digest, before, after = _fs.digest_file(d / rel)
            files[rel] = {"size": after.st_size, "digest": digest}
            if _fs.stat_sig(before) == _fs.stat_sig(after):
                memo[rel] = [*_fs.stat_sig(after), digest]
        return files, memo

    def publish_dir(
        self, staging_dir: Path, manifest: dict[str, Any], *, provenance: dict = UNSIGNED_IMPORT
    ) -> Entry:
        """Verify staging_dir against ``manifest`` and publish it atomically.

        Used by bundle import and remote pull. Every file must match the
        manifest's size and digest, with nothing missing or extra; otherwise
        IntegrityError and nothing is published. An intact entry already there
        wins and the staged copy is discarded, unless it may no longer be served
        (:meth:`untrusted`). ``provenance`` (where the entry came from, as the
        caller found) replaces any the manifest carries: it never vouches for itself.
        """
        return self.publish_or_keep(staging_dir, manifest, provenance=provenance)[0]

    def publish_or_keep(
        self, staging_dir: Path, manifest: dict[str, Any], *, provenance: dict = UNSIGNED_IMPORT
    ) -> tuple[Entry, bool]:
        """:meth:`publish_dir`, and whether it published: False when the entry already
        there was kept (and the staged copy discarded)."""
        key = str(manifest.get("key", ""))
        self.entry_path(key)
        manifest = {**schema.content(manifest), "provenance": dict(provenance)}
        if problem := check_manifest(manifest, key):
            raise IntegrityError(f"cannot publish {key[:12]}: {problem}")
        with _os_errors(f"publishing entry {key[:12]}"):
            return self._publish_checked(staging_dir, key, manifest)

    def _publish_checked(
        self, staging_dir: Path, key: str, manifest: dict[str, Any]
    ) -> tuple[Entry, bool]:
        if (staging_dir / MANIFEST).exists():
            (staging_dir / MANIFEST).unlink()  # ours is written from the given dict below
        files, memo = self._digest_tree(staging_dir)
        want = {r: {"size": i["size"], "digest": i["digest"]} for r, i in manifest["files"].items()}
        if files != want:
            bad = sorted(set(files) ^ set(want)) or [r for r in want if files[r] != want[r]]
            raise IntegrityError(
                f"entry {key[:12]} does not match its manifest ({bad[0]}); nothing was published"
            )
        with self.lock(key):
            existing, _ = self._check(key)
            if existing is not None and self.untrusted(existing) is None:
                _fs.rmtree(staging_dir)
                return existing, False
            return self._install(staging_dir, dict(manifest), memo), True

    def _install(self, staging: Path, manifest: dict, memo: dict) -> Entry:
        """Write the manifest, fsync everything, rename into entries/. Caller holds the lock.

        Replacing an entry that is there waits for its loaders (``no_readers``); a
        first publish waits for nobody: a loader may hold the key's readers lock
        while it waits for ours, to load what we publish.
        """
        key = manifest["key"]
        data = json.dumps(manifest, indent=1, sort_keys=True).encode()
        if len(data) > schema.STORED_MAX_BYTES:  # it could not be loaded: refuse it now
            raise IntegrityError(
                f"cannot publish {key[:12]}: its manifest.json would be {len(data)} bytes, "
                f"more than the {schema.STORED_MAX_BYTES} a stored manifest may have; "
                "nothing was published"
            )
        _hook("manifest")
        (staging / MANIFEST).write_bytes(data)
        found, _ = _fs.walk_files(staging)
        for rel in found:
            _fs.fsync_path(staging / rel)
        for d in {(staging / rel).parent for rel in found}:
            _fs.fsync_path(d, directory=True)
        _hook("fsynced")
        dst = self.entry_path(key)
        with contextlib.suppress(FileExistsError):
            os.mkdir(dst.parent, 0o700)
        if not stat.S_ISDIR(os.lstat(dst.parent).st_mode):
            raise FilesystemError(
                f"cannot publish {key[:12]}: {dst.parent} is not a directory; remove it"
            )
        # Replacing: no loader may be reading the entry being swapped out.
        replace = os.path.lexists(dst)
        with self.no_readers(key) if replace else contextlib.nullcontext():
            try:
                os.rename(staging, dst)
            except OSError as e:
                if e.errno not in (errno.ENOTEMPTY, errno.EEXIST) or not replace:
                    raise
                if not _fs.exchange(staging, dst):  # no RENAME_EXCHANGE: brief gap, no mix
                    aside = staging.with_name(staging.name + ".old")
                    os.rename(dst, aside)
                    os.rename(staging, dst)
                    staging = aside
        if staging.exists():
            _fs.rmtree(staging)  # the old entry, deleted after the readers' lock is let go
        _hook("renamed")
        _fs.fsync_path(dst.parent, directory=True)
        _fs.write_memo(self._memo_path(key), memo)
        now = time.time_ns()
        os.utime(dst, ns=(now, now))
        return Entry(key, dst, manifest)

    def get_or_build(
        self,
        key: str,
        factors: dict[str, Any],
        build: Callable[[Path], dict[str, Any] | None],
        *,
        force: bool = False,
        label: dict[str, Any] | None = None,
        miss_counted: bool = False,
    ) -> tuple[Entry, str]:
        """(entry, "local" | "built"): one build per key across processes.

        ``build(workdir)`` writes the artifact into a fresh staging dir and returns
        metadata for the manifest. If it raises, nothing is published and the
        staging dir is removed; force=True rebuilds and swaps the entry atomically.
        ``miss_counted``: the caller (the tiered store) already looked the key up and
        counted its miss; it is looked up again under the lock, without counting.
        """
        if not force and not miss_counted and (entry := self.get(key)) is not None:
            return entry, "local"
        t_wait = time.perf_counter()
        with self.lock(key):  # lets this thread's reader lock go while it waits
            waited = time.perf_counter() - t_wait
            if not force:
                entry, _ = self._check(key)  # a waiter loads what the builder published
                if entry is not None and self._served(entry) is not None:
                    if waited >= WAIT_NOTICE_S:
                        _say(
                            f"note: waited {waited:.1f} s for another build of {key[:12]}; "
                            "using the entry it published"
                        )
                    return self._hit(entry), "local"
            with _os_errors(f"building {key[:12]}"), self.new_staging_dir() as work:
                t0 = time.perf_counter()
                meta, depends_on = self._run_build(build, work)
                seconds = time.perf_counter() - t0
                _hook("built")
                files, memo = self._digest_tree(work)
                if MANIFEST in files:
                    raise IntegrityError(f"build output rejected: it wrote its own {MANIFEST}")
                manifest = {
                    "layout": LAYOUT,
                    "key": key,
                    "arch_key": (label or {}).get("arch_key"),
                    "factors": factors,
                    "label": label or {},
                    "meta": meta,
                    "files": files,
                    "depends_on": depends_on,
                    "created": time.time(),
                    "build_seconds": round(seconds, 6),
                    "acache_version": _version(),
                    "provenance": dict(BUILT),
                }
                if problem := check_manifest(manifest, key):  # strict writing: what loads reads
                    raise IntegrityError(f"build output rejected: {problem}")
                entry = self._install(work, manifest, memo)
        self.record("build", key, seconds, entry.size)
        return entry, "built"

    def _run_build(
        self, build: Callable[[Path], dict[str, Any] | None], work: Path
    ) -> tuple[dict[str, Any], list[str]]:
        """build(work)'s metadata, and the keys it named through record_dependency()."""
        building: list[set[str]] = self._held.__dict__.setdefault("building", [])
        building.append(set())
        try:
            meta = build(work) or {}
        finally:
            deps = building.pop()
        return meta, sorted(deps)
