"""The row GEMV's inputs checked on the host before any launch (models/gemv.py): shapes,
dtypes, int4 groups and the prologue's rules, each misfit a one-line ValueError."""

from __future__ import annotations

import torch

Vector = torch.Tensor | None


def int4_group(nibbles: torch.Tensor, scales_zeros: torch.Tensor) -> int:
    """Input channels a scale and zero cover: [N, K/2] nibbles, [K/group, N, 2] values
    (or those values flattened)."""
    n, half_k = nibbles.shape
    return 2 * half_k * n * 2 // scales_zeros.numel()


def checked_inputs(
    x: torch.Tensor,
    weight: torch.Tensor,
    scales: Vector,
    bias: Vector,
    norm_weight: Vector,
    silu_mul: bool,
    residual: Vector,
    norm_bias: Vector = None,
    layer_norm: bool = False,
    gelu_from: int = -1,
    x_tail: Vector = None,
    gelu_out_from: int = -1,
) -> tuple[torch.Tensor, Vector, Vector, Vector, Vector, Vector, Vector]:
    """The inputs as the kernel reads them, checked on the host before any launch: a
    ValueError for what it cannot read. x and the [N] and [K] vectors are made
    contiguous (cheap); a strided weight is refused, as a silent copy of it would cost
    its whole size in memory and time on every call."""
    if x.dim() != 2 or x.shape[0] != 1:
        raise ValueError(f"the row GEMV takes x of [1, K] (one row), got {list(x.shape)}")
    if weight.dim() != 2:
        raise ValueError(f"the row GEMV takes a weight [N, K], got {list(weight.shape)}")
    n, k = weight.shape
    if n == 0 or k == 0:
        raise ValueError(
            f"the row GEMV takes a weight of at least one row and column, got [{n}, {k}]"
        )
    int4 = weight.dtype == torch.uint8
    if int4:
        k *= 2  # two weights a byte
        bad = scales is None or scales.dim() != 3 or scales.shape[1:] != (n, 2)
        if bad or scales.shape[0] == 0:
            raise ValueError(
                f"the row GEMV takes int4 nibbles [{n}, {k // 2}] with scales and zeros of "
                f"[K/group, {n}, 2], got {None if scales is None else list(scales.shape)}"
            )
        group = int4_group(weight, scales)
        if group * scales.shape[0] != k or group < 8 or group & (group - 1):
            raise ValueError(
                f"the row GEMV's int4 groups must split K={k} into a power of two "
                f"channels (8 or more) each, got {scales.shape[0]} groups"
            )
    width = 2 * k if silu_mul else k
    if x_tail is not None:
        if norm_weight is not None or silu_mul:
            raise ValueError(
                "the row GEMV reads x in two parts (x_tail) only without a norm or SiLU-and-mul"
            )
        if x_tail.dim() != 2 or x_tail.shape[0] != 1 or x.shape[1] + x_tail.shape[1] != k:
            raise ValueError(
                f"the row GEMV's weight [{n}, {k}] takes x [1, K1] and x_tail [1, {k} - K1], "
                f"got {list(x.shape)} and {list(x_tail.shape)}"
            )
    elif x.shape[1] != width:
        raise ValueError(
            f"the row GEMV's weight [{n}, {k}] takes x of [1, {width}]"
            f"{' (gate and up)' if silu_mul else ''}, got {list(x.shape)}"
        )
    if weight.dtype not in (torch.int8, torch.uint8) and not weight.dtype.is_floating_point:
        raise ValueError(
            f"the row GEMV reads float, int8 or int4 (uint8 nibbles) weights, got {weight.dtype}"
        )
    if (weight.dtype in (torch.int8, torch.uint8)) != (scales is not None):
        raise ValueError("the row GEMV takes scales with an int8 or int4 weight, and only then")
    if (norm_weight is not None) + silu_mul + (gelu_from >= 0) > 1:
        raise ValueError(
            "the row GEMV applies one prologue: a norm (RMSNorm or LayerNorm), SiLU-and-mul or GELU"
        )
    if layer_norm and norm_weight is None:
        raise ValueError("the row GEMV's LayerNorm takes its weight (norm_weight)")
    if norm_bias is not None and not layer_norm:
        raise ValueError("the row GEMV takes a norm's bias with its LayerNorm only")
    if not -1 <= gelu_from < k:
        raise ValueError(
            f"the row GEMV's GELU starts within K={k} (or -1: none), got channel {gelu_from}"
        )
    if not -1 <= gelu_out_from < n:
        raise ValueError(
            f"the row GEMV's GELU on its outputs starts within N={n} (or -1: none), "
            f"got output {gelu_out_from}"
        )
    if not weight.is_contiguous():
        raise ValueError("the row GEMV reads a contiguous weight (call .contiguous() once)")
    sizes = {"bias": (bias, n), "residual": (residual, n)}
    if not int4:
        sizes["scales"] = (scales, n)
    sizes["norm_weight"] = (norm_weight, k)
    sizes["norm_bias"] = (norm_bias, k)
    for name, (t, size) in sizes.items():
        if t is not None and t.numel() != size:
            raise ValueError(f"the row GEMV takes {name} of {size} values, got {list(t.shape)}")

    def flat(t: Vector) -> Vector:
        return None if t is None else t.reshape(-1).contiguous()

    vectors = (flat(scales), flat(bias), flat(norm_weight), flat(residual), flat(norm_bias))
    return (x.contiguous(), *vectors, None if x_tail is None else x_tail.contiguous())
