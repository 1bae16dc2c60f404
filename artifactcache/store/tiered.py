"""The tiered store: a host's LocalStore with the shared remote behind it.

Lookups go local first, then remote (under the key's local lock, so one process
downloads while the others wait), then build and push. In these implicit paths
any remote trouble (down, corrupt, unsigned, untrusted) is one warning line, a
``remote_error`` stat and a miss; the explicit ``push`` and ``pull`` raise
instead. Every pull goes through ``remote.pull_entry`` with this host's
``Trust``, so no path publishes an entry whose signature it has not checked.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import IntegrityError, KeyLookupError, RemoteError, UntrustedEntry
from . import signing
from .entry import Entry
from .keyformat import is_full_key, normalize_prefix
from .provenance import push_problem
from .remote import LAYOUT_DIR, RemoteStore, open_remote, pull_entry, push_entry
from .s3 import RemoteUnreachable
from .signing import Signer, Trust

if TYPE_CHECKING:
    from .local import LocalStore

# After a remote gave no answer at all, a process skips it for this long, so a
# down server costs one timeout per process, not one per lookup and push.
UNREACHABLE_BACKOFF_S = 60.0
NO_SIGNING_KEY = (
    "no signing key (set ACACHE_SIGNING_KEY or --signing-key; `acache remote keygen PATH` "
    "makes one)"
)


class TieredStore:
    """A LocalStore with a shared remote behind it; a :class:`Store`.

    Maintenance (scan, gc, verify, ...) is not forwarded: it concerns this host's
    cache only, so callers use ``.local`` for it.
    """

    def __init__(
        self,
        local: LocalStore,
        remote: RemoteStore,
        *,
        trust: Trust,
        signer: Signer | None = None,
        read_only: bool = False,
    ) -> None:
        self.local = local
        self.remote = remote
        self.trust = trust  # which pulled entries this host uses
        local.trust = trust  # and which of those pulled earlier it still serves
        self.signer = signer  # signs what this host pushes; None: pushes unsigned or not at all
        self.read_only = read_only
        self._corrupt: set[str] = set()  # keys whose remote copy failed verification here
        self._down_until = 0.0  # time.monotonic() before which the remote is not tried

    @property
    def root(self) -> Path:
        return self.local.root

    @property
    def base(self) -> Path:
        return self.local.base

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
                return pull_entry(self.remote, self.local, key, self.trust)
            except UntrustedEntry as e:
                self._warn(f"{e}; not used, treated as a miss", key)
            except IntegrityError as e:
                self._corrupt.add(key)
                self._warn(f"remote copy of {key[:12]} failed verification ({e}); not used", key)
            except RemoteError as e:
                self._failed(e)
                self._warn(f"{e}; treating {key[:12]} as a remote miss", key)
        return None

    def _unsigned_push(self, key: str) -> None:
        """Before pushing without a signer: RemoteError unless unsigned entries are trusted."""
        if self.signer is not None:
            return
        if not self.trust.allow_unsigned:
            raise RemoteError(f"push of {key[:12]} refused: {NO_SIGNING_KEY}")
        sys.stderr.write(
            f"warning: pushing {key[:12]} unsigned (no signing key); "
            "only hosts with --remote-trust-unsigned will use it\n"
        )
        sys.stderr.flush()

    def _push_quietly(self, entry: Entry, *, replace: bool = False) -> None:
        if self.read_only:
            return
        retry = f"retry with `acache push {entry.key[:12]}`"
        if self.signer is None and not self.trust.allow_unsigned:
            self._warn(
                f"push of {entry.key[:12]} skipped: {NO_SIGNING_KEY}; a host that only "
                "pulls should run with --remote-read-only",
                entry.key,
            )
            return
        if self._down():
            msg = f"push of {entry.key[:12]} skipped: remote {self.remote.url} is unreachable"
            self._warn(f"{msg}; the local entry is intact, {retry}", entry.key)
            return
        try:
            replace = replace or entry.key in self._corrupt
            self._unsigned_push(entry.key)
            status = push_entry(
                self.remote, entry, signer=self.signer, trust=self.trust, replace=replace
            )
            if status == "pushed":
                self.local.record("push", entry.key, 0.0, entry.size)
            self._corrupt.discard(entry.key)
        except (RemoteError, IntegrityError) as e:
            self._failed(e)
            self._warn(
                f"push of {entry.key[:12]} failed ({e}); the local entry is intact, {retry}",
                entry.key,
            )

    # ----------------------------------------- what api/recipe.py and the CLI use --

    def reading(self, key: str) -> AbstractContextManager[None]:
        return self.local.reading(key)

    def record_dependency(self, key: str) -> None:
        self.local.record_dependency(key)

    def get(self, key: str) -> Entry | None:
        entry = self.local.get(key)
        if entry is None and is_full_key(key):
            entry = self._pull_locked(key)
        return entry

    def open(self, key: str) -> Entry:
        try:
            return self.local.open(key)
        except UntrustedEntry:
            raise  # intact, but its signer is no longer trusted: not a miss
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
                # We hold the lock and counted the miss: local looks again, without counting.
                entry, source = self.local.get_or_build(
                    key, factors, build, label=label, miss_counted=True
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
        self._unsigned_push(key)
        entry = self.local.peek(key)  # unverified, not a hit: the upload hashes every byte
        if why := push_problem(entry, self.trust):  # never launder what this host cannot vouch for
            raise RemoteError(why)
        t0 = time.perf_counter()
        try:
            status = push_entry(
                self.remote, entry, signer=self.signer, trust=self.trust, replace=replace
            )
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
            try:
                entry, status = self._present(key), "local"
            except UntrustedEntry:  # a copy signed by a key trusted today replaces it
                entry = None
            if entry is None:
                try:
                    entry, status = pull_entry(self.remote, self.local, key, self.trust), "pulled"
                except (RemoteError, IntegrityError) as e:
                    with contextlib.suppress(OSError):
                        self.local.record("remote_error", key)
                    if isinstance(e, UntrustedEntry):
                        raise UntrustedEntry(f"{e}; nothing was pulled") from None
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


def open_tiered(
    local: LocalStore,
    url: str,
    read_only: bool = False,
    *,
    signing_key: str | os.PathLike[str] | None = None,
    trusted_keys: str | list[str] | None = None,
    trust_unsigned: bool | None = None,
) -> TieredStore:
    """``local`` with the remote at ``url`` behind it.

    Signing and trust come from the arguments, else from ACACHE_SIGNING_KEY,
    ACACHE_TRUSTED_KEYS and ACACHE_REMOTE_TRUST_UNSIGNED (see ``signing.configure``).
    Every key file is read here, so a bad one fails before any build or transfer.
    """
    remote = open_remote(url)
    signer, trust = signing.configure(signing_key, trusted_keys, trust_unsigned)
    return TieredStore(local, remote, read_only=read_only, signer=signer, trust=trust)
