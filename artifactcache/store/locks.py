"""Per-key locks of the local store: one builder per key, and the loaders reading it.

Two flocks per key, under ``locks/``:

* ``<key>.lock``, exclusive: held by whoever builds, pulls, publishes, quarantines
  or removes the entry (``LocalStore.lock``);
* ``<key>.readers``, shared: held by loaders from the lookup (which verifies) to the
  last file their backend opens (``reading``). ``gc``/``rm`` try it exclusively and
  never wait; replacing an existing entry waits for it (``no_readers``).

The order is always the key's lock first, then its readers lock exclusively. A
thread that holds the shared readers lock and then needs the key's lock (a load
that misses and builds) lets its shared hold go while it waits, and takes it back
once it has the key's lock: otherwise it and a builder replacing the entry would
each wait for the other. Both are re-entrant within one thread.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from ..errors import EntryInUse
from . import _fs

# How long replacing an entry (a forced rebuild) waits for the loaders reading it.
READERS_WAIT_S = 120.0


class KeyLocksMixin:
    """The key and readers locks, for :class:`~artifactcache.store.local.LocalStore`."""

    base: Path
    _held: threading.local
    entry_path: Callable[[str], Path]  # LocalStore's: validates the key

    def _own_reading(self, key: str) -> contextlib.ExitStack | None:
        return self._held.__dict__.setdefault("reading", {}).get(key)

    @contextlib.contextmanager
    def lock(self, key: str) -> Iterator[None]:
        """The per-key lock across processes; re-entrant within one thread.

        This thread's own shared readers hold of ``key`` is let go while it waits, and
        taken back once the lock is held (see the module's docstring).
        """
        self.entry_path(key)  # validates the key before it becomes a file name
        held: set[str] = self._held.__dict__.setdefault("keys", set())
        if key in held:
            yield
            return
        own = self._own_reading(key)
        if own is not None:
            own.close()
        try:
            with _fs.flock_file(self.base / "locks" / f"{key}.lock"):
                if own is not None:
                    self._hold_shared(own, key)
                    own = None
                held.add(key)
                try:
                    yield
                finally:
                    held.discard(key)
        finally:
            if own is not None:  # never got the lock (interrupted, an OS error)
                self._hold_shared(own, key)

    def readers_lock_path(self, key: str) -> Path:
        self.entry_path(key)  # validates the key before it becomes a file name
        return self.base / "locks" / f"{key}.readers"

    def _hold_shared(self, stack: contextlib.ExitStack, key: str) -> None:
        with contextlib.suppress(OSError):  # a cache we may not write: unguarded, as reading()
            stack.enter_context(_fs.flock_file(self.readers_lock_path(key), shared=True))

    @contextlib.contextmanager
    def reading(self, key: str) -> Iterator[None]:
        """Hold the key's shared reader lock; ``gc`` and ``rm`` leave the entry alone meanwhile.

        Wrap the lookup (which verifies) and the backend's load in it, so the entry
        cannot vanish between verification and the last file the loader opens.
        Readers share the lock; ``rm``/``gc`` try it exclusively and never wait; a
        rebuild replacing the entry waits for it (``no_readers``). Re-entrant within
        one thread.
        """
        held: dict[str, contextlib.ExitStack] = self._held.__dict__.setdefault("reading", {})
        if key in held:
            yield
            return
        with contextlib.ExitStack() as guard:
            self._hold_shared(guard, key)
            held[key] = guard
            try:
                yield
            finally:
                del held[key]

    @contextlib.contextmanager
    def no_readers(self, key: str) -> Iterator[None]:
        """The key's reader lock, exclusively: replacing an entry waits until no loader
        holds it, so no load ever sees its files change. Gives up with EntryInUse after
        READERS_WAIT_S. The caller holds the key's lock, so no loader waiting for that
        lock holds a reader lock meanwhile (``lock`` lets it go).

        This thread's own shared hold (a rebuild asked for during its load, e.g. a stale
        artifact) is let go meanwhile and taken back afterwards.
        """
        path = self.readers_lock_path(key)
        own = self._own_reading(key)
        if own is not None:
            own.close()
        deadline = time.monotonic() + READERS_WAIT_S
        try:
            while True:
                with _fs.flock_file(path, blocking=False) as free:
                    if free:
                        yield
                        return
                if time.monotonic() > deadline:
                    raise EntryInUse(
                        f"entry {key[:12]} is still being loaded after {READERS_WAIT_S:.0f} s; "
                        "nothing was replaced: rebuild it when the loaders are done"
                    )
                time.sleep(0.05)
        finally:
            if own is not None:
                self._hold_shared(own, key)
