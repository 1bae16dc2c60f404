"""Pick a C++ compiler whose libstdc++ is the one this process has loaded.

Why: an AOTInductor wrapper .so instantiates libstdc++ templates (std::regex in
``parse_device_str``, run by the model constructor) from the compiler's headers,
and calls into whichever libstdc++ the process already mapped. On the GPU image
(torch 2.11+cu130) Inductor's default ``g++`` was /opt/gcc/bin/g++, newer than
the system libstdc++ that Python and torch load, and every load segfaulted in
``std::regex`` compilation (cuda-gdb backtrace in docs/backends.md). Loading the
same .so with the system libstdc++ preloaded worked, and so does building with a
compiler that matches the loaded runtime, which is what this module chooses.

A user's ``CXX`` always wins: it is their toolchain.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from pathlib import Path


def loaded_libstdcxx() -> str | None:
    """Real path of the libstdc++ mapped into this process, if any (Linux)."""
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                if "libstdc++.so" in line:
                    return os.path.realpath(line.split()[-1])
    except OSError:
        pass
    return None


def runtime_id() -> str | None:
    """The loaded libstdc++ by file name (e.g. libstdc++.so.6.0.33): a key factor."""
    loaded = loaded_libstdcxx()
    return os.path.basename(loaded) if loaded else None


@functools.lru_cache(maxsize=16)
def compiler_libstdcxx(cxx: str) -> str | None:
    """Real path of the libstdc++ a compiler links against, or None if unknown."""
    try:
        out = subprocess.run(
            [cxx, "-print-file-name=libstdc++.so.6"], capture_output=True, text=True, timeout=20
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    # A bare name back means the compiler did not find the file.
    return os.path.realpath(out) if out and os.path.sep in out else None


@functools.lru_cache(maxsize=16)
def compiler_version(cxx: str) -> str | None:
    try:
        out = subprocess.run(
            [cxx, "-dumpfullversion", "-dumpversion"], capture_output=True, text=True, timeout=20
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return out or None


def _candidates(default: str) -> list[str]:
    names = [default, "g++", "/usr/bin/g++", "/usr/bin/c++"]
    seen: list[str] = []
    for n in names:
        path = shutil.which(n)
        if path and os.path.realpath(path) not in {os.path.realpath(s) for s in seen}:
            seen.append(path)
    return seen


def choose_cxx(default: str = "g++") -> str | None:
    """The compiler Inductor should use for code this process will dlopen.

    Returns the user's ``CXX`` if set; else the first candidate whose libstdc++
    is the loaded one; else None (leave Inductor's own choice alone: nothing
    better is known, e.g. on a machine with a single compiler).
    """
    if os.environ.get("CXX"):
        return os.environ["CXX"]
    loaded = loaded_libstdcxx()
    if loaded is None:
        return None
    for cxx in _candidates(default):
        if compiler_libstdcxx(cxx) == loaded:
            return cxx
    return None


def missing_compiler() -> str | None:
    """A reason when no C++ compiler is on PATH (Inductor's CPU code and every
    AOTInductor wrapper are C++), else None."""
    cxx = os.environ.get("CXX") or "g++"
    if shutil.which(cxx):
        return None
    return f"no C++ compiler found ({cxx!r} is not on PATH): install g++ (e.g. apt install g++)"


def describe(cxx: str | None) -> dict[str, str | None]:
    """Key factor / manifest record: which compiler built the code."""
    path = shutil.which(cxx or "g++")
    return {
        "cxx": str(Path(path).resolve()) if path else cxx,
        "cxx_version": compiler_version(path) if path else None,
    }


def build_record(cxx: str | None) -> dict[str, str | None]:
    """describe() plus the libstdc++ the compiler links against, for the manifest."""
    path = shutil.which(cxx or "g++")
    return {**describe(cxx), "libstdcxx": compiler_libstdcxx(path) if path else None}


def check_runtime(meta: dict) -> None:
    """Refuse to dlopen a wrapper built against another libstdc++ than the loaded one.

    Loading it would segfault the whole process (not raise), so a one-line error
    is the kind outcome. A user who preloads the matching runtime (LD_PRELOAD),
    the workaround verified on the GPU image, is trusted.
    """
    from ..errors import BackendError

    built = meta.get("libstdcxx")
    loaded = loaded_libstdcxx()
    if not built or not loaded or built == loaded:
        return
    if "libstdc++" in os.environ.get("LD_PRELOAD", ""):
        return
    raise BackendError(
        f"this entry was compiled by {meta.get('cxx')} against {built}, but this process "
        f"loaded {loaded}; loading it would crash: rebuild with `acache build ... --force` "
        f"(acache picks a matching compiler) or start with LD_PRELOAD={loaded}"
    )
