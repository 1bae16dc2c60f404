"""Verifying a local entry against its manifest, for :class:`LocalStore`.

Every load verifies first (``LocalStore._check``): the manifest is read (bounded,
never through a symlink) and checked against the schema, then every file's size,
and its blake3 digest unless the stat memo (``state/<key>.verified``: size, mtime,
ctime, inode, device per file) shows it unchanged since it was last hashed.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import FilesystemError
from . import _fs
from .entry import MANIFEST, check_manifest, read_stored_manifest


def _read_error(key: str, e: OSError) -> FilesystemError:
    return FilesystemError(
        f"cannot read entry {key[:12]} ({_fs.describe(e)}); it was left in place "
        "(an OS error is not corruption): fix the cause and retry"
    )


class VerifyMixin:
    """Verification, for :class:`~artifactcache.store.local.LocalStore`."""

    _memo_path: Callable[[str], Path]  # LocalStore's: state/<key>.verified

    def _load_memo(self, key: str) -> dict[str, Any]:
        return _fs.read_memo(self._memo_path(key), _fs.STATE_MAX)

    def _verify(self, key: str, path: Path, *, full: bool) -> tuple[dict | None, str | None]:
        """(manifest, None): intact; (None, problem): corrupt; (None, None): absent.

        Only what the entry itself shows (a size, digest or manifest mismatch, a
        missing file, a symlink) is a problem. An OS refusal to read (EACCES,
        EMFILE, EIO, ...) raises FilesystemError and leaves the entry alone.
        """
        try:
            st = os.lstat(path)
        except (FileNotFoundError, NotADirectoryError):
            return None, None  # NotADirectory: a stray file where entries/ab/ belongs
        except OSError as e:
            raise _read_error(key, e) from None
        if not stat.S_ISDIR(st.st_mode):
            return None, "the entry is not a directory"
        try:
            manifest = read_stored_manifest(path / MANIFEST)
        except FileNotFoundError:
            return None, "manifest.json is missing"
        except ValueError as e:
            return None, f"manifest.json is unreadable ({e})"
        except OSError as e:
            if not _fs.is_shape_error(e):
                raise _read_error(key, e) from None
            why = f" ({e.strerror})" if e.strerror else ""
            return None, f"manifest.json is not a regular file{why}"
        if problem := check_manifest(manifest, key):
            return None, problem
        try:
            return self._verify_files(key, path, manifest, full=full)
        except FileNotFoundError:
            return None, None  # removed or replaced while we looked: treat as absent
        except _fs.NotRegularFile as e:
            return None, str(e)
        except OSError as e:
            if not _fs.is_shape_error(e):
                raise _read_error(key, e) from None
            return None, f"{e.filename or 'a file'} is not a regular file ({e.strerror})"

    def _verify_files(self, key: str, path: Path, manifest: dict, *, full: bool):
        found, problems = _fs.walk_files(path)
        if problems:
            return None, problems[0]
        want = manifest["files"]
        if missing := sorted(set(want) - set(found)):
            return None, f"{missing[0]} is missing"
        if extra := sorted(set(found) - set(want) - {MANIFEST}):
            return None, f"unexpected file {extra[0]}"
        memo = {} if full else self._load_memo(key)
        fresh: dict[str, list] = {}
        for rel, info in want.items():
            st = found[rel]
            if st.st_size != info["size"]:
                return None, f"{rel} is {st.st_size} bytes, manifest says {info['size']}"
            sig = [*_fs.stat_sig(st), info["digest"]]
            if memo.get(rel) == sig:
                fresh[rel] = sig
                continue
            digest, before, after = _fs.digest_file(path / rel)
            if digest != info["digest"]:
                return None, f"{rel} does not match its digest"
            if _fs.stat_sig(before) == _fs.stat_sig(after) == sig[:-1]:
                fresh[rel] = sig
        if fresh != memo:  # a read-only cache just re-hashes next time
            _fs.write_memo(self._memo_path(key), fresh)
        return manifest, None
