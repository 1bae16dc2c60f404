"""What works on this machine, and why not: the report behind `acache doctor`.

The report is a stable schema (``DOCTOR_SCHEMA``; docs/doctor.md): keys are only ever
added, and a change of meaning bumps the schema.

The toolchain part has two depths. The full checks (``full=True``: importing torch and
initializing CUDA, asking each backend, running the C++ compiler probe) took 20-23 s on
the H200 machine, whose torch has no cached bytecode. They depend only on the toolchain,
so their results are kept per toolchain identity in an existing cache
(``v1/doctor.json``): package versions, Python, the host, the driver and its GPUs, the
C++ compilers on $PATH, $CXX, $CC, $PATH, $LD_LIBRARY_PATH, $LD_PRELOAD,
CUDA_VISIBLE_DEVICES and acache's own files. Without ``full``, doctor reports the kept
result when there is one, and otherwise the quick checks (``_quick_probe``): what is
installed, the GPUs as the driver (NVML) lists them, the compilers on $PATH, with no
torch import and no probe. The cache and the remote are always looked at afresh. Doctor
never creates the cache dir and writes nothing but these memos (and the C++ probe's,
backends/shared/cxx.py) into an existing cache.
"""

from __future__ import annotations

import datetime
import hashlib
import importlib
import json
import os
import platform
import shutil
import stat
from pathlib import Path
from typing import Any

from . import settings
from .backends.shared.cxx import file_id
from .extras import EXTRAS, install_hint
from .store._fs import read_memo, write_memo

DOCTOR_SCHEMA = 2
# Rows of the backend table, in order. "trt" is backend trt as a plain build runs it (its
# default, --mode onnx: TensorRT only); "trt-llm" its --mode llm path (TensorRT-LLM too).
BACKEND_ROWS = ("eager", "inductor", "aoti", "ort", "trt", "trt-llm")
INSTALL = {name: install_hint(name) if name in EXTRAS else None for name in BACKEND_ROWS}


def _torch_info() -> tuple[dict[str, Any], list[dict[str, Any]]]:
    try:
        import torch
    except ImportError as e:
        return {"version": None, "cuda": None, "cuda_available": False, "error": str(e)}, []
    gpus = []
    ok = torch.cuda.is_available()
    for i in range(torch.cuda.device_count() if ok else 0):
        p = torch.cuda.get_device_properties(i)
        gpus.append(
            {
                "index": i,
                "name": p.name,
                "compute_capability": f"{p.major}.{p.minor}",
                "memory_bytes": int(p.total_memory),
            }
        )
    info = {"version": torch.__version__, "cuda": torch.version.cuda, "cuda_available": ok}
    return info, gpus


def backend_status(name: str, device: str) -> dict[str, Any]:
    """{name, available, reason, install} for one row of BACKEND_ROWS."""
    from .backends.base import get_backend
    from .choices import BuildChoices
    from .errors import AcacheError

    row: dict[str, Any] = {"name": name, "available": False, "reason": "", "install": INSTALL[name]}
    backend_name, mode = ("trt", "llm") if name == "trt-llm" else (name, None)
    if name == "trt-llm" and importlib.util.find_spec("tensorrt_llm") is None:
        from .backends.tensorrt.backend import TRTLLM_MISSING

        row["reason"] = TRTLLM_MISSING
        return row
    try:
        backend = get_backend(backend_name)
        ok, reason = backend.available(BuildChoices(device=device, mode=mode))
    except AcacheError as e:
        ok, reason = False, str(e)
    except ImportError as e:  # a backend module whose own import fails is reported, not fatal
        ok, reason = False, f"backend module failed to import: {e}"
    row["available"], row["reason"] = bool(ok), reason
    return row


def _cache_root(cache_dir: Path | None) -> Path:
    if cache_dir is not None:
        return Path(os.path.abspath(os.path.expanduser(cache_dir)))
    env = settings.get("ACACHE_DIR")
    if env:
        return Path(os.path.abspath(os.path.expanduser(env)))
    import platformdirs

    return Path(platformdirs.user_cache_dir("acache"))


def cache_status(cache_dir: Path | None) -> dict[str, Any]:
    """Where the cache is, how big, and whether the store will accept it (read-only look)."""
    root = _cache_root(cache_dir)
    out: dict[str, Any] = {
        "dir": str(root),
        "exists": False,
        "mode": None,
        "owner_is_you": None,
        "size_bytes": 0,
        "entries": 0,
        "problem": None,
        "stray": [],
    }
    try:
        st = os.lstat(root)
    except FileNotFoundError:
        out["problem"] = "does not exist yet (the first build creates it, mode 0700)"
        return out
    out["exists"] = True
    out["mode"] = f"{stat.S_IMODE(st.st_mode):04o}"
    out["owner_is_you"] = st.st_uid == os.getuid()
    if stat.S_ISLNK(st.st_mode):
        out["problem"] = "is a symlink: the store refuses it without --allow-shared-root"
    elif not stat.S_ISDIR(st.st_mode):
        out["problem"] = "is not a directory"
    elif not out["owner_is_you"]:
        out["problem"] = "is owned by another user: refused without --allow-shared-root"
    elif st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        out["problem"] = "is writable by group or others: refused without --allow-shared-root"
    elif not os.access(root, os.R_OK | os.W_OK | os.X_OK):
        out["problem"] = "is not readable and writable by you"
    from .store.entry import tree_bytes

    out["size_bytes"] = tree_bytes(root)
    out["entries"], out["stray"] = _count_entries(root / "v1" / "entries")
    return out


def _count_entries(entries: Path) -> tuple[int, list[str]]:
    """(entry dirs under entries/<prefix>/, what else is there: paths relative to v1/)."""
    from .store.maintenance import prefix_listings

    n, stray = 0, []
    try:
        for p, found, _error in prefix_listings(entries):
            if found is None:  # not a directory, or one that cannot be listed
                stray.append(f"entries/{p.name}")
                continue
            for d in found:
                ok = d.is_dir(follow_symlinks=False) and d.name[:2] == p.name
                n += ok
                stray += [] if ok else [f"entries/{p.name}/{d.name}"]
    except OSError:  # no entries/ yet, or one that cannot be listed
        return 0, []
    return n, stray


def remote_status(url: str | None) -> dict[str, Any]:
    if not url:
        return {"configured": False, "url": None}
    try:
        from .store.remote import check_remote
    except ImportError as e:
        return {"configured": True, "url": url, "error": f"remote support not installed ({e})"}
    return {"configured": True, **check_remote(url)}


def compiler_status(memo_dir: Path | None = None) -> dict[str, Any]:
    """The C++ compiler aoti would build with here, and those passed over (backends/cxx.py).

    This is what to look at when AOTInductor libraries crash at load: on the GPU
    image $CXX named a compiler whose code segfaults in this process.
    """
    from .backends.shared import cxx

    try:
        import torch  # noqa: F401  (maps libstdc++ the way a build process has it)
    except ImportError:
        pass
    chosen, rejected = cxx.compiler_choice(memo_dir=memo_dir)
    runtime = cxx.loaded_libstdcxx()
    return {
        "cxx_env": os.environ.get("CXX"),
        "chosen": chosen,
        "version": cxx.compiler_version(chosen) if chosen else None,
        "runtime": runtime,
        "passed_over": list(rejected),
        "checked": bool(  # the verdict compiler_choice just read, from probe_compiler's cache
            chosen and runtime and cxx.probe_compiler(chosen, runtime, memo_dir)[0] == cxx.OK
        ),
    }


# Distributions whose versions decide what the probed part says.
TOOLCHAIN_DISTS = (
    "torch", "triton", "onnx", "onnxscript", "onnxruntime", "onnxruntime-gpu", "tensorrt",
    "tensorrt-cu12", "tensorrt-cu13", "tensorrt-llm", "transformers",
)  # fmt: skip
# The C++ compilers the backends may pick (backends/shared/cxx.py): installing one on an
# unchanged $PATH changes what works.
COMPILERS = ("g++", "c++", "clang++", "gcc", "cc")
TOOLCHAIN_ENV = ("CXX", "CC", "PATH", "CUDA_VISIBLE_DEVICES", "LD_LIBRARY_PATH", "LD_PRELOAD")
MEMO = "doctor.json"
PROBED_KEYS = ("torch", "gpus", "device_checked", "backends", "compiler")


def _nvml_gpus() -> list[str]:
    """The driver's GPU names through NVML (no torch, no subprocess); [] without one."""
    return [g["name"] for g in _nvml_properties()]


def _own_files() -> list[tuple[str, int, int]]:
    """acache's own modules by path, size and mtime: an edit re-probes."""
    root = Path(__file__).resolve().parent
    out = []
    for p in sorted(root.rglob("*.py")):
        st = p.stat()
        out.append((str(p.relative_to(root)), st.st_size, st.st_mtime_ns))
    return out


def toolchain_identity() -> str:
    """A hash of everything the probed part of the report depends on (module doc)."""
    from .keys import cuda_driver_version, package_version

    parts = {
        "dists": {d: package_version(d) for d in TOOLCHAIN_DISTS},
        "python": platform.python_version(),
        "platform": platform.platform(),
        "host": platform.node(),  # a home dir, and its cache, shared between machines
        "driver": cuda_driver_version(),
        "gpus": _nvml_gpus(),
        "env": {v: os.environ.get(v) for v in TOOLCHAIN_ENV},
        "compilers": {c: file_id(path) if (path := shutil.which(c)) else None for c in COMPILERS},
        "acache": _own_files(),
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


# A module of torch's that every warm inductor or compile load imports, and `import torch`
# does not: whether its bytecode is cached says whether those ~1,300 modules are.
BYTECODE_PROBE = ("_dynamo", "__init__.py")  # under the torch package


def bytecode_status() -> dict[str, Any]:
    """Whether torch's lazily imported modules load from cached bytecode, without importing
    torch. Without it, and with a Python that writes none (``PYTHONDONTWRITEBYTECODE``, a
    package installed with ``--no-compile``), every process compiles each module from
    source: on the H200 image that was 1,424 modules in a warm inductor load, ~4.5 s of
    its profile (docs/perf-notes.md, attempt 27)."""
    import importlib.util
    import sys

    torch_dir = _torch_dir()
    writes = not sys.dont_write_bytecode
    out: dict[str, Any] = {"writes_bytecode": writes, "pycache_prefix": sys.pycache_prefix,
                           "torch_bytecode": None, "problem": None}  # fmt: skip
    if torch_dir is None:
        return out
    source = Path(torch_dir, *BYTECODE_PROBE)
    if not source.is_file():
        return out
    out["torch_bytecode"] = Path(importlib.util.cache_from_source(str(source))).is_file()
    if not out["torch_bytecode"] and not writes:
        site = source.parents[2]
        out["problem"] = (
            "torch's modules have no cached bytecode and this Python writes none "
            "(PYTHONDONTWRITEBYTECODE or python -B): every process compiles each module it "
            "imports, "
            "seconds more per warm start; compile them once with "
            f"`python -m compileall -q -j 0 {site}` (as `pip install` does by default), "
            "or unset PYTHONDONTWRITEBYTECODE"
        )
    return out


def _nvml_properties() -> list[dict[str, Any]]:
    """The GPUs a CUDA process here would see, through NVML: no torch, no CUDA context.
    ``memory_bytes`` is NVML's total, a little above the figure torch reports."""
    try:
        import ctypes

        nvml = ctypes.CDLL("libnvidia-ml.so.1")
        count = ctypes.c_uint(0)
        if nvml.nvmlInit_v2() != 0 or nvml.nvmlDeviceGetCount_v2(ctypes.byref(count)) != 0:
            return []

        class Memory(ctypes.Structure):
            _fields_ = [(n, ctypes.c_ulonglong) for n in ("total", "free", "used")]

        gpus = []
        for i in range(count.value):
            handle, name = ctypes.c_void_p(), ctypes.create_string_buffer(96)
            uuid = ctypes.create_string_buffer(96)
            major, minor, mem = ctypes.c_int(0), ctypes.c_int(0), Memory()
            if nvml.nvmlDeviceGetHandleByIndex_v2(i, ctypes.byref(handle)) != 0:
                continue
            nvml.nvmlDeviceGetName(handle, name, 96)
            nvml.nvmlDeviceGetUUID(handle, uuid, 96)
            cc = (ctypes.byref(major), ctypes.byref(minor))
            nvml.nvmlDeviceGetCudaComputeCapability(handle, *cc)
            nvml.nvmlDeviceGetMemoryInfo(handle, ctypes.byref(mem))
            gpus.append(
                {
                    "name": name.value.decode(errors="replace"),
                    "compute_capability": f"{major.value}.{minor.value}",
                    "memory_bytes": int(mem.total),
                    "uuid": uuid.value.decode(errors="replace"),
                }
            )
    except (OSError, AttributeError):
        return []
    return [
        {"index": i, **{k: v for k, v in g.items() if k != "uuid"}}
        for i, g in enumerate(visible_devices(gpus, os.environ.get("CUDA_VISIBLE_DEVICES")))
    ]


def visible_devices(gpus: list[dict[str, Any]], mask: str | None) -> list[dict[str, Any]]:
    """The GPUs CUDA shows under ``CUDA_VISIBLE_DEVICES=mask``, in its order: indices or
    UUID prefixes (GPU-..., MIG-...), read up to the first that names none, as CUDA
    does; unset, all of them; empty or -1, none."""
    if mask is None:
        return gpus
    picked: list[dict[str, Any]] = []
    for item in (part.strip() for part in mask.split(",")):
        found = None
        if item.isdigit() and int(item) < len(gpus):
            found = gpus[int(item)]
        elif item.startswith(("GPU-", "MIG-")):
            found = next((g for g in gpus if g["uuid"].startswith(item)), None)
        if found is None or found in picked:
            break
        picked.append(found)
    return picked


def _torch_dir() -> Path | None:
    """The installed torch package's folder, found without importing it; None without one."""
    import importlib.util

    spec = importlib.util.find_spec("torch")
    where = spec.submodule_search_locations if spec is not None else None
    return Path(next(iter(where))) if where else None


def _torch_build(torch_dir: Path) -> tuple[str | None, str | None]:
    """(``torch.__version__``, the CUDA version it was built for or None), read from
    torch/version.py's text (``__version__ = '2.11.0+cu130'``, ``cuda: Optional[str] =
    '13.0'``) instead of importing torch; the distribution's metadata can leave out the
    local part (+cu130)."""
    import re

    try:
        text = (torch_dir / "version.py").read_text()
    except OSError:
        return None, None

    def value(name: str) -> str | None:
        found = re.search(rf"^{name}\b[^=\n]*=\s*['\"]([^'\"]+)['\"]", text, re.M)
        return found.group(1) if found else None

    return value("__version__"), value("cuda")


def _quick_backend(name: str, device: str, torch_dir: Path | None) -> dict:
    """One backend row from what is installed, without importing torch: torch's three
    backends need torch (with a CUDA build and a GPU for cuda) and, where their code is
    C++, a compiler on $PATH; ort and trt ask their own cheap checks (no torch either)."""
    from .backends.shared.cxx import missing_compiler

    if name not in ("eager", "inductor", "aoti"):
        return backend_status(name, device)
    row: dict[str, Any] = {"name": name, "available": False, "reason": "", "install": INSTALL[name]}
    if torch_dir is None:
        row["reason"] = "torch is not installed: pip install torch (docs: README, Install)"
    elif name == "aoti" and not (torch_dir / "_inductor").is_dir():
        row["reason"] = "this torch has no AOTInductor (torch._inductor)"
    elif (name == "aoti" or (name == "inductor" and device == "cpu")) and (
        why := missing_compiler()
    ):
        row["reason"] = why
    else:
        row["available"] = True
    return row


def _quick_compiler(memo_dir: Path | None) -> dict[str, Any]:
    """The compiler aoti would try first, as far as is known without torch: the probe's
    kept verdicts pass over the candidates found to crash (or the $CXX that cannot be
    tried); ``checked`` says whether the one named was seen to work."""
    from .backends.shared import cxx

    paths, passed_over = cxx.candidates()
    chosen, checked = None, False
    for path in paths:
        verdict = cxx.remembered_verdict(path, memo_dir)
        if verdict is not None and verdict[0] == cxx.REJECTED:
            passed_over.append(verdict[1])
            continue
        chosen, checked = path, verdict is not None
        break
    return {
        "cxx_env": os.environ.get("CXX"),
        "chosen": chosen,
        "version": cxx.compiler_version(chosen) if chosen else None,
        "runtime": None,
        "passed_over": passed_over,
        "checked": checked,
    }


def _quick_probe(memo_dir: Path | None) -> dict[str, Any]:
    """PROBED_KEYS from what is installed and what the driver says: no torch import, no
    CUDA context, no compiler probe (a second or less where the full checks take 20 s)."""
    from .keys import package_version

    torch_dir = _torch_dir()
    version, cuda = _torch_build(torch_dir) if torch_dir is not None else (None, None)
    if torch_dir is not None and version is None:
        version = package_version("torch")
    gpus = _nvml_properties() if cuda else []
    device = "cuda" if gpus else "cpu"
    return {
        "torch": {"version": version, "cuda": cuda, "cuda_available": bool(gpus)},
        "gpus": gpus,
        "device_checked": device,
        "backends": [_quick_backend(n, device, torch_dir) for n in BACKEND_ROWS],
        "compiler": _quick_compiler(memo_dir),
    }


def _probe(memo_dir: Path | None) -> dict[str, Any]:
    torch_info, gpus = _torch_info()
    device = "cuda" if gpus else "cpu"
    return {
        "torch": torch_info,
        "gpus": gpus,
        "device_checked": device,
        "backends": [backend_status(name, device) for name in BACKEND_ROWS],
        "compiler": compiler_status(memo_dir),
    }


def doctor_report(
    cache_dir: Path | None, remote: str | None, *, full: bool = False
) -> dict[str, Any]:
    """The whole report. The toolchain part: with ``full``, the full checks, kept in the
    memo; without, the memo's when it matches this toolchain, else the quick checks.
    ``probed`` says when it was probed, whether it came from the memo and whether the
    checks were the full ones."""
    from .keys import cuda_driver_version

    cache = cache_status(cache_dir)
    # The memos live in a cache the store would accept, as aoti builds' compiler memo.
    base = _cache_root(cache_dir) / "v1"
    memo_dir = base if cache["problem"] is None and base.is_dir() else None
    identity = toolchain_identity()
    kept = read_memo(memo_dir / MEMO).get(identity) if memo_dir and not full else None
    now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    checked_full = True
    if isinstance(kept, dict) and all(k in kept for k in (*PROBED_KEYS, "at")):
        probed, from_memo = kept, True
    elif full:
        probed, from_memo = {**_probe(memo_dir), "at": now}, False
        if memo_dir is not None:  # only this identity's result; a failed write is no error
            write_memo(memo_dir / MEMO, {identity: probed}, indent=1, sort_keys=True)
    else:
        probed, from_memo, checked_full = {**_quick_probe(memo_dir), "at": now}, False, False
    return {
        "schema": DOCTOR_SCHEMA,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": probed["torch"],
        "driver": cuda_driver_version(),
        "gpus": probed["gpus"],
        "device_checked": probed["device_checked"],
        "backends": probed["backends"],
        "compiler": probed["compiler"],
        "cache": cache,
        "remote": remote_status(remote),
        "settings": settings.report(),
        "bytecode": bytecode_status(),
        "probed": {"at": probed["at"], "from_memo": from_memo, "full": checked_full},
    }
