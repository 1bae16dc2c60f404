"""A decode row's projections through acache's own GEMV (models/gemv.py, ``acache::row_gemv``).

``row_linear(linear, x, norm=..., silu_mul=..., residual=...)`` is
``residual + linear(prologue(x))`` for one row: an nn.Linear with float weights, an
Int8WeightOnlyLinear or an Int4WeightOnlyLinear run as one kernel, the norm (RMSNorm or
LayerNorm), SiLU-and-mul or GELU before it and the skip connection after it included;
any other layer runs as the plain modules.
A llama-family block built with ``row_gemv`` (``models.build_model``) runs its one-row
steps as four such calls (models/llama.py, ``Block.one_row``), a fused phi-2 block as
two, or three where its outputs stay apart (models/phi2.py, ``PhiBlock.one_row``).

The op is registered by importing models/gemv.py, which imports Triton and Dynamo
(~1.5 s). Dynamo and torch.export refuse to register an op inside what they trace, so
the backends call ``register_ops(model)`` before they trace a CUDA model that runs it;
an eager call registers it on the way (``row_linear``). Building a model registers
nothing: a warm aoti process, which only hands the model's tensors to its compiled
library, never imports Triton or Dynamo for it.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from .lazy_kernels import interpreting

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


def runs_here(t: torch.Tensor) -> bool:
    """Whether the kernel can read ``t``: a CUDA tensor, or any under Triton's
    interpreter (the CPU tests). Static under tracing."""
    return t.is_cuda or interpreting()


def register_ops(model: nn.Module) -> None:
    """Register acache::row_gemv before Dynamo or torch.export trace ``model``, if any of
    it runs the op: int8 weights or a ``row_gemv`` model, on CUDA. A CPU model never
    imports Triton for it."""
    for m in model.modules():
        read = row_weights(m)
        # An int8 layer runs the op in its own forward; an int4 one only in a row_gemv
        # model's steps (tinygemm otherwise), so it alone registers nothing.
        int8 = read is not None and read[0].dtype == torch.int8
        if (int8 or getattr(m, "row_gemv", False)) and _on_cuda(m):
            register_gemv()
            return


def _on_cuda(module: nn.Module) -> bool:
    tensors = [*module.parameters(), *module.buffers()]
    return any(t.is_cuda for t in tensors)


def row_weights(linear: nn.Module) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    """(weight, scales or None) of a layer the GEMV reads, or None for any other: an
    nn.Linear with float weights, models/quant.py's Int8WeightOnlyLinear (int8 weight
    and per-row scales) or Int4WeightOnlyLinear (its nibbles and [K/group, N, 2] scales
    and zeros), each known by its tensors, as quant.py imports this module."""
    nibbles = getattr(linear, "nibbles", None)
    scales_zeros = getattr(linear, "scales_zeros", None)
    if isinstance(nibbles, torch.Tensor) and isinstance(scales_zeros, torch.Tensor):
        return (nibbles, scales_zeros) if nibbles.dtype == torch.uint8 else None
    weight = getattr(linear, "weight", None)
    if not isinstance(weight, torch.Tensor):
        return None
    scales = getattr(linear, "scales", None)
    if weight.dtype == torch.int8 and isinstance(scales, torch.Tensor):
        return weight, scales
    if type(linear) is nn.Linear and weight.dtype.is_floating_point:
        return weight, None
    return None


def streamed_weight(linear: nn.Module) -> torch.Tensor | None:
    """The tensor a layer's matmul streams from memory (row_weights' weight, nibbles or
    int8 bytes), or None for a layer it does not know: what a decode step may prefetch."""
    read = row_weights(linear)
    return None if read is None else read[0]


def row_linear(
    linear: nn.Module,
    x: torch.Tensor,
    *,
    norm: nn.Module | None = None,
    silu_mul: bool = False,
    gelu_from: int = -1,
    residual: torch.Tensor | None = None,
    x_tail: torch.Tensor | None = None,
    gelu_out_from: int = -1,
) -> torch.Tensor:
    """``residual + linear(prologue(x))`` for x [1, 1, K]: prologue ``norm`` (an RMSNorm
    or an nn.LayerNorm), ``silu(gate) * up`` of x = [gate | up] (``silu_mul``) or tanh's
    GELU on x's channels from ``gelu_from`` on. ``x_tail`` [1, 1, K2]: x continues there
    (x is then [x | x_tail], read in place by the kernel, no concatenation).
    ``gelu_out_from``: tanh's GELU on the product's channels from there on (before the
    residual). [1, 1, N]."""
    if not _gemv_registered and runs_here(x) and not torch.compiler.is_compiling():
        register_gemv()  # an eager call (a trace must find it registered: register_ops)
    read = row_weights(linear) if _gemv_registered and runs_here(x) else None
    if norm is not None and getattr(norm, "weight", None) is None:
        read = None  # a norm without its weight (elementwise_affine=False): the plain path
    if read is None:
        if x_tail is not None:
            x = torch.cat([x, x_tail], dim=-1)
        if norm is not None:
            x = norm(x)
        if silu_mul:
            gate, up = x.chunk(2, dim=-1)
            x = F.silu(gate) * up
        if gelu_from >= 0:
            x = _gelu_from(x, gelu_from)
        y = linear(x)
        if gelu_out_from >= 0:
            y = _gelu_from(y, gelu_out_from)
        return y if residual is None else residual + y
    weight, scales = read
    layer_norm = isinstance(norm, nn.LayerNorm)
    y = torch.ops.acache.row_gemv(
        x.reshape(1, x.shape[-1]), weight, scales, getattr(linear, "bias", None),
        None if norm is None else norm.weight, 0.0 if norm is None else float(norm.eps),
        silu_mul, None if residual is None else residual.reshape(-1),
        norm.bias if layer_norm else None, layer_norm, gelu_from,
        None if x_tail is None else x_tail.reshape(1, x_tail.shape[-1]), gelu_out_from,
    )  # fmt: skip
    return y.reshape(1, 1, y.shape[-1])


def _gelu_from(t: torch.Tensor, start: int) -> torch.Tensor:
    """t with tanh's GELU on its last dimension's channels from ``start`` on."""
    kept, rest = t.split([start, t.shape[-1] - start], dim=-1)
    return torch.cat([kept, F.gelu(rest, approximate="tanh")], dim=-1)
