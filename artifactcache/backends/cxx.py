"""Pick a C++ compiler whose libstdc++ is the one this process has loaded.

Why: an AOTInductor wrapper .so instantiates libstdc++ templates (std::regex in
``parse_device_str``, run by the model constructor) from the compiler's headers,
and calls into whichever libstdc++ the process already mapped. On the GPU image
(torch 2.11+cu130) Inductor's default ``g++`` was /opt/gcc/bin/g++, newer than
the system libstdc++ that Python and torch load, and every load segfaulted in
``std::regex`` compilation (cuda-gdb backtrace in docs/backends.md). Loading the
same .so with the system libstdc++ preloaded worked, and so does building with a
compiler that matches the loaded runtime, which is what this module chooses.

$CXX is tried first, but only used when code it compiles runs in this process
(works_with_runtime): the GPU image sets CXX to the compiler that crashed.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any


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


# The construct that crashed: torch's parse_device_str() (aoti_runtime/model_base.h).
_REGEX_PROBE = r"""
#include <regex>
#include <string>
extern "C" int acache_regex_probe(void) {
  std::regex re("(cpu|cuda|xpu|mps)(:([0-9]+))?");
  std::smatch sm;
  std::string s("cuda:0");
  return std::regex_match(s, sm, re) && sm[1].str() == "cuda" ? 0 : 2;
}
"""


def _candidates(default: str) -> list[str]:
    names = [os.environ.get("CXX") or "", default, "g++", "/usr/bin/g++", "/usr/bin/c++"]
    seen: list[str] = []
    for n in filter(None, names):
        path = shutil.which(n)
        if path and os.path.realpath(path) not in {os.path.realpath(s) for s in seen}:
            seen.append(path)
    return seen


@functools.lru_cache(maxsize=16)
def works_with_runtime(cxx: str, runtime: str) -> tuple[bool, str]:
    """Does code ``cxx`` compiles run in a process like this one (``runtime`` mapped)?

    Matching library paths are not enough: on the GPU image /opt/gcc/bin/g++ (set
    as $CXX) reports the system libstdc++ yet compiles newer headers, and its
    wrapper .so segfaulted in std::regex. So this compiles the very regex the
    AOTI runtime runs into a small .so and calls it in a child that first imports
    torch, so libstdc++ is mapped the way it is here (locally, by torch's own
    libraries; preloading it instead hides the crash). A crash costs the child,
    not this process. Returns (ok, why-not); a few seconds per compiler, once per
    process. ``runtime`` is the cache key: a process with another runtime re-checks.
    """
    with tempfile.TemporaryDirectory(prefix="acache-cxx-") as d:
        src, lib = Path(d) / "probe.cpp", Path(d) / "probe.so"
        src.write_text(_REGEX_PROBE)
        try:
            cc = subprocess.run(
                [cxx, "-shared", "-fPIC", "-O1", "-std=c++17", "-o", str(lib), str(src)],
                capture_output=True,
                text=True,
                timeout=120,
            )
            if cc.returncode != 0:
                return False, f"{cxx} could not compile the probe"
            code = (
                "import ctypes, sys, torch; "
                f"sys.exit(ctypes.CDLL({str(lib)!r}).acache_regex_probe())"
            )
            run = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=120)
        except (OSError, subprocess.SubprocessError) as e:
            return False, f"{cxx}: probe failed to run ({type(e).__name__})"
    if run.returncode != 0:
        how = f"signal {-run.returncode}" if run.returncode < 0 else f"exit {run.returncode}"
        return False, f"code from {cxx} crashes against {os.path.basename(runtime)} ({how})"
    return True, ""


def choose_cxx(default: str = "g++") -> str | None:
    """The compiler Inductor should use for code this process will dlopen.

    The first of $CXX, ``default``, g++, /usr/bin/g++, /usr/bin/c++ whose code
    passes works_with_runtime() against the libstdc++ this process has mapped.
    $CXX comes first but is skipped when its code would crash this process (the
    GPU image sets CXX=/opt/gcc/bin/g++, which does). None when nothing can be
    checked (no libstdc++ mapped) or nothing passes: Inductor's own choice stands.
    """
    loaded = loaded_libstdcxx()
    if loaded is None:
        return os.environ.get("CXX") or None
    for cxx in _candidates(default):
        if works_with_runtime(cxx, loaded)[0]:
            return cxx
    return None


def rejected_compilers(default: str = "g++") -> list[str]:
    """Why-not lines for candidates tried before the chosen one (manifest record)."""
    loaded = loaded_libstdcxx()
    if loaded is None:
        return []
    out = []
    for cxx in _candidates(default):
        ok, why = works_with_runtime(cxx, loaded)
        if ok:
            break
        out.append(why)
    return out


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


def build_record(cxx: str | None) -> dict[str, Any]:
    """describe() plus the libstdc++ the compiler links against, for the manifest."""
    path = shutil.which(cxx or "g++")
    return {
        **describe(cxx),
        "libstdcxx": compiler_libstdcxx(path) if path else None,
        "cxx_rejected": rejected_compilers(),
    }


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
