"""The row GEMV's product in float64 (models/gemv.py's docstring), for its tests."""

from __future__ import annotations

import torch
from torch.nn import functional as F


def reference(
    x, weight, scales, bias, norm_weight, eps, silu_mul, residual,
    norm_bias=None, layer_norm=False, gelu_from=-1,
):  # fmt: skip
    """The module docstring's product in float64 (the norm unrounded, as the kernel's)."""
    a = x.double().reshape(-1)
    if silu_mul:
        gate, up = a.chunk(2)
        a = F.silu(gate) * up
    if gelu_from >= 0:
        a = torch.cat([a[:gelu_from], F.gelu(a[gelu_from:], approximate="tanh")])
    if layer_norm:
        bias_k = None if norm_bias is None else norm_bias.double()
        a = F.layer_norm(a, a.shape, norm_weight.double(), bias_k, eps)
    elif norm_weight is not None:
        a = a * torch.rsqrt(a.pow(2).mean() + eps) * norm_weight.double()
    y = weight.double() @ a
    if scales is not None:
        y = y * scales.double()
    if bias is not None:
        y = y + bias.double()
    if residual is not None:
        y = y.to(x.dtype).double() + residual.double()
    return y.reshape(1, -1)
