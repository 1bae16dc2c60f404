"""Export entries to a tar bundle and import them back, safely.

A bundle is a plain tar whose members are ``<key>/manifest.json`` and
``<key>/<relpath>`` for each entry's files. Import trusts nothing in it:

* every member must be a regular file (or a directory) under ``<64-hex key>/``;
  absolute paths, ``..``, symlinks, hardlinks, devices and fifos reject the
  whole bundle before anything is written;
* members are written only into a staging dir inside the cache (O_NOFOLLOW,
  O_EXCL), never extracted by ``tarfile`` itself;
* each entry is published through :meth:`LocalStore.publish_dir`, which checks
  every size and blake3 digest against its manifest, and the key must be the
  hash of the manifest's factors, so a bundle cannot plant an artifact under
  another artifact's key.
"""

from __future__ import annotations

import json
import os
import tarfile
from collections.abc import Callable, Iterable
from pathlib import Path

from ..errors import AcacheError, BundleError, IntegrityError
from ..keys import compute_key, is_full_key
from . import _fs
from .local import MANIFEST, LocalStore

Progress = Callable[[int, int], None]
_CHUNK = 4 << 20


def export(
    store: LocalStore,
    keys: Iterable[str],
    out_file: str | os.PathLike[str],
    progress: Progress | None = None,
) -> list[str]:
    """Write the (verified) entries to a tar at ``out_file``; returns their full keys."""
    entries = [store.open(k) for k in keys]  # resolves prefixes; refuses corrupt entries
    out = Path(out_file)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    total = sum(e.size for e in entries)
    done = 0
    try:
        with tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as tf:
            for e in entries:
                for rel in [MANIFEST, *sorted(e.files)]:
                    fd = os.open(e.path / rel, _fs.O_READ)
                    with open(fd, "rb") as f:
                        info = tarfile.TarInfo(f"{e.key}/{rel}")
                        info.size = os.fstat(f.fileno()).st_size
                        info.mtime = int(e.created)
                        info.mode = 0o644
                        tf.addfile(info, f)
                    done += info.size if rel != MANIFEST else 0
                    if progress:
                        progress(done, total)
        os.replace(tmp, out)
    except OSError as err:
        tmp.unlink(missing_ok=True)
        raise BundleError(f"cannot write bundle {out} ({err.strerror or err})") from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return [e.key for e in entries]


def _check_members(src: str, members: list[tarfile.TarInfo]) -> dict[str, list[tarfile.TarInfo]]:
    """Group members by key, refusing anything unsafe (nothing written yet)."""
    by_key: dict[str, list[tarfile.TarInfo]] = {}
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
        if m.isreg():
            by_key.setdefault(parts[0], []).append(m)
    if not by_key:
        raise BundleError(f"{src}: the bundle holds no entries")
    for key, ms in by_key.items():
        if not any(m.name == f"{key}/{MANIFEST}" for m in ms):
            raise BundleError(f"{src}: entry {key[:12]} has no {MANIFEST}; refusing the bundle")
    return by_key


def _read_manifest(src: str, tf: tarfile.TarFile, key: str, ms: list[tarfile.TarInfo]) -> dict:
    member = next(m for m in ms if m.name == f"{key}/{MANIFEST}")
    try:
        manifest = json.loads(tf.extractfile(member).read())  # type: ignore[union-attr]
        ok = manifest.get("key") == key and compute_key(manifest["factors"]) == key
    except (ValueError, KeyError, TypeError, AttributeError):
        ok = False
    if not ok:
        raise BundleError(
            f"{src}: entry {key[:12]} has a manifest that does not match its key; refusing it"
        )
    return manifest


def _extract(tf: tarfile.TarFile, members: list[tarfile.TarInfo], key: str, into: Path) -> None:
    """Write the members' bytes under ``into``, creating only new files and dirs there."""
    for m in members:
        rel = m.name[len(key) + 1 :]
        if rel == MANIFEST:
            continue  # publish_dir writes the manifest from the parsed dict
        target = into / rel
        target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        src = tf.extractfile(m)
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        with open(fd, "wb") as out, src:  # type: ignore[union-attr]
            while chunk := src.read(_CHUNK):  # type: ignore[union-attr]
                out.write(chunk)


def import_bundle(
    store: LocalStore, file: str | os.PathLike[str], progress: Progress | None = None
) -> list[str]:
    """Verify and publish every entry in the bundle; returns their keys."""
    src = str(file)
    try:
        tf = tarfile.open(src, "r:*")
    except FileNotFoundError:
        raise BundleError(f"bundle {src} does not exist") from None
    except (tarfile.TarError, OSError, EOFError) as e:
        raise BundleError(f"{src} is not a readable tar bundle ({e}); re-export it") from None
    imported: list[str] = []
    with tf:
        try:
            by_key = _check_members(src, tf.getmembers())
            total = sum(m.size for ms in by_key.values() for m in ms)
            done = 0
            for key, ms in by_key.items():
                manifest = _read_manifest(src, tf, key, ms)
                with store.new_staging_dir() as staging:
                    try:
                        _extract(tf, ms, key, staging)
                        store.publish_dir(staging, manifest)
                    except FileExistsError:
                        raise BundleError(f"{src}: entry {key[:12]} repeats a member") from None
                    except IntegrityError as e:
                        raise BundleError(f"{src}: {e}") from None
                imported.append(key)
                done += sum(m.size for m in ms)
                if progress:
                    progress(done, total)
        except AcacheError:
            raise
        except (tarfile.TarError, OSError, EOFError) as e:
            raise BundleError(f"{src} is damaged ({e}); re-export it") from None
    return imported
