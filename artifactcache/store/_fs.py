"""Filesystem primitives for the local store: digests, fsync, locks, atomic swaps.

Kept apart from ``local.py`` so the store logic reads as policy, not plumbing.
Linux/POSIX only (flock, O_NOFOLLOW); nothing here imports torch.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import json
import mmap
import os
import shutil
import stat
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from ..errors import DependencyError

# Opening anything inside an entry never follows a symlink: a swapped-in link
# fails with ELOOP instead of reading some other file.
O_READ = os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


class NotRegularFile(OSError):
    """A path inside an entry (or the cache's state) is a symlink, device, fifo or
    directory. An OSError, so callers that skip unreadable files skip it too; it
    describes the entry's shape (:func:`is_shape_error`)."""


# The cache's own small files (read_small): the summary index of every entry, the stats
# totals, one entry's verification memo. Manifests have theirs in manifest.py.
INDEX_MAX = 256 << 20
STATE_MAX = 16 << 20


# Errors that describe the entry's shape (a symlink, a directory where a file
# belongs), so they mean a damaged entry. Every other OSError (EACCES, EMFILE,
# EIO, ENOSPC, ...) says something about this process or this machine right now,
# and must never cost a good entry.
_SHAPE_ERRNOS = frozenset({errno.ELOOP, errno.EISDIR, errno.ENOTDIR})


def is_shape_error(e: OSError) -> bool:
    return isinstance(e, NotRegularFile) or e.errno in _SHAPE_ERRNOS


def describe(e: OSError) -> str:
    """``Permission denied: /path`` (strerror and the file it concerns), for one-line errors."""
    what = e.strerror or str(e)
    return f"{what}: {e.filename}" if e.filename else what


def require_digest() -> None:
    """A one-line DependencyError where blake3, which every entry's digests need, cannot
    be imported: checked when a store opens, so a broken install fails before a build
    rather than after it, when its files are hashed."""
    try:
        import blake3  # noqa: F401
    except ImportError as e:
        raise DependencyError(
            f"acache's dependency blake3 cannot be imported ({e}); reinstall it: "
            "pip install --force-reinstall blake3"
        ) from None


def digest_file(path: Path) -> tuple[str, os.stat_result, os.stat_result]:
    """``("blake3:<hex>", stat before, stat after)`` of a regular file, never via a symlink.

    The file is mmapped and hashed in one ``update`` call: blake3 then splits the
    work across all cores (``max_threads=AUTO``) with the GIL released. The two
    stats let a caller memoize the result only if nothing changed meanwhile.
    """
    import blake3

    try:
        fd = os.open(path, O_READ)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise NotRegularFile(f"{path.name} is a symlink") from None
        raise
    try:
        before = os.fstat(fd)
        if not stat.S_ISREG(before.st_mode):
            raise NotRegularFile(f"{path.name} is not a regular file")
        h = blake3.blake3(max_threads=blake3.blake3.AUTO)
        if before.st_size:
            with mmap.mmap(fd, 0, access=mmap.ACCESS_READ) as mm:
                h.update(mm)
        after = os.fstat(fd)
    finally:
        os.close(fd)
    return "blake3:" + h.hexdigest(), before, after


def read_small(path: str | os.PathLike[str], limit: int) -> bytes:
    """A small file of the cache (a manifest, a state file), without io's wrappers.

    Never via a symlink (ELOOP), never a fifo, device or directory (NotRegularFile;
    O_NONBLOCK, so opening a fifo does not wait for a writer), never more than
    ``limit`` bytes (ValueError). User-given files go through limits.read_small_file.
    """
    fd = os.open(path, O_READ | os.O_NONBLOCK)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise NotRegularFile(f"{os.fspath(path)} is not a regular file")
        chunks, size = [], 0
        while size <= limit and (chunk := os.read(fd, min(1 << 20, limit + 1 - size))):
            chunks.append(chunk)
            size += len(chunk)
    finally:
        os.close(fd)
    if size > limit:
        raise ValueError(f"more than the {limit} bytes a {os.path.basename(path)} may have")
    return b"".join(chunks)


def stat_sig(st: os.stat_result) -> list[int]:
    """What must be unchanged for a memoized digest to still hold.

    ctime cannot be set from user space, so any write, truncate, chmod or
    rename-over changes it even if the writer restores mtime.
    """
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev]


def fsync_path(path: Path, *, directory: bool = False) -> None:
    flags = os.O_RDONLY | (os.O_DIRECTORY if directory else os.O_NOFOLLOW)
    fd = os.open(path, flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def walk_files(top: Path) -> tuple[dict[str, os.stat_result], list[str]]:
    """Regular files under ``top`` by relative posix path, plus problems found.

    Uses lstat semantics throughout: a symlink (to a file or a directory) or any
    special file is reported as a problem and never entered.
    """
    files: dict[str, os.stat_result] = {}
    problems: list[str] = []
    stack = [(top, "")]
    while stack:
        d, rel = stack.pop()
        with os.scandir(d) as it:
            for de in it:
                name = f"{rel}{de.name}"
                st = de.stat(follow_symlinks=False)
                if stat.S_ISREG(st.st_mode):
                    files[name] = st
                elif stat.S_ISDIR(st.st_mode):
                    stack.append((Path(de.path), name + "/"))
                elif stat.S_ISLNK(st.st_mode):
                    problems.append(f"{name} is a symlink")
                else:
                    problems.append(f"{name} is not a regular file")
    return files, problems


def rmtree(path: Path) -> None:
    """Remove a tree; a concurrent remover deleting parts of it first is fine."""

    def onerror(func, p, exc_info):  # noqa: ANN001 - shutil's callback signature
        if not isinstance(exc_info[1], FileNotFoundError):
            raise exc_info[1]

    if os.path.lexists(path):
        if os.path.islink(path) or not os.path.isdir(path):
            os.unlink(path)
        else:
            shutil.rmtree(path, onerror=onerror)


# ------------------------------------------------------------------ locks --


@contextlib.contextmanager
def flock_file(path: Path, *, blocking: bool = True, shared: bool = False) -> Iterator[bool]:
    """Exclusive (or shared) flock on ``path`` (created if needed); yields whether it is held.

    Not the filelock package: it cannot tell that ``prune`` unlinked the lock file.

    After locking, the path must still name the inode we locked: ``prune`` may
    unlink a lock file it holds, and a waiter that locked the unlinked inode
    would otherwise believe it owned the key. In that case we retry on the new
    file. The kernel drops the lock when the process dies, even by SIGKILL.
    """
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            mode = fcntl.LOCK_SH if shared else fcntl.LOCK_EX
            fcntl.flock(fd, mode | (0 if blocking else fcntl.LOCK_NB))
        except BlockingIOError:
            os.close(fd)
            yield False
            return
        except BaseException:
            os.close(fd)
            raise
        try:
            same = os.stat(path, follow_symlinks=False).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    try:
        yield True
    finally:
        os.close(fd)  # closing releases the flock


def try_lock_dir(path: Path) -> int | None:
    """A non-blocking flock on a directory: the fd if taken, None if someone holds it."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def lock_dir(path: Path) -> int:
    """A blocking flock on a directory we just created; returns the fd to hold."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


# ---------------------------------------------------------- atomic swaps --

_RENAME_NOREPLACE = 1
_RENAME_EXCHANGE = 2
_libc = None


def _renameat2(a: Path, b: Path, flags: int) -> bool:
    """Linux renameat2(a, b, flags); False where libc, kernel or filesystem lacks it."""
    global _libc
    try:
        if _libc is None:
            _libc = ctypes.CDLL(None, use_errno=True)
        fn = _libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd = -100
    rc = fn(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), flags)
    if rc == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(a), None, str(b))


def exchange(a: Path, b: Path) -> bool:
    """Atomically swap two paths (Linux renameat2 RENAME_EXCHANGE); False if unsupported."""
    return _renameat2(a, b, _RENAME_EXCHANGE)


def rename_noreplace(a: Path, b: Path) -> None:
    """Rename ``a`` to ``b``; FileExistsError if anything (even a dangling link) is at ``b``.

    Atomic where renameat2(RENAME_NOREPLACE) works; elsewhere a check then a rename,
    which a path created in between would lose to.
    """
    if _renameat2(a, b, _RENAME_NOREPLACE):
        return
    if os.path.lexists(b):
        raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(b))
    os.rename(a, b)


def write_atomic(path: Path, data: bytes, mode: int = 0o600) -> None:
    """Write a small file by tmp + fsync + rename, so readers see old or new, never half;
    a failed write leaves no tmp file behind."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, mode)
    try:
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def read_memo(path: str | os.PathLike[str], limit: int = INDEX_MAX) -> dict[str, Any]:
    """A memo file: a JSON object that only saves work. Read as read_small does (bounded,
    never via a symlink or a fifo); absent, unreadable or damaged reads as empty."""
    try:
        memo = json.loads(read_small(path, limit))
    except (OSError, ValueError):
        return {}
    return memo if isinstance(memo, dict) else {}


def write_memo(path: Path, memo: Mapping[str, Any], mode: int = 0o600, **dumps: Any) -> None:
    """Write a memo whole (write_atomic), best effort: a read-only cache or install only
    loses the speed-up, never the caller's result."""
    with contextlib.suppress(OSError):
        write_atomic(path, json.dumps(memo, **dumps).encode(), mode)


_MEMO_UPDATE = threading.Lock()


def add_to_memo(path: Path, key: str, value: Any, **dumps: Any) -> None:
    """Add one entry to a memo, read afresh and written whole (write_memo) under one
    process-wide lock: threads adding at once lose no entry (processes may, which only
    costs the work again)."""
    with _MEMO_UPDATE:
        memo = read_memo(path)
        memo[key] = value
        write_memo(path, memo, **dumps)
