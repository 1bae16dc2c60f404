"""TensorRT helpers with no TensorRT in them: versions, the plan header, compatibility."""

from __future__ import annotations

from typing import Any

from ...devices import device_index
from ...errors import BackendUnavailable, IntegrityError, StaleArtifact
from ...extras import TRT_HINT


class EngineIncompatible(StaleArtifact):
    """A cached engine cannot run on this runtime: a miss, with the reason."""


def import_tensorrt() -> Any:
    """The tensorrt module, imported only when an engine is built or loaded.

    A package that is found but does not import (its libnvinfer missing, as with the
    bare ``tensorrt-cu*-bindings`` wheel) is a one-line BackendUnavailable, not a
    traceback.
    """
    try:
        import tensorrt
    except (ImportError, OSError) as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        raise BackendUnavailable(f"tensorrt does not import ({first}): {TRT_HINT}") from None
    return tensorrt


def host_code_allowed(requested: bool, meta: dict[str, Any], entry: str) -> bool:
    """``engine_host_code_allowed`` for loading an engine: the caller's build options
    (``requested``: allow_host_code, which the entry's key covers), never the entry's
    own ``meta``. An entry whose meta claims host code the options did not ask for was
    not built under this key: refused (a bundle or a bucket could otherwise turn on
    host code for itself)."""
    if meta.get("allow_host_code") and not requested:
        raise IntegrityError(
            f"entry {entry[:12]} says its engine runs host code (allow_host_code), which its "
            "key does not allow; refused: remove it (`acache rm`) and build it here"
        )
    return requested


def gpu_identity(device: str) -> tuple[str, str]:
    """(GPU name, compute capability "major.minor") of a cuda device."""
    import torch

    idx = device_index(device)
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
# It is observed, not an API, so it is only an advisory cross-check of the manifest
# (header_note): neither a header that does not parse nor one that disagrees is a
# reason to reject an engine.
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
    meta: dict[str, Any], runtime_version: str, runtime_cc: str | None
) -> str | None:
    """Why a cached engine cannot run here (None when it can), from its manifest.

    A plain engine is tied to the exact TensorRT version that built it. One built
    version-compatible (``allow_host_code``: BuilderFlag.VERSION_COMPATIBLE, the lean
    runtime inside the plan) runs on that version and later ones, never earlier
    (NVIDIA's "Engine Compatibility" guide). Both are tied to the GPU's compute
    capability: acache does not build hardware-compatible engines.
    """
    built = meta.get("tensorrt")
    if built is None:
        return "the entry records no TensorRT version: rebuild it with --force"
    have, want = _vtuple(runtime_version), _vtuple(built)
    if meta.get("allow_host_code"):
        if have is None or want is None or have < want:
            return (
                f"version-compatible engine built with TensorRT {built} runs on that version "
                f"or later, this runtime is TensorRT {runtime_version}"
            )
    elif have != want:
        return f"engine built with TensorRT {built}, this runtime is TensorRT {runtime_version}"
    cc = meta.get("compute_capability")
    if runtime_cc is not None and cc != runtime_cc:
        return f"engine built for compute capability {cc}, this GPU is {runtime_cc}"
    return None


def header_note(meta: dict[str, Any], head: bytes) -> str | None:
    """An advisory line when the plan header and the manifest disagree, else None.

    Never a reason to reject: the layout is undocumented, so a disagreement may
    be our reading that is wrong (a new TensorRT, a version-compatible plan), and
    rejecting would rebuild the same engine on every load. TensorRT's own
    deserialization is the check that decides.
    """
    hv = plan_header_version(head)
    built = meta.get("tensorrt")
    if hv is None or built is None or hv == _vtuple(built):
        return None
    return (
        f"the plan header reads TensorRT {'.'.join(map(str, hv))}, the manifest says {built} "
        "(the header layout is undocumented: advisory only)"
    )
