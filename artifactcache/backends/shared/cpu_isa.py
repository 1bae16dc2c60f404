"""Inductor's CPU vector-ISA verdicts, kept in the cache root across processes.

Before a process can find a compiled CPU kernel, Inductor picks the vector ISA the
kernel was compiled for. To pick it, ``VecISA.check_build`` (torch/_inductor/
cpu_vec_isa.py) builds a probe library per candidate ISA, or finds it built, and
dlopens it in a child Python, once per candidate and process: 0.8 s of every warm
tiny-llama inductor load on the 2-core CPU VM (docs/perf-notes.md, attempt 42).

The verdict depends on what Inductor's own fingerprint of the probe names (the
compiler's version, the ISA's flags, torch's version), on the probe's code and on the
CPU; a passing verdict is kept under exactly those in ``<cache root>/cpu-isa.json``
(a failure may be a moment's, a probe's timeout, so it is probed again). A load reads
the verdict there and runs the probe only for a candidate the memo lacks. An aoti
build's steps read it too: every C++ wrapper compile picks the ISA, ten child Pythons of
~2 s each, one after another, on the H100 host (docs/perf-notes.md, attempt 52). An
inductor build probes as Inductor does (its entry carries the probe libraries). A torch
without these internals runs its probes unchanged (slower, never wrong).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import platform
import shutil
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ...store._fs import add_to_memo, read_memo
from .cxx import file_id, loaded_libstdcxx
from .patches import ProcessPatches

MEMO = "cpu-isa.json"
PATCHES = ProcessPatches()  # check_build replaced for as long as any scope is open
_TAG = "_acache_isa_memo"  # on the replacement: never wrapped again


@functools.cache
def cpu_identity() -> str:
    """The machine, the CPU's model and its flags (what the OS lets code use)."""
    model = flags = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            name, _, value = line.partition(":")
            name = name.strip()
            if name == "model name" and not model:
                model = value.strip()
            elif name in ("flags", "Features") and not flags:
                flags = " ".join(sorted(value.split()))
    return f"{platform.machine()}|{model}|{hashlib.sha256(flags.encode()).hexdigest()[:16]}"


@functools.cache
def _process_identity(compiler: str) -> str:
    """What the probe's dlopen in a child Python depends on beyond the compile: that
    Python, torch's libraries, the libstdc++ mapped here, the loader's path, and the
    compiler file itself (cxx.py's memo guards the same). Per compiler: one process may
    probe with two (an aoti build's prefill under its chosen one, a load under the
    default)."""
    import torch

    return "|".join(
        str(x)
        for x in (
            file_id(sys.executable),
            os.path.dirname(torch.__file__),
            file_id(loaded_libstdcxx() or ""),
            file_id(shutil.which(compiler) or compiler),
            os.environ.get("LD_LIBRARY_PATH", ""),
        )
    )


def verdict_key(isa: Any, code: str) -> str | None:
    """What ``isa.check_build(code)`` depends on; None where torch cannot say."""
    try:
        from torch._inductor.cpp_builder import get_cpp_compiler
        from torch._inductor.cpu_vec_isa import _get_isa_dry_compile_fingerprint

        fingerprint = _get_isa_dry_compile_fingerprint(isa.build_arch_flags())
        process = _process_identity(get_cpp_compiler())
    except Exception:  # noqa: BLE001 - no key: the probe runs, as without the memo
        return None
    probe = hashlib.sha256(code.encode()).hexdigest()[:16]
    return "\n".join([str(isa), fingerprint, f"probe {probe}", process, cpu_identity()])


@contextlib.contextmanager
def isa_verdicts_kept(memo_dir: Path | None) -> Iterator[None]:
    """While open, ``VecISA.check_build`` answers from the memo in ``memo_dir`` and
    records what it had to probe. Nested and concurrent scopes share the replacement the
    first one installed (patches.py)."""
    try:
        from torch._inductor.cpu_vec_isa import VecISA
    except ImportError:
        yield
        return
    if memo_dir is None:
        yield
        return

    def install() -> None:
        real = VecISA.__dict__.get("check_build")
        # Another torch, or a replacement nobody removed: run the probes as they are.
        if callable(real) and not getattr(real, _TAG, False):
            PATCHES.replace(VecISA, "check_build", _remembering(real, memo_dir))

    with PATCHES.scope(install):
        yield


def _remembering(real: Any, memo_dir: Path) -> Any:
    memo_path = memo_dir / MEMO

    @functools.wraps(real)
    def check_build(self: Any, code: Any = None, *args: Any, **kwargs: Any) -> Any:
        if args or kwargs or not isinstance(code, str):  # a call this memo does not know
            return real(self, code, *args, **kwargs)
        key = verdict_key(self, code)
        if key is None:
            return real(self, code)
        if read_memo(memo_path).get(key) is True:
            return True
        verdict = real(self, code)
        if verdict is True:  # a pass is lasting; a failure may be a moment's (a timeout)
            add_to_memo(memo_path, key, True, indent=1, sort_keys=True)
        return verdict

    setattr(check_build, _TAG, True)
    return check_build


def prefill_isa_verdicts(cxx: str | None, memo_dir: Path) -> threading.Thread:
    """A started thread that picks Inductor's vector ISA under the memo, with the
    compiler ``cxx`` as a step's wrapper compile will (the key names the compiler).

    Started by a concurrent aoti build beside its workers: they reach their wrapper
    compile only after their export and their Triton kernels, by when the verdicts are
    in the memo, so no worker runs a probe. A failure here costs only that saving: the
    workers then probe as before.
    """

    def run() -> None:
        with contextlib.suppress(Exception):
            import torch._inductor.config as inductor_config
            from torch._inductor.cpu_vec_isa import pick_vec_isa

            patch = inductor_config.patch({"cpp.cxx": cxx}) if cxx else contextlib.nullcontext()
            with patch, isa_verdicts_kept(memo_dir):
                pick_vec_isa()

    thread = threading.Thread(target=run, daemon=True, name="acache-isa-prefill")
    thread.start()
    return thread
