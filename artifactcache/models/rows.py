"""A decode row's projections through acache's own GEMV (models/gemv.py, ``acache::row_gemv``).

``row_linear(linear, x, norm=..., silu_mul=..., residual=...)`` is
``residual + linear(prologue(x))`` for one row: an nn.Linear with float weights or an
Int8WeightOnlyLinear run as one kernel, the RMSNorm or SiLU-and-mul before it and the
skip connection after it included; any other layer (int4's) runs as the plain modules.
A llama-family block built with ``row_gemv`` (``models.build_model``) runs its one-row
steps as four such calls (models/llama.py, ``Block.one_row``).

The op is registered by importing models/gemv.py, which imports Triton and Dynamo:
``register_gemv()`` does it for CUDA models only, before Dynamo or torch.export trace
them (they refuse to register an op inside what they trace).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

# Set once models/gemv.py is imported (which registers acache::row_gemv).
_gemv_registered = False


def register_gemv() -> None:
    """Register acache::row_gemv (imports models/gemv.py, Triton and Dynamo); idempotent."""
    global _gemv_registered
    if not _gemv_registered:
        from . import gemv  # noqa: F401 - registers acache::row_gemv

        _gemv_registered = True


def gemv_registered() -> bool:
    """Whether acache::row_gemv is registered (a traced function cannot register it)."""
    return _gemv_registered


def row_weights(linear: nn.Module) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    """(weight, int8 scales or None) of a layer the GEMV reads, or None for any other:
    an nn.Linear with float weights, or models/quant.py's Int8WeightOnlyLinear (known by
    its int8 weight and scales, as quant.py imports this module)."""
    weight = getattr(linear, "weight", None)
    if not isinstance(weight, torch.Tensor):
        return None
    scales = getattr(linear, "scales", None)
    if weight.dtype == torch.int8 and isinstance(scales, torch.Tensor):
        return weight, scales
    if type(linear) is nn.Linear and weight.dtype.is_floating_point:
        return weight, None
    return None


def row_linear(
    linear: nn.Module,
    x: torch.Tensor,
    *,
    norm: nn.Module | None = None,
    silu_mul: bool = False,
    residual: torch.Tensor | None = None,
) -> torch.Tensor:
    """``residual + linear(prologue(x))`` for x [1, 1, K]: prologue ``norm`` (an RMSNorm)
    or ``silu(gate) * up`` of x = [gate | up] (``silu_mul``). [1, 1, N]."""
    read = row_weights(linear) if _gemv_registered else None
    if read is None:
        if norm is not None:
            x = norm(x)
        if silu_mul:
            gate, up = x.chunk(2, dim=-1)
            x = F.silu(gate) * up
        y = linear(x)
        return y if residual is None else residual + y
    weight, scales = read
    y = torch.ops.acache.row_gemv(
        x.reshape(1, x.shape[-1]), weight, scales, getattr(linear, "bias", None),
        None if norm is None else norm.weight, 0.0 if norm is None else float(norm.eps),
        silu_mul, None if residual is None else residual.reshape(-1),
    )  # fmt: skip
    return y.reshape(1, 1, weight.shape[0])
