"""The compiled files an inductor entry carries beside what torch saves itself.

A fresh process with empty framework caches would otherwise redo work the build did.
What a build's fresh Inductor cache dir leaves, and the entry keeps (``kernels/``)::

    kernels/
    ├── <xx>/<hash>.so, <hash>.o   Inductor's C++ kernels (CPU). Compiled graphs hold
    │                              only their source; without these every one is
    │                              compiled again with the system compiler.
    ├── <xx>/<key>.best_config     autotuning winners (CUDA: coordinate descent, Triton
    │                              configs). Without them a warm process benchmarks each
    │                              kernel's candidate configs again before its first call.
    └── triton/<hash>/…            Triton's compiled kernels (cubin, ptx, json…). Without
                                   them each kernel is compiled again. Triton's group
                                   files (``__grp__*.json``) name their kernel directory
                                   by absolute path, so the entry stores a placeholder
                                   and the install writes the directory it lands in.

Paths under ``<xx>/`` are content hashes that Inductor computes the same way in any
process, so a file installed at the same relative path is found where the warm process
looks. Files are copied, never linked: the entry stays immutable and verifiable.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from pathlib import Path

from ..shared.torch_private import TorchPrivateAPIMissing, inductor_cache_dir, triton_cache_dir

TRITON = "triton"
# Files of Inductor's own cache dir worth carrying (the .o files are needed too:
# Inductor checks each link input exists before reusing a .so).
CARRIED_SUFFIXES = (".so", ".o", ".best_config")
# Stands for the Triton cache dir inside carried .json files; no real path contains it.
TRITON_DIR_PLACEHOLDER = b"{acache:triton_cache_dir}"


def save_compiled_files(dest: Path, device_index: int = 0) -> list[str]:
    """Copy this (fresh) Inductor cache dir's carried files into ``dest``; their
    paths relative to ``dest``."""
    src = inductor_cache_dir()
    try:
        triton_src = triton_cache_dir(device_index)
    except TorchPrivateAPIMissing:  # where fresh_cache puts it
        triton_src = src / TRITON
    saved = []
    for f in sorted(src.rglob("*")):
        if not f.is_file() or f.is_symlink() or _inside(f, triton_src):
            continue
        rel = f.relative_to(src)
        if rel.parts[0] != TRITON and f.suffix in CARRIED_SUFFIXES:
            dst = dest / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(f, dst)
            saved.append(str(rel))
    if triton_src.is_dir():
        saved += _save_triton(triton_src, dest / TRITON)
    return saved


def install_compiled_files(src: Path, device_index: int = 0) -> int:
    """Copy an entry's carried files into this process's Inductor and Triton cache
    dirs; returns how many files were written. Files already there are kept (they
    are content-addressed by name)."""
    if not src.is_dir():
        return 0
    n = 0
    if (src / TRITON).is_dir():
        n += _install_triton(src / TRITON, triton_cache_dir(device_index))
    dst_root = inductor_cache_dir()
    for f in src.rglob("*"):
        if not f.is_file() or f.is_symlink():
            continue
        rel = f.relative_to(src)
        if rel.parts[0] == TRITON:
            continue
        dst = dst_root / rel
        if dst.exists():
            continue
        dst.parent.mkdir(parents=True, exist_ok=True)
        tmp = dst.with_name(f".{dst.name}.{os.getpid()}.tmp")
        try:
            shutil.copyfile(f, tmp)
            os.replace(tmp, dst)  # atomic: a concurrent process never sees half a .so
        finally:
            tmp.unlink(missing_ok=True)
        n += 1
    return n


def _json_path(path: Path) -> bytes:
    """A path as it appears inside a JSON string (escaped as json.dumps writes it)."""
    return json.dumps(str(path))[1:-1].encode()


def _inside(path: Path, root: Path) -> bool:
    try:
        path.relative_to(root)
    except ValueError:
        return False
    return True


def _save_triton(triton_src: Path, dest: Path) -> list[str]:
    """Each kernel directory's files, with the cache dir's path in .json files
    replaced by the placeholder."""
    saved = []
    base = _json_path(triton_src)
    for kernel_dir in sorted(p for p in triton_src.iterdir() if p.is_dir()):
        if kernel_dir.name.startswith("tmp."):
            continue  # a kernel dir still being written (TritonBundler's and ours rename it)
        # Files only: Triton writes each file in a tmp.pid_* dir inside and renames it.
        for f in sorted(kernel_dir.iterdir()):
            if not f.is_file() or f.is_symlink() or f.name == "lock" or f.name.endswith(".lock"):
                continue
            data = f.read_bytes()
            if f.suffix == ".json":  # as TritonBundler does: any .json may name the dir
                data = data.replace(base, TRITON_DIR_PLACEHOLDER)
            out = dest / kernel_dir.name / f.name
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_bytes(data)
            saved.append(str(Path(TRITON) / kernel_dir.name / f.name))
    return saved


def _install_triton(src: Path, dst_base: Path) -> int:
    """Each carried kernel directory into ``dst_base``, whole or not at all: written
    to a temp dir and renamed into place, as Triton itself does, so a concurrent
    process never reads half a kernel."""
    if not src.is_dir():
        return 0
    n = 0
    base = _json_path(dst_base)
    for kernel_dir in sorted(p for p in src.iterdir() if p.is_dir()):
        target = dst_base / kernel_dir.name
        if target.is_dir() and any(target.iterdir()):
            continue
        dst_base.mkdir(parents=True, exist_ok=True)
        tmp = dst_base / f"tmp.acache.{uuid.uuid4().hex}"
        tmp.mkdir()
        try:
            written = 0
            for f in kernel_dir.iterdir():
                if not f.is_file() or f.is_symlink():
                    continue
                data = f.read_bytes()
                if f.suffix == ".json":
                    data = data.replace(TRITON_DIR_PLACEHOLDER, base)
                (tmp / f.name).write_bytes(data)
                written += 1
            os.replace(tmp, target)  # over an empty dir Triton made, too
            n += written
        except OSError:
            if target.is_dir() and any(target.iterdir()):
                continue  # another process put it there first
            raise  # a full disk, say: the caller's one-line error
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return n
