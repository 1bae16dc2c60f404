"""Inductor tuning flags that inductor and aoti set by default on CUDA.

``coordinate_descent_tuning`` lets Inductor tune the block sizes of its Triton kernels,
and makes it generate its own Triton kernels for the M=1 matmuls of a decode step
instead of calling cuBLAS's split-K GEMMs (docs/perf-notes.md has the profile). It only
concerns Triton, so it is on by default on CUDA and refused on CPU. Users turn it off
with ``--extra coordinate_descent_tuning=0`` (for a faster build). Every flag returned
here is passed to the compile and is part of the key through the codegen factor.

Only decode is tuned (``decode_only``): a prefill pass's time is cuBLAS GEMMs over
hundreds of rows, which the flag does not touch, while tuning its Triton kernels
lengthens the build and, on H200, benchmarked them beside the decode step's own
tuning when the steps build at once.
"""

from __future__ import annotations

from typing import Any

from ...choices import BuildChoices
from ...devices import is_cuda
from ...errors import BackendError
from .model_options import MODEL_EXTRA_KEYS, parse_flag

EXTRA_KEYS = ("coordinate_descent_tuning",)


def check_extra(backend: str, opts: BuildChoices, own: tuple[str, ...] = ()) -> None:
    """Unknown --extra keys, and flags that do not apply to the device, are one line.

    ``own``: the backend's own keys beside the shared ones (aoti's wrapper_opt)."""
    known = EXTRA_KEYS + MODEL_EXTRA_KEYS + own
    unknown = sorted(set(opts.extra) - set(known))
    if unknown:
        raise BackendError(
            f"backend {backend!r} takes no extra option {', '.join(unknown)} "
            f"(it takes: {', '.join(known)})"
        )
    inductor_tuning(opts)


def inductor_tuning(opts: BuildChoices) -> dict[str, bool]:
    """The Inductor config flags this build sets (empty on CPU)."""
    on_cuda = is_cuda(opts.device)
    name = "coordinate_descent_tuning"
    on = parse_flag(name, opts.extra.get(name, on_cuda))
    if on and not on_cuda:
        raise BackendError(
            f"--extra {name}=1 tunes Triton kernels, which only CUDA builds have; "
            "leave it off on cpu"
        )
    return {name: True} if on else {}


def decode_only(cfg: dict[str, Any], step: str) -> dict[str, Any]:
    """The Inductor config for ``step``: ``cfg`` less the tuning flags, but for decode."""
    if step == "decode":
        return cfg
    return {k: v for k, v in cfg.items() if k not in EXTRA_KEYS}
