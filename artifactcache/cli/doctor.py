"""`acache doctor [--json]`: what works on this machine, and why not.

The --json document is a stable schema (``DOCTOR_SCHEMA``; docs/doctor.md): keys
are only ever added, and a change of meaning bumps the schema.
Doctor never creates the cache dir and writes nothing but the C++ compiler probe
memo into an existing cache (backends/cxx.py: a repeat doctor runs no probe).
"""

from __future__ import annotations

import importlib
import os
import platform
import stat
from pathlib import Path
from typing import Any

import typer

from .. import settings
from ..extras import EXTRAS, install_hint
from .app import (
    CacheDir,
    JsonOut,
    Remote,
    console,
    emit_json,
    human_bytes,
    print_table,
    shown,
)

DOCTOR_SCHEMA = 1
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
    from ..backends.base import get_backend
    from ..choices import BuildChoices
    from ..errors import AcacheError

    row: dict[str, Any] = {"name": name, "available": False, "reason": "", "install": INSTALL[name]}
    backend_name, mode = ("trt", "llm") if name == "trt-llm" else (name, None)
    if name == "trt-llm" and importlib.util.find_spec("tensorrt_llm") is None:
        from ..backends.tensorrt.backend import TRTLLM_MISSING

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
    from ..store.entry import tree_bytes

    out["size_bytes"] = tree_bytes(root)
    out["entries"], out["stray"] = _count_entries(root / "v1" / "entries")
    return out


def _count_entries(entries: Path) -> tuple[int, list[str]]:
    """(entry dirs under entries/<prefix>/, what else is there: paths relative to v1/)."""
    n, stray = 0, []
    try:
        prefixes = sorted(os.scandir(entries), key=lambda d: d.name)
    except OSError:
        return 0, []
    for p in prefixes:
        if not p.is_dir(follow_symlinks=False):
            stray.append(f"entries/{p.name}")
            continue
        try:
            with os.scandir(p.path) as it:
                for d in it:
                    ok = d.is_dir(follow_symlinks=False) and d.name[:2] == p.name
                    n += ok
                    stray += [] if ok else [f"entries/{p.name}/{d.name}"]
        except OSError:
            stray.append(f"entries/{p.name}")
    return n, stray


def remote_status(url: str | None) -> dict[str, Any]:
    if not url:
        return {"configured": False, "url": None}
    try:
        from ..store.remote import check_remote
    except ImportError as e:
        return {"configured": True, "url": url, "error": f"remote support not installed ({e})"}
    return {"configured": True, **check_remote(url)}


def compiler_status(memo_dir: Path | None = None) -> dict[str, Any]:
    """The C++ compiler aoti would build with here, and those passed over (backends/cxx.py).

    This is what to look at when AOTInductor libraries crash at load: on the GPU
    image $CXX named a compiler whose code segfaults in this process.
    """
    from ..backends.shared import cxx

    try:
        import torch  # noqa: F401  (maps libstdc++ the way a build process has it)
    except ImportError:
        pass
    chosen, rejected = cxx.compiler_choice(memo_dir=memo_dir)
    return {
        "cxx_env": os.environ.get("CXX"),
        "chosen": chosen,
        "version": cxx.compiler_version(chosen) if chosen else None,
        "runtime": cxx.loaded_libstdcxx(),
        "passed_over": list(rejected),
    }


def doctor_report(cache_dir: Path | None, remote: str | None) -> dict[str, Any]:
    torch_info, gpus = _torch_info()
    device = "cuda" if gpus else "cpu"
    from ..keys import cuda_driver_version

    cache = cache_status(cache_dir)
    # The probe memo aoti builds share, in a cache the store would accept.
    base = _cache_root(cache_dir) / "v1"
    memo_dir = base if cache["problem"] is None and base.is_dir() else None
    return {
        "schema": DOCTOR_SCHEMA,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch_info,
        "driver": cuda_driver_version(),
        "gpus": gpus,
        "device_checked": device,
        "backends": [backend_status(name, device) for name in BACKEND_ROWS],
        "compiler": compiler_status(memo_dir),
        "cache": cache,
        "remote": remote_status(remote),
        "settings": settings.report(),
    }


def _default(value: Any) -> str:
    return "(default)" if value is None else f"(default: {value})"


def _render(rep: dict[str, Any]) -> None:
    t = rep["torch"]
    console.print(
        f"python {rep['python']}  torch {t['version']}  CUDA {t['cuda'] or '-'}  "
        f"driver {rep['driver'] or '-'}",
        highlight=False,
    )
    for g in rep["gpus"] or [{"index": "-", "name": "no CUDA GPU", "compute_capability": "-"}]:
        console.print(f"gpu {g['index']}: {g['name']} (sm {g['compute_capability']})")
    # print_table: "[trt]" in an install hint is text, not rich markup; long cells fold
    rows = [
        [
            b["name"],
            "yes" if b["available"] else "no",
            b["reason"] if b["available"] is False else "",
        ]
        for b in rep["backends"]
    ]
    print_table(None, ["backend", "available", "reason / install"], rows)
    cc = rep["compiler"]
    chosen = (
        f"{cc['chosen']} {cc['version'] or ''}".strip() if cc["chosen"] else "Inductor's default"
    )
    console.print(
        f"c++ for aoti/inductor: {chosen}"
        + (f"  (passed over: {'; '.join(cc['passed_over'])})" if cc["passed_over"] else ""),
        highlight=False,
    )
    c = rep["cache"]
    console.print(
        f"cache {shown(c['dir'])}  {human_bytes(c['size_bytes'])}  {c['entries']} entries  "
        f"mode {c['mode'] or '-'}" + (f"  ({shown(c['problem'])})" if c["problem"] else ""),
        highlight=False,
    )
    for item in c["stray"]:
        console.print(f"warning: stray item {shown(item)} in the cache; remove it", highlight=False)
    r = rep["remote"]
    if not r["configured"]:
        console.print("remote: not configured (--remote / ACACHE_REMOTE)")
    else:
        state = r.get("error") or ", ".join(
            k for k in ("reachable", "readable", "writable") if r.get(k)
        )
        console.print(f"remote {shown(r['url'])}: {shown(state)}", highlight=False)
    rows = [
        [
            s["name"],
            s["value"] if s["value"] is not None else _default(s["default"]),
            f"refused: {s['problem']}" if s["problem"] else s["doc"],
        ]
        for s in rep["settings"]
    ]
    print_table(None, ["setting", "value", "what it does"], rows)


def register(app: typer.Typer) -> None:
    @app.command("doctor")
    def doctor_cmd(
        json_out: JsonOut = False,
        cache_dir: CacheDir = None,
        remote: Remote = None,
    ) -> None:
        """What works here: versions, GPUs, each backend (and why not), the cache, the remote,
        and the ACACHE_* settings in effect."""
        rep = doctor_report(cache_dir, remote)
        if json_out:
            emit_json(rep)
        else:
            _render(rep)
