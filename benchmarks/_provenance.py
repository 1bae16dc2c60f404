"""The command, date and machine a benchmark writes beside its figures.

Every figure in the docs names the run it came from (README: "Numbers come from runs").
Nothing here imports torch or starts CUDA: versions come from the installed packages'
metadata and the GPU from nvidia-smi, so a script may call it before its measured work.
"""

from __future__ import annotations

import datetime
import os
import platform
import shlex
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

PACKAGES = ("torch", "triton", "onnxruntime", "onnxruntime-gpu", "tensorrt")


def command(argv: list[str] | None = None) -> str:
    """The command as typed from the repository root: ``python benchmarks/NAME.py ARGS``."""
    args = sys.argv[1:] if argv is None else argv
    return shlex.join(["python", f"benchmarks/{Path(sys.argv[0]).name}", *args])


def utc_now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def gpus() -> list[str]:
    """``name, driver`` of each GPU nvidia-smi lists; [] without one."""
    if not shutil.which("nvidia-smi"):
        return []
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [line.strip() for line in out.stdout.splitlines() if line.strip()]


def machine() -> dict[str, Any]:
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return {
        "host": platform.node(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "usable_cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "gpus": gpus(),
        "packages": versions,
    }


def provenance(argv: list[str] | None = None) -> dict[str, Any]:
    """{"command", "date", "machine"}: what a results file starts with."""
    return {"command": command(argv), "date": utc_now(), "machine": machine()}
