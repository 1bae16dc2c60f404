"""Weight-only int8 GEMV for a decode row: int8 weights (per-row scale) read once, at
the width they are stored in.

A decode step multiplies one row (one token) by every weight matrix, so its time is the
bytes of the weights over the memory bandwidth. Reading int8 weights only pays if the
kernel keeps that pace while it widens each weight to fp32. Inductor's own GEMV of the
cast does, alone (2.2-3.3 TB/s on the H200), but in a model it fuses the preceding
RMSNorm into that reduction and falls to 1.2-1.7 TB/s (docs/perf-notes.md, attempts 9
and 30); this kernel is an op Inductor cannot fuse into.

One program owns ``block_n`` output channels and walks K in tiles of ``block_k``,
accumulating ``x * w`` element-wise in fp32 registers and reducing once at the end (no
cross-thread reduction inside the loop). The widening avoids the integer-to-float
conversion instruction, which Hopper issues at a quarter of the FMA rate and which would
bound the kernel below the memory rate: a byte ``u`` becomes ``float(0x4B000000 | u)``
(2**23 + u exactly, one bitwise op), minus a constant; the byte's sign bit is flipped
in the same XOR (``u ^ 0x80`` is ``q + 128``): one XOR with ``0x4B000080``.

``int8_gemv(x [M, K], weight int8 [N, K], scales [N], bias [N] | None) -> [M, N]``:
``(x @ weight.T) * scales + bias``, accumulated in fp32, rounded once. The kernel takes
up to ``MAX_ROWS`` rows, but the model calls it for one row only: at 4 rows it ran at
half bf16's speed (benchmarks/quant_gemv.py), where the cast and cuBLAS's GEMM win.

The op is registered at import (torch.library's triton_op imports Triton and Dynamo),
so only int8 layers on CUDA import this module. Its parity tests run in Triton's
interpreter (tests/_gemv_child.py); its speed is benchmarks/quant_gemv.py's. A Triton
int4 kernel of the same shape ran at 0.4-1.2 TB/s, below tinygemm (attempt 30), and
is not kept.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch.library import triton_op, wrap_triton

from .lazy_kernels import kernel_getattr, once

# Set by _define_kernels(): Triton (a CUDA build of torch's dependency, not acache's) is
# imported when a kernel is first needed, so importing this module never needs it.
tl: Any = None

MAX_ROWS = 4


@dataclass(frozen=True)
class GemvLaunch:
    """A program's tile: ``block_n`` output channels by ``block_k`` input channels."""

    block_n: int
    block_k: int
    num_warps: int = 4


def int8_launch(rows: int, n: int, k: int) -> GemvLaunch:
    """The tile for ``rows`` x [n, k]: 1024 input channels a loop step (masked where
    they do not divide k) and 4 output channels a program, 8 for a long k (fewer, longer
    programs), over the rows' accumulators. The best or within 4% of the best of 32
    tiles on each of llama-7b's four shapes at one row (benchmarks/quant_gemv.py
    --sweep, docs/perf-notes.md attempt 30)."""
    block_n = 8 if k > 8192 else 4
    return GemvLaunch(block_n=max(1, block_n // _pow2(rows)), block_k=1024, num_warps=4)


def _pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


@once
def _define_kernels() -> None:
    """Define the kernels as this module's globals (models/lazy_kernels.py says why; a
    kernel local to a function failed an inductor build), where Triton also resolves
    the helper a kernel calls."""
    global tl, _int8_gemv, _store_row
    import triton
    import triton.language

    tl = triton.language

    # Each row of x has an accumulator of its own, [BLOCK_N, BLOCK_K] in fp32 (up to
    # MAX_ROWS, spelled out: Triton keeps no list of tensors across a loop), so the weight
    # tile loaded once serves every row and all tensors stay 2-D. A first version with one
    # 3-D [rows, N, K] accumulator ran at 1.2-2.6 TB/s on llama-7b's shapes, this one at
    # 2.4-3.4 with its best tiles (attempt 30); why was not profiled.

    @triton.jit
    def _store_row(acc, row, rn, nmask, scale, BIAS, Y, stride_ym, HAS_BIAS: tl.constexpr):
        y = tl.sum(acc, axis=1) * scale
        if HAS_BIAS:
            y += tl.load(BIAS + rn, mask=nmask, other=0.0).to(tl.float32)
        tl.store(Y + row * stride_ym + rn, y.to(Y.dtype.element_ty), mask=nmask)

    @triton.jit
    def _int8_gemv(
        X, W, S, BIAS, Y, N, K, stride_xm, stride_ym,
        M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
        EVEN_K: tl.constexpr, HAS_BIAS: tl.constexpr, MAGIC_CAST: tl.constexpr,
    ):  # fmt: skip
        rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        rk = tl.arange(0, BLOCK_K)
        nmask = rn < N
        w_ptrs = W + rn.to(tl.int64)[:, None] * K + rk[None, :]
        x_ptrs = X + rk
        acc0 = tl.zeros([BLOCK_N, BLOCK_K], tl.float32)
        acc1 = tl.zeros([BLOCK_N, BLOCK_K], tl.float32)
        acc2 = tl.zeros([BLOCK_N, BLOCK_K], tl.float32)
        acc3 = tl.zeros([BLOCK_N, BLOCK_K], tl.float32)
        for k0 in range(0, K, BLOCK_K):
            if EVEN_K:
                kmask = rk < BLOCK_K
            else:
                kmask = (k0 + rk) < K
            w = tl.load(w_ptrs, mask=nmask[:, None] & kmask[None, :], other=0)
            if MAGIC_CAST:
                # W is read as uint8: u ^ 0x80 = q + 128, OR-ed into 2**23's mantissa
                # (0x4B000000, 2**23's fp32 bits); the float is then 2**23 + 128 + q.
                # Literals: Triton reads a module global only if it is a constexpr.
                bits = w.to(tl.int32) ^ 0x4B000080
                wf = bits.to(tl.float32, bitcast=True) - 8388736.0  # 2**23 + 128
            else:
                wf = w.to(tl.float32)
            acc0 += tl.load(x_ptrs, mask=kmask, other=0.0).to(tl.float32)[None, :] * wf
            if M > 1:
                x1 = tl.load(x_ptrs + stride_xm, mask=kmask, other=0.0).to(tl.float32)
                acc1 += x1[None, :] * wf
            if M > 2:
                x2 = tl.load(x_ptrs + 2 * stride_xm, mask=kmask, other=0.0).to(tl.float32)
                acc2 += x2[None, :] * wf
            if M > 3:
                x3 = tl.load(x_ptrs + 3 * stride_xm, mask=kmask, other=0.0).to(tl.float32)
                acc3 += x3[None, :] * wf
            w_ptrs += BLOCK_K
            x_ptrs += BLOCK_K
        s = tl.load(S + rn, mask=nmask, other=0.0).to(tl.float32)
        _store_row(acc0, 0, rn, nmask, s, BIAS, Y, stride_ym, HAS_BIAS)
        if M > 1:
            _store_row(acc1, 1, rn, nmask, s, BIAS, Y, stride_ym, HAS_BIAS)
        if M > 2:
            _store_row(acc2, 2, rn, nmask, s, BIAS, Y, stride_ym, HAS_BIAS)
        if M > 3:
            _store_row(acc3, 3, rn, nmask, s, BIAS, Y, stride_ym, HAS_BIAS)


__getattr__ = kernel_getattr(__name__, ("_int8_gemv", "_store_row"), _define_kernels)


def _checked(
    x: torch.Tensor, weight: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """The inputs as the kernel reads them, checked on the host before any launch: a
    ValueError for what it cannot read. x's rows keep their stride; scales and bias
    ([N], cheap) are made contiguous; a strided weight is refused, as a silent copy of
    it would cost its whole size in memory and time on every call."""
    if x.dim() != 2 or not 1 <= x.shape[0] <= MAX_ROWS:
        raise ValueError(
            f"the weight-only GEMV takes x of [1 to {MAX_ROWS} rows, K], got {list(x.shape)}"
        )
    if weight.dim() != 2 or weight.dtype != torch.int8 or weight.shape[1] != x.shape[1]:
        raise ValueError(
            f"the weight-only GEMV takes an int8 weight [N, {x.shape[1]}], "
            f"got {weight.dtype} {list(weight.shape)}"
        )
    if not weight.is_contiguous():
        raise ValueError("the weight-only GEMV reads a contiguous weight (call .contiguous() once)")
    n = weight.shape[0]
    for name, t in (("scales", scales), ("bias", bias)):
        if t is not None and tuple(t.shape) != (n,):
            raise ValueError(f"the weight-only GEMV takes {name} [{n}], got {list(t.shape)}")
    x = x if x.stride(-1) == 1 else x.contiguous()
    return x, scales.contiguous(), None if bias is None else bias.contiguous()


def launch_int8(
    x: torch.Tensor,
    weight: torch.Tensor,
    scales: torch.Tensor,
    bias: torch.Tensor | None,
    cut: GemvLaunch,
    magic_cast: bool = True,
) -> torch.Tensor:
    """The int8 kernel with an explicit tile (the benchmark's sweep), inputs checked."""
    x, scales, bias = _checked(x, weight, scales, bias)
    return _launch(x, weight, scales, bias, cut, magic_cast)


def _launch(
    x: torch.Tensor,
    weight: torch.Tensor,
    scales: torch.Tensor,
    bias: torch.Tensor | None,
    cut: GemvLaunch,
    magic_cast: bool,
) -> torch.Tensor:
    """The kernel's launch on inputs _checked has passed."""
    m, k = x.shape
    n = weight.shape[0]
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    _define_kernels()
    # Read as bytes: the magic cast flips the sign bit itself.
    w = weight.view(torch.uint8) if magic_cast else weight
    wrap_triton(_int8_gemv)[(-(-n // cut.block_n),)](
        x, w, scales, bias if bias is not None else scales, y, n, k, x.stride(0), y.stride(0),
        M=m, BLOCK_N=cut.block_n, BLOCK_K=cut.block_k,
        EVEN_K=k % cut.block_k == 0, HAS_BIAS=bias is not None, MAGIC_CAST=magic_cast,
        num_warps=cut.num_warps,
    )  # fmt: skip
    return y


# Registered at import: Dynamo must meet a registered op, and refuses to register one
# from inside a function it traces.
@triton_op("acache::int8_gemv", mutates_args=())
def int8_gemv(
    x: torch.Tensor, weight: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """x [M <= MAX_ROWS, K]; weight int8 [N, K]; scales [N]; bias [N] or None -> [M, N]
    in x's dtype."""
    x, scales, bias = _checked(x, weight, scales, bias)  # before int8_launch reads the shapes
    cut = int8_launch(x.shape[0], weight.shape[0], weight.shape[1])
    return _launch(x, weight, scales, bias, cut, magic_cast=True)
