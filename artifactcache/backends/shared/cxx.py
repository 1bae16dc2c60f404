"""Pick a C++ compiler whose libstdc++ is the one this process has loaded.

Why: an AOTInductor wrapper .so instantiates libstdc++ templates (std::regex in
``parse_device_str``, run by the model constructor) from the compiler's headers,
and calls into whichever libstdc++ the process already mapped. A compiler whose
headers are newer than that runtime builds wrappers whose load segfaults in
``std::regex`` compilation (the cuda-gdb backtrace is in docs/perf-notes.md,
attempt 1b). Building with a compiler whose code runs against the loaded runtime
avoids it, and that is what this module chooses.

$CXX is tried first, but only used when code it compiles runs in this process
(works_with_runtime): an environment may set CXX to a compiler whose code crashes.

A probe costs seconds (a child that imports torch), so its verdict is kept on disk
(``PROBE_MEMO`` in the cache's v1 dir) by compiler and runtime file identity
and torch version: a repeat aoti build or `acache doctor` runs no probe.
"""

from __future__ import annotations

import functools
import hashlib
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from ...store._fs import add_to_memo, read_memo


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


# What a probe found: the compiler's code runs here / crashes or is wrong here /
# could not be checked (the child could not import torch or load the .so, e.g. a
# noexec temp dir): the last is no evidence against the compiler.
OK, REJECTED, UNCHECKED = "ok", "rejected", "unchecked"


def _candidates(default: str) -> tuple[list[str], list[str]]:
    """(compiler paths to try, in order; why-not lines for a $CXX that cannot be tried)."""
    skipped: list[str] = []
    names = [default, "g++", "/usr/bin/g++", "/usr/bin/c++"]
    env = os.environ.get("CXX", "").strip()
    if env:
        words = shlex.split(env)
        if len(words) != 1:
            # Inductor runs its compiler as one program ([cxx, "--version"]).
            skipped.append(f"CXX={env!r} has arguments, which Inductor cannot run")
        elif shutil.which(words[0]) is None:
            skipped.append(f"CXX={env!r} is not on PATH")
        else:
            names.insert(0, words[0])
    seen: list[str] = []
    for n in names:
        path = shutil.which(n)
        if path and os.path.realpath(path) not in {os.path.realpath(s) for s in seen}:
            seen.append(path)
    return seen, skipped


PROBE_MEMO = "cxx-probes.json"


def file_id(path: str) -> str | None:
    """path|realpath|mtime_ns|size: any upgrade in place changes it."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return f"{path}|{os.path.realpath(path)}|{st.st_mtime_ns}|{st.st_size}"


def _memo_key(cxx: str, runtime: str) -> str | None:
    """What a verdict depends on: compiler, runtime, torch, and the probe itself (lines
    1-2 the files, lines 3-4 ``_memo_tail``)."""
    compiler, lib = file_id(shutil.which(cxx) or cxx), file_id(runtime)
    if compiler is None or lib is None:
        return None
    return "\n".join([compiler, lib, *_memo_tail()])


def _memo_tail() -> list[str]:
    """The memo key's last two lines: the torch version and the probe's own hash."""
    from ...keys import package_version

    probe = hashlib.sha256(_REGEX_PROBE.encode()).hexdigest()[:16]
    return [f"torch {package_version('torch')}", f"probe {probe}"]


def _verdict(hit: Any) -> tuple[str, str] | None:
    """A memo value as (verdict, why), or None for one that is damaged or unsettled."""
    if isinstance(hit, list) and len(hit) == 2 and hit[0] in (OK, REJECTED):
        return str(hit[0]), str(hit[1])
    return None


def remembered_verdict(cxx: str, memo_dir: Path | None) -> tuple[str, str] | None:
    """(verdict, why) the probe memo holds for ``cxx`` under this torch and probe, for
    whichever libstdc++ it was probed against; None when there is none. For a reader
    that has not loaded torch and so cannot name the runtime (the quick doctor)."""
    compiler = file_id(shutil.which(cxx) or cxx) if memo_dir is not None else None
    if compiler is None or memo_dir is None:
        return None
    tail = _memo_tail()
    for key, hit in _read_memo(memo_dir).items():
        lines = str(key).split("\n")
        if len(lines) == 4 and lines[0] == compiler and lines[2:] == tail:
            if (verdict := _verdict(hit)) is not None:
                return verdict
    return None


def candidates(default: str = "g++") -> tuple[list[str], list[str]]:
    """(the compilers compiler_choice tries, in order; why-not lines for a $CXX it cannot
    try)."""
    return _candidates(default)


def _read_memo(memo_dir: Path) -> dict[str, Any]:
    return read_memo(memo_dir / PROBE_MEMO)  # absent or damaged: only a lost speed-up


def _remember(memo_dir: Path, key: str, verdict: tuple[str, str]) -> None:
    """Add one verdict to the memo, atomically (a reader never sees half a file); a
    read-only cache keeps the verdict right here, only unmemoized."""
    # Probes run side by side (_probe_at_once): add_to_memo loses no update between them.
    add_to_memo(memo_dir / PROBE_MEMO, key, list(verdict), indent=1, sort_keys=True)


def _kept_verdict(cxx: str, runtime: str, memo_dir: Path | None) -> tuple[str, str] | None:
    """The memo's (verdict, why) for this compiler, runtime and torch; None if none."""
    key = _memo_key(cxx, runtime) if memo_dir is not None else None
    if memo_dir is None or key is None:
        return None
    return _verdict(_read_memo(memo_dir).get(key))


@functools.lru_cache(maxsize=16)
def probe_compiler(cxx: str, runtime: str, memo_dir: Path | None = None) -> tuple[str, str]:
    """Does code ``cxx`` compiles run in a process like this one (``runtime`` mapped)?

    Once per process, and once per compiler, runtime and torch when ``memo_dir``
    (a directory that exists) holds the on-disk memo. Only verdicts reached by a
    probe that ran to its end are kept: a child that could not run proves nothing.
    """
    if (kept := _kept_verdict(cxx, runtime, memo_dir)) is not None:
        return kept
    key = _memo_key(cxx, runtime) if memo_dir is not None else None
    verdict, why, settled = _run_probe(cxx, runtime)
    if settled and memo_dir is not None and key is not None:
        _remember(memo_dir, key, (verdict, why))
    return verdict, why


def _run_probe(cxx: str, runtime: str) -> tuple[str, str, bool]:
    """(verdict, why, settled): the probe itself.

    Matching library paths are not enough: a compiler can report the system
    libstdc++ yet compile newer headers, and its wrapper .so segfault in std::regex
    (docs/perf-notes.md, attempt 1b). So this compiles the very regex the
    AOTI runtime runs into a small .so and calls it in a child that first imports
    torch, so libstdc++ is mapped the way it is here (locally, by torch's own
    libraries; preloading it instead hides the crash). A crash costs the child,
    not this process. A few seconds per compiler. ``settled``: the verdict says
    something lasting about the compiler (its code ran, crashed or was wrong),
    not about a moment (a timeout, a temp dir that failed, a child that died).
    """
    with tempfile.TemporaryDirectory(prefix="acache-cxx-") as d:
        src, lib = Path(d) / "probe.cpp", Path(d) / "probe.so"
        src.write_text(_REGEX_PROBE)
        try:
            cc = subprocess.run(
                [cxx, "-shared", "-fPIC", "-O1", "-std=c++17", "-o", str(lib), str(src)],
                capture_output=True,
                text=True,
                timeout=60,
            )
        except (OSError, subprocess.SubprocessError) as e:
            return REJECTED, f"{cxx} did not run ({type(e).__name__})", False
        if cc.returncode != 0:
            # Not kept: a full or unwritable temp dir fails the same way.
            return REJECTED, f"{cxx} could not compile a std::regex probe", False
        code = (
            f"import ctypes, sys, torch; sys.exit(ctypes.CDLL({str(lib)!r}).acache_regex_probe())"
        )
        try:
            run = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=60)
        except (OSError, subprocess.SubprocessError) as e:
            why = f"{cxx}: the probe child did not finish ({type(e).__name__})"
            return UNCHECKED, why, False
    name = os.path.basename(runtime)
    if run.returncode == 0:
        return OK, "", True
    if run.returncode < 0:
        why = f"code from {cxx} crashes against {name} (signal {-run.returncode})"
        return REJECTED, why, -run.returncode != signal.SIGKILL  # SIGKILL: the OOM killer
    if run.returncode == 2:
        return REJECTED, f"code from {cxx} gives wrong std::regex results against {name}", True
    tail = run.stderr.decode(errors="replace").strip().splitlines()[-1:] or ["no output"]
    return UNCHECKED, f"{cxx}: probe child exited {run.returncode} ({tail[0][:120]})", False


def works_with_runtime(cxx: str, runtime: str, memo_dir: Path | None = None) -> tuple[bool, str]:
    """(True, "") when ``cxx``'s code was seen to run against ``runtime``."""
    verdict, why = probe_compiler(cxx, runtime, memo_dir)
    return verdict == OK, why


def compiler_choice(
    default: str = "g++", memo_dir: Path | None = None
) -> tuple[str | None, tuple[str, ...]]:
    """(compiler, why-not for each candidate passed over).

    Candidates: $CXX, ``default``, g++, /usr/bin/g++, /usr/bin/c++. The first whose
    code is seen to run here wins; failing that, the first that could not be
    checked (no evidence against it); None when nothing can be checked (no
    libstdc++ mapped) and no $CXX is usable, or every candidate is rejected:
    Inductor's own choice stands. A $CXX whose code crashes this process is
    passed over with the reason recorded. ``memo_dir``: see probe_compiler.
    """
    paths, skipped = _candidates(default)
    loaded = loaded_libstdcxx()
    if loaded is None:
        return (paths[0] if os.environ.get("CXX") and paths else None), tuple(skipped)
    rejected = list(skipped)
    unchecked: str | None = None
    pool, started = _probe_at_once(paths, loaded, memo_dir)
    try:
        for cxx in paths:
            # A later candidate's probe is only waited for (and its error only raised)
            # where the loop one after the other would have reached it.
            ahead = started.get(cxx)
            verdict, why = ahead.result() if ahead else probe_compiler(cxx, loaded, memo_dir)
            if verdict == OK:
                return cxx, tuple(rejected)
            if verdict == UNCHECKED and unchecked is None:
                unchecked = cxx
            rejected.append(why)
    finally:
        if pool is not None:  # probes still running finish on their own; none waits
            pool.shutdown(wait=False, cancel_futures=True)
    return unchecked, tuple(rejected)


PROBES_AT_ONCE = 3


def _probe_at_once(
    paths: list[str], runtime: str, memo_dir: Path | None
) -> tuple[Any, dict[str, Any]]:
    """(pool, {candidate: its probe's future}): the probes compiler_choice may need,
    started side by side, up to the first candidate the memo knows works and at most
    PROBES_AT_ONCE. Each probe is a child that imports torch, seconds apiece, and the
    first candidate is often the one that fails (the H200 image's $CXX): one after the
    other they took 16-17 s there. (None, {}) where there are fewer than two to run."""
    todo: list[str] = []
    for c in paths:
        kept = _kept_verdict(c, runtime, memo_dir)
        if kept is not None and kept[0] == OK:
            break
        if kept is None:
            todo.append(c)
    todo = todo[:PROBES_AT_ONCE]
    if len(todo) < 2:
        return None, {}
    from concurrent.futures import ThreadPoolExecutor

    pool = ThreadPoolExecutor(max_workers=len(todo), thread_name_prefix="acache-cxx")
    return pool, {c: pool.submit(probe_compiler, c, runtime, memo_dir) for c in todo}


def choose_cxx(default: str = "g++", memo_dir: Path | None = None) -> str | None:
    """The compiler Inductor should use for code this process will dlopen."""
    return compiler_choice(default, memo_dir)[0]


def rejected_compilers(default: str = "g++", memo_dir: Path | None = None) -> list[str]:
    """Why-not lines for the candidates compiler_choice() passed over (manifest record)."""
    return list(compiler_choice(default, memo_dir)[1])


def missing_compiler() -> str | None:
    """A reason when no C++ compiler is on PATH (Inductor's CPU code and every
    AOTInductor wrapper are C++), else None."""
    cxx = os.environ.get("CXX") or "g++"
    if shutil.which(cxx):
        return None
    return f"no C++ compiler found ({cxx!r} is not on PATH): install g++ (e.g. apt install g++)"


def inductor_default_cxx() -> str:
    """The compiler torch.compile's CPU kernels use when we pass none: Inductor's
    default ``cpp.cxx``, $CXX or else g++ (clang++ on macOS)."""
    return os.environ.get("CXX") or ("clang++" if sys.platform == "darwin" else "g++")


def identity(cxx: str) -> dict[str, str | None]:
    """Key factor: the compiler's resolved path and version string."""
    d = describe(cxx)
    return {"path": d["cxx"], "version": d["cxx_version"]}


def describe(cxx: str | None) -> dict[str, str | None]:
    """Key factor / manifest record: which compiler built the code."""
    path = shutil.which(cxx or "g++")
    return {
        "cxx": str(Path(path).resolve()) if path else cxx,
        "cxx_version": compiler_version(path) if path else None,
    }


def build_record(cxx: str | None, memo_dir: Path | None = None) -> dict[str, Any]:
    """describe() plus the libstdc++ the compiler links against, for the manifest."""
    path = shutil.which(cxx or "g++")
    loaded = loaded_libstdcxx()
    verified = bool(path and loaded and works_with_runtime(path, loaded, memo_dir)[0])
    return {
        **describe(cxx),
        "libstdcxx": compiler_libstdcxx(path) if path else None,
        # The runtime the probe saw this compiler's code run against: load() trusts
        # it even where the compiler reports another library path.
        "libstdcxx_verified": loaded if verified else None,
        "cxx_rejected": rejected_compilers(memo_dir=memo_dir),
    }


def check_runtime(meta: dict) -> None:
    """Refuse to dlopen a wrapper built against another libstdc++ than the loaded one.

    Loading it would segfault the whole process (not raise), so a one-line error
    is the kind outcome. A user who preloads the matching runtime (LD_PRELOAD),
    which makes such a wrapper load, is trusted.
    """
    from ...errors import BackendError

    built = meta.get("libstdcxx")
    loaded = loaded_libstdcxx()
    if not built or not loaded or built == loaded or meta.get("libstdcxx_verified") == loaded:
        return
    if "libstdc++" in os.environ.get("LD_PRELOAD", ""):
        return
    raise BackendError(
        f"this entry was compiled by {meta.get('cxx')} against {built}, but this process "
        f"loaded {loaded}; loading it would crash: rebuild with `acache build ... --force` "
        f"(acache picks a matching compiler) or start with LD_PRELOAD={loaded}"
    )
