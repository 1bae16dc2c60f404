"""One decode row times one weight matrix, with what surrounds the matmul in a block
folded in: acache's own GEMV, for bf16/fp16/fp32, int8 (per-row scale) or int4
(group-wise) weights.

A decode step at batch 1 multiplies one token by every weight matrix, so its time is the
bytes of the weights over the memory bandwidth. Inductor's GEMVs reach ~4 TB/s alone on
an H200, but in a model Inductor fuses the RMSNorm (or SiLU-and-mul) before a projection
into the reduction and falls to ~2.8 TB/s, and cuBLAS's GEMVs leave each norm a kernel
of its own (docs/perf-notes.md, attempts 30 and 34). This kernel does both jobs in one
pass over the weights:

- ``norm_weight`` (RMSNorm prologue): ``W @ rmsnorm(x)``. Each program reads all of x,
  so it accumulates ``sum(x**2)`` beside ``sum(w * g * x)`` in the same loop and scales
  the dot product by ``rsqrt(mean(x**2) + eps)`` at the end: one pass, no second read of
  x and no kernel for the norm. (Rounding: transformers rounds ``x * rstd`` to the
  activation dtype before the norm's weight; here it stays fp32, as Inductor's fused
  norms do.)
- ``layer_norm`` (LayerNorm prologue, phi-2's): ``W @ layernorm(x)``. A LayerNorm
  centres x, so each program first reads all of x once more (cached; in one load up to
  ``LN_ONE_LOAD_MAX`` values, two passes beyond) for its mean and the variance of the
  centred values, then normalizes each tile of x as it goes: 5% over the same GEMV
  without the prologue on phi-2's in-projection (docs/perf-notes.md, attempt 62).
  ``gemv_tiles.LN_EARLY_TILE`` (off: not yet timed on a GPU, attempt 76) issues the
  first weight tile's load before the statistics over float and int8 weights, so that
  its latency would pass under theirs.
- ``gelu_from``: tanh's GELU on x's channels from that one on (a GEMV whose input is
  fc1's output before its GELU; every program computes it for all of x).
- ``gelu_out_from``: tanh's GELU on the outputs from that one on, after the bias: phi-2's
  in-projection applies fc1's GELU here, once a value, so that ``[dense | fc2]`` (or fc2
  alone, quantized) reads it with no prologue (models/phi2.py, attempt 76).
- ``x_tail``: x's channels past ``x``'s own width read from a tensor of their own, so
  that ``[attention | fc1]`` reaches the fused ``[dense | fc2]`` without a concatenation
  kernel (phi-2's one-row step, models/phi2.py). Without a norm or SiLU-and-mul only.
- ``silu_mul``: x is ``[gate | up]`` (a fused gate/up projection's output, 2K wide) and
  the product is ``W @ (silu(gate) * up)``.
- ``residual``: ``residual + W @ x``, the block's skip connection, rounded as eager
  rounds it (the product to the output dtype first).
- ``scales`` (int8 weights): ``(W @ x) * scales``.
- int4 weights (models/quant.py's int4wo: uint8 nibbles [N, K/2], channel 2j in the
  high half, and ``scales`` [K/group, N, 2] holding each group's scale and zero):
  ``W = (q - 8) * scale + zero`` per element, a nibble widened by the same magic-number
  cast. Each group's scale and zero are applied once a loop step, to the sum of its
  products (docs/perf-notes.md, attempt 58): 1.06-1.39 TB/s of nibbles on an H100,
  where tinygemm's kernel (the int4wo default) reads 1.35-1.92 TB/s; the row GEMV's int4
  path is opt-in.

One program owns ``block_n`` output channels and walks K in tiles of ``block_k``,
accumulating ``x * w`` element-wise in fp32 registers and reducing once at the end (no
cross-thread reduction inside the loop). int8 weights are widened without the
integer-to-float conversion instruction, which Hopper issues at a quarter of the FMA
rate and which would bound the kernel below the memory rate: a byte ``u`` becomes
``float(0x4B000000 | u)`` (2**23 + u exactly), minus a constant, with the byte's sign
bit flipped first (``u ^ 0x80`` is ``q + 128``). On a GPU that is inline PTX four bytes
at a time (one XOR of the word, one byte permute a weight: ``INT8_WIDEN_PTX``); Triton's
interpreter runs it a byte at a time (one XOR with ``0x4B000080``).

One row only: with four rows' accumulators the int8 kernel ran at half bf16's speed
(attempt 30), where cuBLAS's GEMM wins; several rows take the plain layers. The op is a
``triton_op``, so aoti compiles it into the .so and Inductor fuses nothing into it. It
is registered at import (torch.library's triton_op imports Triton and Dynamo), so only
CUDA models import this module (models/rows.py). Its parity tests run in Triton's
interpreter (tests/_gemv_child.py); its speed is benchmarks/row_gemv.py's.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.library import triton_op, wrap_triton

from . import gemv_tiles
from .gemv_inputs import Vector, checked_inputs, int4_group
from .gemv_tiles import GemvLaunch, gemv_launch, ln_block, prologue_kind
from .lazy_kernels import interpreting, kernel_getattr, once

# Set by _define_kernels(): Triton (a CUDA build of torch's dependency, not acache's) is
# imported when a kernel is first needed, so importing this module never needs it.
tl: Any = None


# Four int8 weights (one register, $4; with pack=4, element i is byte i) into four
# registers ($i for element i) holding the fp32 bits of 2**23 + 128 + q: one XOR flips
# the four sign bits (u ^ 0x80 = q + 128), then one byte permute each puts byte i under
# 2**23's exponent bits (selector 0x765i: byte i of t, then bytes 1-3 of 0x4B000000).
# Five instructions for four weights where the byte-at-a-time form takes eight (a
# zero-extend and an XOR each): the loop compiles to 4.2 instructions a weight against
# 4.9 (docs/perf-notes.md attempt 64).
INT8_WIDEN_PTX = (
    "{ .reg .b32 t; xor.b32 t, $4, 0x80808080;"
    " prmt.b32 $0, t, 0x4B000000, 0x7650; prmt.b32 $1, t, 0x4B000000, 0x7651;"
    " prmt.b32 $2, t, 0x4B000000, 0x7652; prmt.b32 $3, t, 0x4B000000, 0x7653; }"
)


@once
def _define_kernels() -> None:
    """Define the kernel as this module's global (models/lazy_kernels.py says why; a
    kernel local to a function failed an inductor build)."""
    global tl, _row_gemv, _x_tile, _w_tile, _w_dot, _gelu, _INT8_WIDEN_PTX
    import triton
    import triton.language

    tl = triton.language
    _INT8_WIDEN_PTX = tl.constexpr(INT8_WIDEN_PTX)

    @triton.jit
    def _gelu(x):
        """tanh's GELU (transformers' gelu_new) of fp32 x: 0.5 x (1 + tanh(z)) = x / (1 +
        e^-2z)."""
        z = 0.7978845608028654 * (x + 0.044715 * x * x * x)
        return x / (1.0 + tl.exp(-2.0 * z))

    @triton.jit
    def _x_tile(
        X, G, NB, K, offs, kmask, mean, rstd, gelu_from, XT, x_split,
        NORM: tl.constexpr, LAYER_NORM: tl.constexpr, HAS_NORM_BIAS: tl.constexpr,
        SILU_MUL: tl.constexpr, GELU: tl.constexpr, HAS_TAIL: tl.constexpr,
    ):  # fmt: skip
        """x at ``offs`` after the prologue (in fp32), and its squares before the norm's
        weight (the RMSNorm's sum); with HAS_TAIL, channels from ``x_split`` on are XT's."""
        # x is read by every program: keep it cached.
        if HAS_TAIL:
            head = offs < x_split
            x = tl.load(X + offs, mask=kmask & head, other=0.0, eviction_policy="evict_last")
            tail = tl.load(XT + (offs - x_split), mask=kmask & ~head, other=0.0,
                           eviction_policy="evict_last")  # fmt: skip
            x = tl.where(head, x, tail)
        else:
            x = tl.load(X + offs, mask=kmask, other=0.0, eviction_policy="evict_last")
        x = x.to(tl.float32)
        if SILU_MUL:
            up = tl.load(X + K + offs, mask=kmask, other=0.0).to(tl.float32)
            x = x / (1.0 + tl.exp(-x)) * up
        if GELU:
            x = tl.where(offs >= gelu_from, _gelu(x), x)
        squares = x * x
        if LAYER_NORM:
            x = (x - mean) * rstd * tl.load(G + offs, mask=kmask, other=0.0).to(tl.float32)
            if HAS_NORM_BIAS:
                x += tl.load(NB + offs, mask=kmask, other=0.0).to(tl.float32)
        elif NORM:
            x *= tl.load(G + offs, mask=kmask, other=0.0).to(tl.float32)
        return x, squares

    @triton.jit
    def _w_tile(
        acc, squares, w_row, nmask, kmask, X, G, NB, K, offs, mean, rstd, gelu_from,
        NORM: tl.constexpr, LAYER_NORM: tl.constexpr, HAS_NORM_BIAS: tl.constexpr,
        SILU_MUL: tl.constexpr, GELU: tl.constexpr, INT8: tl.constexpr,
        INT8_PTX: tl.constexpr,
    ):  # fmt: skip
        """One K tile of float or int8 weights (rows ``w_row``, channels ``offs``) times x
        after the prologue, added to ``acc`` (and the RMSNorm's squares)."""
        # Weights are read once: evict them first.
        w = tl.load(
            w_row + offs[None, :], mask=nmask[:, None] & kmask[None, :], other=0,
            eviction_policy="evict_first",
        )  # fmt: skip
        return _w_dot(
            acc, squares, w, kmask, X, G, NB, K, offs, mean, rstd, gelu_from,
            NORM, LAYER_NORM, HAS_NORM_BIAS, SILU_MUL, GELU, INT8, INT8_PTX,
        )  # fmt: skip

    @triton.jit
    def _w_dot(
        acc, squares, w, kmask, X, G, NB, K, offs, mean, rstd, gelu_from,
        NORM: tl.constexpr, LAYER_NORM: tl.constexpr, HAS_NORM_BIAS: tl.constexpr,
        SILU_MUL: tl.constexpr, GELU: tl.constexpr, INT8: tl.constexpr,
        INT8_PTX: tl.constexpr,
    ):  # fmt: skip
        """_w_tile's product of a loaded tile ``w``."""
        if INT8:
            # W is read as uint8: u ^ 0x80 = q + 128, OR-ed into 2**23's mantissa
            # (0x4B000000, 2**23's fp32 bits); the float is then 2**23 + 128 + q.
            # Literals: Triton reads a module global only if it is a constexpr.
            if INT8_PTX:  # the same bits, four bytes a register at a time
                bits = tl.inline_asm_elementwise(
                    asm=_INT8_WIDEN_PTX, constraints="=r,=r,=r,=r,r", args=[w],
                    dtype=tl.int32, is_pure=True, pack=4,
                )  # fmt: skip
            else:
                bits = w.to(tl.int32) ^ 0x4B000080
            wf = bits.to(tl.float32, bitcast=True) - 8388736.0  # 2**23 + 128
        else:
            wf = w.to(tl.float32)
        x, sq = _x_tile(
            X, G, NB, K, offs, kmask, mean, rstd, gelu_from, X, 0,
            NORM, LAYER_NORM, HAS_NORM_BIAS, SILU_MUL, GELU, False,
        )  # fmt: skip
        if NORM:
            squares += sq
        return acc + x[None, :] * wf, squares

    @triton.jit
    def _row_gemv(
        X, W, S, BIAS, G, NB, R, Y, N, K, eps, gelu_from, XT, x_split, gelu_out_from,
        BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr,
        INT8: tl.constexpr, INT4_GROUP: tl.constexpr, TILE_GROUPS: tl.constexpr,
        HAS_BIAS: tl.constexpr,
        NORM: tl.constexpr, LAYER_NORM: tl.constexpr, HAS_NORM_BIAS: tl.constexpr,
        SILU_MUL: tl.constexpr, GELU: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
        LN_BLOCK: tl.constexpr, INT8_PTX: tl.constexpr, STAGES: tl.constexpr,
        HAS_TAIL: tl.constexpr, EARLY_TILE: tl.constexpr, GELU_OUT: tl.constexpr,
    ):  # fmt: skip
        rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        nmask = rn < N
        mean = 0.0
        rstd = 1.0
        if EARLY_TILE:
            # The first weight tile's load goes out before the LayerNorm's statistics,
            # so its latency passes under theirs instead of after them.
            rk0 = tl.arange(0, BLOCK_K)
            w_first = tl.load(
                W + rn.to(tl.int64)[:, None] * K + rk0[None, :],
                mask=nmask[:, None] & (rk0 < K)[None, :], other=0,
                eviction_policy="evict_first",
            )  # fmt: skip
        if LAYER_NORM:
            # A LayerNorm centres x first: its mean, then the variance of the centred
            # values (no cancellation). Every program does this before its first weight,
            # so x comes in one load where it fits (LN_BLOCK >= K: one trip to the cache)
            # and in two short passes of BLOCK_K otherwise.
            if LN_BLOCK > 0:
                rx = tl.arange(0, LN_BLOCK)
                xv = tl.load(X + rx, mask=rx < K, other=0.0).to(tl.float32)
                mean = tl.sum(xv, axis=0) / K
                centred = tl.where(rx < K, xv - mean, 0.0)
                var = tl.sum(centred * centred, axis=0) / K
            else:
                rx = tl.arange(0, BLOCK_K)
                total = tl.zeros([BLOCK_K], tl.float32)
                for k0 in range(0, K, BLOCK_K):
                    total += tl.load(X + k0 + rx, mask=k0 + rx < K, other=0.0).to(tl.float32)
                mean = tl.sum(total, axis=0) / K
                total = tl.zeros([BLOCK_K], tl.float32)
                for k0 in range(0, K, BLOCK_K):
                    xv = tl.load(X + k0 + rx, mask=k0 + rx < K, other=0.0).to(tl.float32)
                    total += tl.where(k0 + rx < K, (xv - mean) * (xv - mean), 0.0)
                var = tl.sum(total, axis=0) / K
            # fp32: Inductor passes a float argument such as eps as fp64.
            rstd = tl.rsqrt(var + eps).to(tl.float32)
        if INT4_GROUP > 0:
            # Nibbles [N, K/2], channel 2j in byte j's high half and 2j+1 in its low
            # half; S holds [K/group, N, 2] scales and zeros. A tile covers TILE_GROUPS
            # groups (or part of one), SUB channels of each a row. W = (u - 8) * scale +
            # zero, so a group's share of the product is scale * dot(u, x) + (zero - 8 *
            # scale) * sum(x): the loop multiplies nibbles by x alone, and each group's
            # scale and zero come after.
            SUB: tl.constexpr = BLOCK_K // TILE_GROUPS
            gi = tl.arange(0, TILE_GROUPS)
            rj = tl.arange(0, SUB // 2)
            KB = K // 2
            if INT4_GROUP >= 32:  # K is a multiple of 32: the byte rows are 16-aligned
                KB = tl.multiple_of(KB, 16)
            rows = rn.to(tl.int64)
            w_ptrs = W + rows[:, None, None] * KB + (gi[:, None] * (SUB // 2) + rj[None, :])[None]
            rk = gi[:, None] * SUB + tl.arange(0, SUB)[None, :]
            acc = tl.zeros([BLOCK_N, TILE_GROUPS], tl.float32)
            squares = tl.zeros([TILE_GROUPS, SUB], tl.float32)
            for k0 in range(0, K, BLOCK_K):
                g = k0 // INT4_GROUP + gi
                gmask = nmask[:, None]
                if not EVEN_K:
                    gmask = gmask & (g < K // INT4_GROUP)[None, :]
                b = tl.load(
                    w_ptrs, mask=gmask[:, :, None], other=0, eviction_policy="evict_first"
                ).to(tl.int32)
                # A nibble masked in place and OR-ed into 2**23's mantissa is the float
                # 2**23 + u * 2**p exactly (no int-to-float instruction); one FMA makes it u.
                hi = ((b & 0xF0) | 0x4B000000).to(tl.float32, bitcast=True) * 0.0625 - 524288.0
                lo = ((b & 0x0F) | 0x4B000000).to(tl.float32, bitcast=True) - 8388608.0
                u = tl.interleave(hi, lo)  # channels in order: 2j high, 2j + 1 low
                x, sq = _x_tile(
                    X, G, NB, K, k0 + rk, (k0 + rk) < K, mean, rstd, gelu_from, XT, x_split,
                    NORM, LAYER_NORM, HAS_NORM_BIAS, SILU_MUL, GELU, HAS_TAIL,
                )  # fmt: skip
                if NORM:
                    squares += sq
                sz = S + g[None, :].to(tl.int64) * N * 2 + rows[:, None] * 2
                scale = tl.load(sz, mask=gmask, other=0.0).to(tl.float32)
                zero = tl.load(sz + 1, mask=gmask, other=0.0).to(tl.float32)
                dots = tl.sum(u * x[None], axis=2)
                acc += dots * scale + (zero - 8.0 * scale) * tl.sum(x, axis=1)[None, :]
                w_ptrs += BLOCK_K // 2
            squares = tl.sum(squares, axis=1)
        else:
            rk = tl.arange(0, BLOCK_K)
            w_row = W + rn.to(tl.int64)[:, None] * K
            acc = tl.zeros([BLOCK_N, BLOCK_K], tl.float32)
            squares = tl.zeros([BLOCK_K], tl.float32)
            # STAGES > 1: Triton's pipeliner keeps that many steps' loads in flight
            # (copied through shared memory).
            if HAS_TAIL:
                # x in two spans, each a plain loop with one load of x a tile: channels
                # below x_split from X (the span's last tile masked at x_split), the rest
                # from XT, indexed from x_split (its tiles start there).
                for k0 in tl.range(0, x_split, BLOCK_K, num_stages=STAGES):
                    acc, squares = _w_tile(
                        acc, squares, w_row, nmask, (k0 + rk) < x_split, X, G, NB, K,
                        k0 + rk, mean, rstd, gelu_from, NORM, LAYER_NORM, HAS_NORM_BIAS,
                        SILU_MUL, GELU, INT8, INT8_PTX,
                    )  # fmt: skip
                for k0 in tl.range(x_split, K, BLOCK_K, num_stages=STAGES):
                    acc, squares = _w_tile(
                        acc, squares, w_row, nmask, (k0 + rk) < K, XT - x_split, G, NB, K,
                        k0 + rk, mean, rstd, gelu_from, NORM, LAYER_NORM, HAS_NORM_BIAS,
                        SILU_MUL, GELU, INT8, INT8_PTX,
                    )  # fmt: skip
            else:
                if EARLY_TILE:
                    acc, squares = _w_dot(
                        acc, squares, w_first, rk < K, X, G, NB, K, rk, mean, rstd,
                        gelu_from, NORM, LAYER_NORM, HAS_NORM_BIAS, SILU_MUL, GELU, INT8,
                        INT8_PTX,
                    )  # fmt: skip
                    first = BLOCK_K
                else:
                    first = 0
                for k0 in tl.range(first, K, BLOCK_K, num_stages=STAGES):
                    if EVEN_K:
                        kmask = rk < BLOCK_K
                    else:
                        kmask = (k0 + rk) < K
                    acc, squares = _w_tile(
                        acc, squares, w_row, nmask, kmask, X, G, NB, K, k0 + rk, mean, rstd,
                        gelu_from, NORM, LAYER_NORM, HAS_NORM_BIAS, SILU_MUL, GELU, INT8,
                        INT8_PTX,
                    )  # fmt: skip
        y = tl.sum(acc, axis=1)
        if NORM:
            y *= tl.rsqrt(tl.sum(squares, axis=0) / K + eps).to(tl.float32)
        if INT8:
            y *= tl.load(S + rn, mask=nmask, other=0.0).to(tl.float32)
        if HAS_BIAS:
            y += tl.load(BIAS + rn, mask=nmask, other=0.0).to(tl.float32)
        if GELU_OUT:
            # tanh's GELU on the outputs from gelu_out_from on (phi-2's fc1 part of
            # [q; k; v; fc1]): once an output here, not once a program of the GEMV that
            # reads them; on the product rounded to the output dtype first, as eager
            # rounds fc1's output before its GELU
            y = tl.where(rn >= gelu_out_from, _gelu(y.to(Y.dtype.element_ty).to(tl.float32)), y)
        if HAS_RESIDUAL:
            # Eager rounds the projection to the activation dtype, then adds.
            y = y.to(Y.dtype.element_ty).to(tl.float32)
            y += tl.load(R + rn, mask=nmask, other=0.0).to(tl.float32)
        tl.store(Y + rn, y.to(Y.dtype.element_ty), mask=nmask)


__getattr__ = kernel_getattr(
    __name__, ("_row_gemv", "_x_tile", "_w_tile", "_w_dot", "_gelu"), _define_kernels
)


def launch_gemv(
    x: torch.Tensor,
    weight: torch.Tensor,
    scales: Vector = None,
    bias: Vector = None,
    norm_weight: Vector = None,
    eps: float = 0.0,
    silu_mul: bool = False,
    residual: Vector = None,
    cut: GemvLaunch | None = None,
    norm_bias: Vector = None,
    layer_norm: bool = False,
    gelu_from: int = -1,
    x_tail: Vector = None,
    gelu_out_from: int = -1,
) -> torch.Tensor:
    """The kernel with an explicit tile (``cut``; None: gemv_launch's), inputs checked:
    the benchmark's and the tests' entry. Returns [1, N] in x's dtype."""
    x, scales, bias, norm_weight, residual, norm_bias, x_tail = checked_inputs(
        x, weight, scales, bias, norm_weight, silu_mul, residual, norm_bias, layer_norm,
        gelu_from, x_tail, gelu_out_from,
    )  # fmt: skip
    return _launch(
        x, weight, scales, bias, norm_weight, eps, silu_mul, residual, cut,
        norm_bias, layer_norm, gelu_from, x_tail, gelu_out_from,
    )  # fmt: skip


def _launch(*args: Any) -> torch.Tensor:
    """The kernel's launch on inputs checked_inputs has passed (kernel_call's arguments)."""
    grid, kernel_args, consts, y = kernel_call(*args)
    _define_kernels()
    wrap_triton(_row_gemv)[grid](*kernel_args, **consts)
    return y


def kernel_call(
    x: torch.Tensor,
    weight: torch.Tensor,
    scales: Vector,
    bias: Vector,
    norm_weight: Vector,
    eps: float,
    silu_mul: bool,
    residual: Vector,
    cut: GemvLaunch | None,
    norm_bias: Vector,
    layer_norm: bool,
    gelu_from: int,
    x_tail: Vector = None,
    gelu_out_from: int = -1,
) -> tuple[tuple[int], tuple[Any, ...], dict[str, Any], torch.Tensor]:
    """What _launch gives the kernel for these inputs: the grid, the positional
    arguments, the constexprs with ``num_warps``, and the output they write (allocated
    here). Also the benchmarks' way to the kernel's arguments without a launch
    (benchmarks/user_kernel_analysis.py, int4_dot_probe.py --sass-acache)."""
    n, k = weight.shape
    int8 = weight.dtype == torch.int8
    group = 0
    if weight.dtype == torch.uint8:  # int4 nibbles
        k *= 2
        group = int4_group(weight, scales)  # type: ignore[arg-type]
    prologue = prologue_kind(norm_weight is not None, layer_norm, silu_mul, gelu_from)
    cut = cut or gemv_launch(n, k, int8, prologue, int4_group=group)
    if group and (cut.block_k < 8 or cut.block_k & (cut.block_k - 1)):
        raise ValueError(
            f"an int4 row GEMV's block_k must be a power of two of 8 or more, got {cut.block_k}"
        )
    y = torch.empty((1, n), dtype=x.dtype, device=x.device)
    # int8 is read as bytes: the magic cast flips the sign bit itself.
    w = weight.view(torch.uint8) if int8 else weight

    def given(t: Vector) -> torch.Tensor:
        return x if t is None else t  # a pointer the kernel never reads for a variant

    args = (
        x, w, given(scales), given(bias), given(norm_weight), given(norm_bias), given(residual),
        y, n, k, eps, gelu_from, given(x_tail), 0 if x_tail is None else x.shape[1],
        gelu_out_from,
    )  # fmt: skip
    consts = dict(
        BLOCK_N=cut.block_n, BLOCK_K=cut.block_k, EVEN_K=k % cut.block_k == 0, INT8=int8,
        INT4_GROUP=group, TILE_GROUPS=max(1, cut.block_k // max(group, 1)),
        HAS_BIAS=bias is not None, NORM=norm_weight is not None and not layer_norm,
        LAYER_NORM=layer_norm,
        HAS_NORM_BIAS=norm_bias is not None, SILU_MUL=silu_mul, GELU=gelu_from >= 0,
        HAS_RESIDUAL=residual is not None, num_warps=cut.num_warps,
        LN_BLOCK=ln_block(k, layer_norm),
        # Inline PTX where the kernel is compiled for a GPU; Triton's interpreter (which
        # runs no PTX) takes the byte-at-a-time form of the same cast.
        INT8_PTX=int8 and x.device.type == "cuda" and not interpreting(),
        STAGES=cut.stages, HAS_TAIL=x_tail is not None,
        # float and int8 weights (int4's loop reads by groups); read at the call, so that
        # benchmarks/row_gemv.py can time the kernel both ways
        EARLY_TILE=layer_norm and not group and gemv_tiles.LN_EARLY_TILE,
        GELU_OUT=gelu_out_from >= 0,
    )  # fmt: skip
    return (-(-n // cut.block_n),), args, consts, y


# Registered at import: Dynamo must meet a registered op, and refuses to register one
# from inside a function it traces.
@triton_op("acache::row_gemv", mutates_args=())
def row_gemv(
    x: torch.Tensor,
    weight: torch.Tensor,
    scales: torch.Tensor | None,
    bias: torch.Tensor | None,
    norm_weight: torch.Tensor | None,
    eps: float,
    silu_mul: bool,
    residual: torch.Tensor | None,
    norm_bias: torch.Tensor | None = None,
    layer_norm: bool = False,
    gelu_from: int = -1,
    x_tail: torch.Tensor | None = None,
    gelu_out_from: int = -1,
) -> torch.Tensor:
    """x [1, K] ([1, 2K] with silu_mul; [1, K1] with x_tail [1, K - K1]); weight [N, K]
    (float, or int8 with scales [N]), or int4 nibbles uint8 [N, K/2] with scales and
    zeros [K/group, N, 2] in ``scales`` (models/quant.py's int4wo layout); bias,
    residual [N]; norm_weight [K] (an RMSNorm's, or with ``layer_norm`` a LayerNorm's,
    whose bias is norm_bias [K]); ``gelu_from`` >= 0: GELU (tanh) on x's channels from
    there on; ``gelu_out_from`` >= 0: GELU on the outputs from there on -> [1, N] in
    x's dtype (the module docstring)."""
    return launch_gemv(
        x, weight, scales, bias, norm_weight, eps, silu_mul, residual, None,
        norm_bias, layer_norm, gelu_from, x_tail, gelu_out_from,
    )  # fmt: skip
