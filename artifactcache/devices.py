"""The one rule for a device string: ``cpu``, ``cuda`` or ``cuda:N``.

Torch-free at import, so the CLI and the keys can check a device without importing
torch (only ``check_device(present=True)`` asks torch, inside the function); every
module that reads a device string goes through these functions.
"""

from __future__ import annotations

import re

from .errors import BackendError, BackendUnavailable

DEVICE_HELP = "cpu, cuda or cuda:N"
_DEVICE = re.compile(r"^(cpu|cuda)(:(\d+))?$")


def parse_device(device: str) -> tuple[str, int | None]:
    """("cpu" | "cuda", index or None) from cpu, cuda or cuda:N; one-line BackendError else."""
    m = _DEVICE.match(device)
    if not m or (m.group(1) == "cpu" and m.group(2)):
        raise BackendError(f"unknown device {device!r}: use {DEVICE_HELP}")
    return m.group(1), int(m.group(3)) if m.group(3) is not None else None


def device_type(device: str) -> str:
    """The device type, cpu or cuda: what shapes an artifact (cuda:0 and cuda:1 build alike)."""
    return parse_device(device)[0]


def is_cuda(device: str) -> bool:
    return device_type(device) == "cuda"


def device_index(device: str) -> int:
    """The GPU ordinal a cuda device names (plain ``cuda`` is GPU 0); 0 for cpu."""
    return parse_device(device)[1] or 0


def check_device(device: str, *, present: bool = True) -> None:
    """cpu, cuda or cuda:N (and, with present=True, N a GPU torch can see)."""
    kind, index = parse_device(device)
    if present and kind == "cuda":
        import torch

        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if n == 0:
            raise BackendUnavailable(f"device {device!r}: torch sees no CUDA GPU; use --device cpu")
        if index is not None and index >= n:
            raise BackendError(f"device {device!r}: only {n} GPU(s) visible (cuda:0..cuda:{n - 1})")
