"""Export entries to a tar bundle and import them back, safely.

A bundle is a plain tar whose members are ``<key>/manifest.json`` and
``<key>/<relpath>`` for each entry's files. Import trusts nothing in it:

* every member must be a regular file (or a directory) under ``<64-hex key>/``;
  absolute paths, ``..``, symlinks, hardlinks, devices and fifos reject the
  whole bundle before anything is written;
* no name may appear twice (two ``manifest.json``, or a file that is also a
  folder): a reader of the tar and the import must see the same bytes;
* each manifest (at most manifest.STORED_MAX_BYTES) must hash to its key, and its file
  list and sizes must match the members' tar headers exactly, so a member larger
  than its manifest says is refused before a byte of it is read;
* members are written only into a staging dir inside the cache (O_NOFOLLOW,
  O_EXCL), never extracted by ``tarfile`` itself, copying exactly the declared
  size and hashing it on the way;
* all or nothing: only once every entry is staged and matches its manifest is
  any published, each through :meth:`LocalStore.publish_dir` (which checks every
  size and digest again), so a bundle cannot plant an artifact under another
  artifact's key, nor half-import.
"""

from __future__ import annotations

import contextlib
import errno
import io
import json
import os
import shutil
import stat
import tarfile
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from ..errors import AcacheError, BundleError, FilesystemError, IntegrityError
from . import _fs, provenance
from . import manifest as schema
from .entry import MANIFEST, Entry, check_manifest
from .keyformat import compute_key, is_full_key
from .local import LocalStore

Progress = Callable[[int, int], None]
_CHUNK = 4 << 20


@dataclass
class ImportResult:
    """A bundle's keys, in its order: published by the import, or already in the
    cache, where the intact entry there was kept and the bundle's copy dropped."""

    imported: list[str] = field(default_factory=list)
    present: list[str] = field(default_factory=list)


def export(
    store: LocalStore,
    keys: Iterable[str],
    out_file: str | os.PathLike[str],
    progress: Progress | None = None,
    *,
    overwrite: bool = False,
) -> list[str]:
    """Write the (verified) entries to a tar at ``out_file``; returns their full keys.

    Exporting copies bytes, it loads nothing: every entry is verified, but whether
    this host may still serve a pulled one (provenance.py) is not asked; the
    importer applies its own trust. Each entry's reader lock is held until the tar
    is written, so a forced rebuild, ``rm`` or ``gc`` cannot change it meanwhile;
    its manifest is the one verified, and every member is copied at the size its
    manifest gives and hashed on the way. The tar (mode 0600, as the cache's files)
    is written to a new temp file beside ``out_file`` and renamed over it, so
    nothing at ``out_file`` is ever written through (see ``check_export_target``).
    """
    # Before any entry is opened (the CLI checked it already, without the cache root).
    out = check_export_target(out_file, overwrite=overwrite, root=store.root)
    with contextlib.ExitStack() as reading:
        entries = []
        for key in dict.fromkeys(store.resolve(k) for k in keys):
            reading.enter_context(store.reading(key))
            entries.append(store.open(key, serving=False))  # refuses corrupt entries
        _write_bundle(store, entries, out, progress, overwrite)
    return [e.key for e in entries]


def _write_bundle(
    store: LocalStore, entries: list[Entry], out: Path, progress: Progress | None, overwrite: bool
) -> None:
    total = sum(e.size for e in entries)
    done = 0
    tmp = out.with_name(f".{out.name}.{uuid.uuid4().hex[:12]}.tmp")
    try:
        fd = os.open(
            tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600
        )
    except OSError as err:
        raise BundleError(f"cannot write bundle {out} ({err.strerror or err})") from None
    try:
        with open(fd, "wb") as raw:
            with tarfile.open(tmp, "w", fileobj=raw, format=tarfile.PAX_FORMAT) as tf:
                for e in entries:
                    data = json.dumps(e.manifest, indent=1, sort_keys=True).encode()
                    tf.addfile(_member(e, MANIFEST, len(data)), io.BytesIO(data))
                    for rel in sorted(e.files):
                        _add_file(tf, e, rel)
                        done += e.files[rel]["size"]
                        if progress:
                            progress(done, total)
            raw.flush()
            os.fsync(raw.fileno())
        if overwrite:
            # Again: the path may have changed meanwhile.
            check_export_target(out, overwrite=overwrite, root=store.root)
            os.replace(tmp, out)  # replaces a regular file (a symlink is refused above)
        else:
            try:
                _fs.rename_noreplace(tmp, out)
            except FileExistsError:
                raise BundleError(f"{out} appeared meanwhile; left it alone ({_REPLACE})") from None
    except OSError as err:
        tmp.unlink(missing_ok=True)
        raise BundleError(f"cannot write bundle {out} ({err.strerror or err})") from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _member(e: Entry, rel: str, size: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(f"{e.key}/{rel}")
    info.size, info.mtime, info.mode = size, int(e.created), 0o644
    return info


class _Hashing:
    """A file object that hashes what is read through it (tarfile reads exactly the size)."""

    def __init__(self, f: IO[bytes]) -> None:
        import blake3

        self.f, self.h = f, blake3.blake3(max_threads=blake3.blake3.AUTO)

    def read(self, n: int = -1) -> bytes:
        chunk = self.f.read(n)
        self.h.update(chunk)
        return chunk


def _add_file(tf: tarfile.TarFile, e: Entry, rel: str) -> None:
    """One file of the entry, at the size its manifest gives; IntegrityError unless its
    bytes are the ones the manifest's digest names (changed under us, or damaged)."""
    info = e.files[rel]
    with open(os.open(e.file(rel), _fs.O_READ), "rb") as f:
        src = _Hashing(f)
        intact = os.fstat(f.fileno()).st_size == info["size"]
        if intact:
            tf.addfile(_member(e, rel, info["size"]), src)
            intact = not f.read(1) and f"blake3:{src.h.hexdigest()}" == info["digest"]
    if not intact:
        raise IntegrityError(
            f"entry {e.key[:12]}: {rel} no longer matches its manifest; nothing was "
            "written: run `acache verify`, then export again"
        )


_REPLACE = "use --force to replace a file"


def check_export_target(
    out: str | os.PathLike[str],
    *,
    overwrite: bool = False,
    root: str | os.PathLike[str] | None = None,
) -> Path:
    """``out`` made absolute, if export may put a bundle there; BundleError otherwise.

    The one check of an export path: the CLI calls it before the store is opened
    (so a bad ``--output`` costs no verification), and :func:`export` again with the
    cache ``root``, and once more just before it renames the bundle into place.
    Export never writes into an existing file: the bundle is renamed onto the path,
    and only a regular file is ever replaced, and only with ``overwrite``. A symlink
    (to anything, a directory included), a directory, a device, fifo or socket is
    refused even with ``overwrite``; so is any path in the cache ``root``, whose
    files are entries, and a path whose directory is missing or not writable.
    """
    out = Path(os.path.abspath(out))
    folder = out.parent
    if root is not None:
        real_root = os.path.realpath(root)
        if os.path.commonpath([real_root, os.path.realpath(folder)]) == real_root:
            raise BundleError(
                f"cannot write bundle {out}: it is inside the cache {root}; "
                "choose a path outside it"
            )
    try:
        st = os.lstat(out)
    except FileNotFoundError:
        st = None
    except NotADirectoryError:
        st = None  # the folder check below names the problem
    except OSError as err:
        raise BundleError(f"cannot write bundle {out} ({_fs.describe(err)})") from None
    if st is not None and not stat.S_ISREG(st.st_mode):
        if stat.S_ISLNK(st.st_mode):
            kind = "a symlink to a directory" if os.path.isdir(out) else "a symlink"
            hint = "give the path of a file, not a link"
        elif stat.S_ISDIR(st.st_mode):
            kind, hint = "a directory", f"give a file, e.g. {out}/bundle.tar"
        else:
            kind, hint = "a device, fifo or socket", "give the path of a file"
        raise BundleError(f"cannot write bundle {out}: it is {kind}, not a file; {hint}")
    if not os.path.isdir(folder):
        why = "is not a directory" if os.path.lexists(folder) else "does not exist"
        raise BundleError(f"cannot write bundle {out}: directory {folder} {why}")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise BundleError(
            f"cannot write bundle {out}: directory {folder} is not writable (Permission denied)"
        )
    if st is not None and not overwrite:
        raise BundleError(f"{out} already exists; left it alone ({_REPLACE})")
    return out


def _check_members(src: str, members: list[tarfile.TarInfo]) -> dict[str, list[tarfile.TarInfo]]:
    """Group members by key, refusing anything unsafe (nothing written yet)."""
    by_key: dict[str, list[tarfile.TarInfo]] = {}
    seen: dict[str, tarfile.TarInfo] = {}
    for m in members:
        name = m.name
        if m.issym() or m.islnk():
            raise BundleError(f"{src}: member {name!r} is a link; refusing the bundle")
        if not (m.isreg() or m.isdir()):
            raise BundleError(f"{src}: member {name!r} is a device or special file; refusing")
        parts = name.rstrip("/").split("/") if m.isdir() else name.split("/")
        if name.startswith("/") or any(p in ("", ".", "..") for p in parts) or "\\" in name:
            raise BundleError(f"{src}: member {name!r} has an unsafe path; refusing the bundle")
        if not is_full_key(parts[0]) or (m.isreg() and len(parts) < 2):
            raise BundleError(f"{src}: member {name!r} is not inside a <key>/ folder; refusing")
        # Two members of one name: a reader sees one, the import would use the other.
        if "/".join(parts) in seen:
            raise BundleError(f"{src}: member {name!r} appears twice; refusing the bundle")
        seen["/".join(parts)] = m
        if m.isreg():
            by_key.setdefault(parts[0], []).append(m)
    for name in seen:
        parts = name.split("/")
        for i in range(2, len(parts)):
            if (parent := seen.get("/".join(parts[:i]))) is not None and parent.isreg():
                raise BundleError(
                    f"{src}: {parent.name!r} is named twice, as a file and as a folder; refusing"
                )
    if not by_key:
        raise BundleError(f"{src}: the bundle holds no entries")
    for key, ms in by_key.items():
        if not any(m.name == f"{key}/{MANIFEST}" for m in ms):
            raise BundleError(f"{src}: entry {key[:12]} has no {MANIFEST}; refusing the bundle")
    return by_key


def _read_manifest(src: str, tf: tarfile.TarFile, key: str, ms: list[tarfile.TarInfo]) -> dict:
    """The entry's manifest, checked against its key and its members' tar headers.

    Every size is known from the headers, so a member larger (or smaller) than its
    manifest says, or one the manifest does not list, refuses the bundle before a
    byte of it is read.
    """
    member = next(m for m in ms if m.name == f"{key}/{MANIFEST}")
    limit = schema.STORED_MAX_BYTES  # what export writes: a local manifest.json
    if member.size > limit:
        raise BundleError(
            f"{src}: the manifest of entry {key[:12]} is {member.size} bytes, "
            f"more than the {limit} a manifest may have; refusing the bundle"
        )
    try:
        manifest = schema.parse(tf.extractfile(member).read(limit + 1), limit)  # type: ignore[union-attr]
    except ValueError as e:  # malformed JSON, not UTF-8, or nested too deeply
        raise BundleError(
            f"{src}: the manifest of entry {key[:12]} is not valid JSON ({e}); refusing the bundle"
        ) from None
    if not isinstance(manifest, dict):
        raise BundleError(
            f"{src}: the manifest of entry {key[:12]} is not a JSON object; refusing the bundle"
        )
    try:
        ok = manifest.get("key") == key and compute_key(manifest["factors"]) == key
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError):
        ok = False
    if not ok:
        raise BundleError(
            f"{src}: entry {key[:12]} has a manifest that does not match its key; refusing it"
        )
    if problem := check_manifest(manifest, key):
        raise BundleError(f"{src}: entry {key[:12]}: {problem}; refusing the bundle")
    files = manifest["files"]
    present = {m.name[len(key) + 1 :]: m for m in ms if m is not member}
    for rel, m in present.items():
        if rel not in files:
            raise BundleError(
                f"{src}: member {m.name!r} is not in its entry's manifest; refusing the bundle"
            )
        if m.size != files[rel]["size"]:
            raise BundleError(
                f"{src}: member {m.name!r} is {m.size} bytes but its manifest says "
                f"{files[rel]['size']} bytes; refusing the bundle"
            )
    if missing := sorted(set(files) - set(present)):
        raise BundleError(f"{src}: entry {key[:12]} lacks {missing[0]!r}; refusing the bundle")
    # Where the entry came from is this store's finding, never the bundle's claim.
    return {**manifest, "provenance": provenance.imported(src, key, manifest)}


def _copy(src: IO[bytes], dst: IO[bytes], size: int) -> str:
    """Copy exactly ``size`` bytes, hashing them; the blake3 digest. Never reads more."""
    import blake3

    h = blake3.blake3(max_threads=blake3.blake3.AUTO)
    left = size
    while left:
        chunk = src.read(min(_CHUNK, left))
        if not chunk:
            raise EOFError(f"a member ends {left} bytes early")
        h.update(chunk)
        dst.write(chunk)
        left -= len(chunk)
    return f"blake3:{h.hexdigest()}"


def _extract(
    tf: tarfile.TarFile, members: list[tarfile.TarInfo], key: str, into: Path, files: dict
) -> None:
    """Write the members' bytes under ``into`` (a new dir), each checked against ``files``.

    Only new files and dirs are created there; a size or digest that differs from
    the manifest is an IntegrityError.
    """
    into.mkdir(mode=0o700)
    for m in members:
        rel = m.name[len(key) + 1 :]
        if rel == MANIFEST:
            continue  # publish_dir writes the manifest from the parsed dict
        target = into / rel
        target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        with tf.extractfile(m) as src, open(os.open(target, flags, 0o644), "wb") as out:  # type: ignore[union-attr]
            digest = _copy(src, out, files[rel]["size"])
        if digest != files[rel]["digest"]:
            raise IntegrityError(f"entry {key[:12]} does not match its manifest ({rel})")


_DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


def _write_error(store: LocalStore, src: str, e: OSError, needed: int) -> FilesystemError | None:
    """The error for an OSError that writing into the cache raised; None if it was reading."""
    if e.errno in _DISK_FULL:
        try:
            free = f", {shutil.disk_usage(store.base).free} bytes free"
        except OSError:
            free = ""
        return FilesystemError(
            f"no space left on device in {store.base} ({e.strerror}): importing {src} "
            f"needs {needed} bytes{free}; nothing was imported"
        )
    # A file too large for this process or filesystem, or any error naming a path in
    # the cache (EACCES, EROFS, ...), is the cache's; the rest come from reading the tar.
    named = isinstance(e.filename, str) and Path(os.path.abspath(e.filename)).is_relative_to(
        store.base
    )
    if e.errno == errno.EFBIG or named:
        return FilesystemError(f"importing {src} failed ({_fs.describe(e)}); nothing was imported")
    return None


def import_bundle(
    store: LocalStore, file: str | os.PathLike[str], progress: Progress | None = None
) -> ImportResult:
    """Verify every entry in the bundle, then publish them all; which were imported
    and which were already present (an intact entry there wins, see
    :meth:`LocalStore.publish_dir`).

    All or nothing: every member is checked against the tar headers, then copied
    into staging with its size and digest checked, before the first entry is
    published. Only an OS failure while publishing (a full disk) can stop it
    midway, and its error names the entries that were imported.
    """
    src = str(file)
    try:
        # "r:", not "r:*": export writes a plain tar, and a compressed one would
        # decompress without the bounds every read here keeps (a gzip bomb).
        tf = tarfile.open(src, "r:")
    except FileNotFoundError:
        raise BundleError(f"bundle {src} does not exist") from None
    except (tarfile.TarError, OSError, EOFError) as e:
        raise BundleError(f"{src} is not a readable tar bundle ({e}); re-export it") from None
    needed = 0
    with tf:
        try:
            by_key = _check_members(src, tf.getmembers())
            manifests = {key: _read_manifest(src, tf, key, ms) for key, ms in by_key.items()}
            needed = sum(m.size for ms in by_key.values() for m in ms)
            done = 0
            with store.new_staging_dir() as staging:
                for key, ms in by_key.items():
                    try:
                        _extract(tf, ms, key, staging / key, manifests[key]["files"])
                    except IntegrityError as e:
                        raise BundleError(f"{src}: {e}; nothing was imported") from None
                    done += sum(m.size for m in ms)
                    if progress:
                        progress(done, needed)
                return _publish_all(store, src, staging, manifests)
        except AcacheError:
            raise
        except (tarfile.TarError, OSError, EOFError) as e:
            if isinstance(e, OSError) and (err := _write_error(store, src, e, needed)):
                raise err from None
            raise BundleError(f"{src} is damaged ({e}); re-export it") from None


def _publish_all(
    store: LocalStore, src: str, staging: Path, manifests: dict[str, dict]
) -> ImportResult:
    result = ImportResult()
    for key, manifest in manifests.items():
        try:
            _, new = store.publish_or_keep(
                staging / key, manifest, provenance=manifest["provenance"]
            )
        except AcacheError as e:
            err = BundleError(f"{src}: {e}") if isinstance(e, IntegrityError) else e
            if result.imported:
                names = ", ".join(k[:12] for k in result.imported)
                raise type(err)(
                    f"{err}; imported before the failure: {names} "
                    f"({len(result.imported)} of {len(manifests)} entries)"
                ) from None
            raise err from None
        (result.imported if new else result.present).append(key)
    return result
