"""The cache root's safety checks: refuse a root that is a symlink, foreign or shared."""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterable
from pathlib import Path

from ..errors import CacheRootError


def prepare_root(root: Path, base: Path, subdirs: Iterable[str], *, allow_shared: bool) -> None:
    """Create ``root`` (0700) and ``base``'s subdirs, or raise a one-line CacheRootError."""
    hint = "pass another --cache-dir or set ACACHE_DIR"
    try:
        try:
            st = os.lstat(root)
        except FileNotFoundError:
            os.makedirs(root, mode=0o700)
            os.chmod(root, 0o700)  # makedirs' mode is masked by the umask
            st = os.lstat(root)
    except OSError as e:
        raise CacheRootError(f"cannot create cache dir {root} ({e.strerror}); {hint}") from None
    if stat.S_ISLNK(st.st_mode):
        if not allow_shared:
            raise CacheRootError(
                f"cache dir {root} is a symlink; point --cache-dir at the real directory "
                "or pass --allow-shared-root if you trust its target"
            )
        st = os.stat(root)
    if not stat.S_ISDIR(st.st_mode):
        raise CacheRootError(f"cache dir {root} is not a directory; {hint}")
    if not allow_shared:
        if st.st_uid != os.geteuid():
            raise CacheRootError(
                f"cache dir {root} is owned by uid {st.st_uid}, not you (uid {os.geteuid()}); "
                "use your own --cache-dir or pass --allow-shared-root"
            )
        if st.st_mode & 0o022:
            raise CacheRootError(
                f"cache dir {root} is writable by group or others (mode "
                f"{stat.S_IMODE(st.st_mode):o}); run `chmod 700 {root}` or pass "
                "--allow-shared-root"
            )
    if not os.access(root, os.R_OK | os.W_OK | os.X_OK):
        raise CacheRootError(f"cache dir {root} is not readable and writable by you; {hint}")
    try:
        for d in [base, *(base / s for s in subdirs)]:
            with contextlib.suppress(FileExistsError):
                os.mkdir(d, 0o700)
            if not stat.S_ISDIR(os.lstat(d).st_mode):
                raise CacheRootError(f"{d} is not a directory (a symlink?); remove it")
    except OSError as e:
        msg = f"cannot write to cache dir {root} ({e.strerror}); {hint}"
        raise CacheRootError(msg) from None
