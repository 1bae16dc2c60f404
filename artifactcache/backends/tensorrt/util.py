"""TensorRT helpers with no TensorRT in them: versions, the plan header, compatibility."""

from __future__ import annotations

from typing import Any

from ...errors import StaleArtifact


class EngineIncompatible(StaleArtifact):
    """A cached engine cannot run on this runtime: a miss, with the reason."""


def import_tensorrt() -> Any:
    """The tensorrt module, imported only when an engine is built or loaded."""
    import tensorrt

    return tensorrt


def gpu_identity(device: str) -> tuple[str, str]:
    """(GPU name, compute capability "major.minor") of a cuda device."""
    import torch

    idx = torch.device(device).index or 0
    props = torch.cuda.get_device_properties(idx)
    return props.name, f"{props.major}.{props.minor}"


def trt_major(version: str | None) -> int:
    try:
        return int(str(version).split(".")[0])
    except ValueError:
        return 0


# TensorRT does not document its plan layout. The one public statement is an NVIDIA
# engineer's comment on NVIDIA/TensorRT issue #3073 (2023): the TensorRT major, minor
# and patch version are the bytes at offsets 24, 25 and 26 of a serialized engine.
# It is observed, not an API, so it is only a cross-check of the manifest: a header
# that does not parse is "unknown", never a reason to reject an engine.
PLAN_VERSION_OFFSET = 24
PLAN_HEADER_BYTES = 32


def plan_header_version(head: bytes) -> tuple[int, int, int] | None:
    if len(head) < PLAN_VERSION_OFFSET + 3:
        return None
    major, minor, patch = head[PLAN_VERSION_OFFSET : PLAN_VERSION_OFFSET + 3]
    if not 8 <= major <= 99:  # no TensorRT that writes this layout is older than 8
        return None
    return (major, minor, patch)


def _vtuple(version: str | None, n: int = 3) -> tuple[int, ...] | None:
    try:
        return tuple(int(x) for x in str(version).split(".")[:n])
    except ValueError:
        return None


def compat_problem(
    meta: dict[str, Any],
    runtime_version: str,
    runtime_cc: str | None,
    head: bytes | None = None,
) -> str | None:
    """Why a cached engine cannot run here (None when it can), from the manifest and header.

    Engines are tied to the exact TensorRT version and the GPU's compute capability
    unless built version- or hardware-compatible, which acache does not do.
    """
    built = meta.get("tensorrt")
    if built is None:
        return "the entry records no TensorRT version: rebuild it with --force"
    if _vtuple(built) != _vtuple(runtime_version):
        return f"engine built with TensorRT {built}, this runtime is TensorRT {runtime_version}"
    cc = meta.get("compute_capability")
    if runtime_cc is not None and cc != runtime_cc:
        return f"engine built for compute capability {cc}, this GPU is {runtime_cc}"
    if head is not None:
        hv = plan_header_version(head)
        if hv is not None and hv != _vtuple(built):
            return (
                f"the plan header says TensorRT {'.'.join(map(str, hv))} but the manifest "
                f"says {built}: the entry is inconsistent, rebuild it with --force"
            )
    return None
