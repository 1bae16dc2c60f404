"""Weight-only GEMV for decode rows: int8 (per-row scale) and int4 (per-group scale and
zero) weights read once, at the width they are stored in.

A decode step multiplies a few rows (one token per sequence) by every weight matrix, so
its time is the bytes of the weights over the memory bandwidth. Reading int8 or int4
weights only pays if the kernel keeps that pace while it widens each weight to fp32;
Inductor's fused cast did not (1.2-1.7 TB/s on the H200, docs/perf-notes.md attempt 9),
nor does PyTorch's tinygemm for int4 (0.9-1.5 TB/s, attempt 23).

One program owns ``block_n`` output channels and walks K in tiles of ``block_k``,
accumulating ``x * w`` element-wise in fp32 registers and reducing once at the end (no
cross-thread reduction inside the loop). The widening avoids the integer-to-float
conversion instruction, which Hopper issues at a quarter of the FMA rate and which would
bound the kernel below the memory rate: a byte ``u`` becomes ``float(0x4B000000 | u)``
(2**23 + u exactly, one bitwise op), minus a constant. For int8 the byte's sign bit is
flipped first (``u ^ 0x80`` is ``q + 128``), both in one XOR with ``0x4B000080``.

- ``int8_gemv(x [M, K], weight int8 [N, K], scales [N], bias [N] | None) -> [M, N]``:
  ``(x @ weight.T) * scales + bias``, accumulated in fp32, rounded once.
- ``int4_gemv(x, nibbles uint8 [N, K/2], scales_zeros [K/group, N, 2], group, bias)``:
  the weight ``(q - 8) * scale + zero`` of models/quant.py's layout (channel 2j in a
  byte's high nibble, 2j+1 in its low); one group a tile.

Rows are at most ``MAX_ROWS`` (decode); a prompt pass keeps the cast and the GEMM. The
ops are registered at import (torch.library's triton_op imports Triton and Dynamo), so
only the quantized layers of a CUDA model import this module. Their parity tests run in
Triton's interpreter (tests/_gemv_child.py); their speed is benchmarks/quant_gemv.py's.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import torch
from torch.library import triton_op, wrap_triton

# Triton's kernels read ``tl`` from this module's globals; _kernels() sets it.
tl: Any = None

MAX_ROWS = 4
# 2**23 as fp32 bits: OR-ing a byte u into its mantissa gives the float 2**23 + u. The
# kernels spell these out (Triton reads a module global only if it is a constexpr).
MAGIC_BITS = 0x4B000000
MAGIC = 8388608.0


@dataclass(frozen=True)
class GemvLaunch:
    """A program's tile: ``block_n`` output channels by ``block_k`` input channels."""

    block_n: int
    block_k: int
    num_warps: int = 4


def _pow2_divisor(k: int, cap: int) -> int:
    """The largest power of two up to ``cap`` dividing ``k`` (at least 16)."""
    b = cap
    while b > 16 and k % b:
        b //= 2
    return b


def int8_launch(rows: int, n: int, k: int) -> GemvLaunch:
    """The int8 kernel's tile for ``rows`` x [n, k]: about 8 KB of weights a loop step
    (enough loads in flight per thread), a block_k that divides k where one does (no
    masks on the loads), and more programs for narrow outputs (fills the SMs).
    benchmarks/quant_gemv.py sweeps the alternatives."""
    block_k = _pow2_divisor(k, 512)
    block_n = max(1, 8192 // block_k // _pow2(rows))
    if n // block_n < 512:
        block_n = max(1, block_n // 2)
    return GemvLaunch(block_n=block_n, block_k=block_k, num_warps=4)


def int4_launch(rows: int, n: int, group: int) -> GemvLaunch:
    """The int4 kernel's tile: one group of input channels a loop step (its scale and
    zero are one vector), ``block_n`` rows of packed bytes, about 4 KB a step."""
    block_n = max(1, 8192 // group // _pow2(rows))
    if n // block_n < 512:
        block_n = max(1, block_n // 2)
    return GemvLaunch(block_n=block_n, block_k=group, num_warps=4)


def _pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


@functools.cache
def _kernels() -> tuple[Any, Any]:
    """(int8, int4), Triton-compiled on first use.

    Each row of x has an accumulator of its own, [BLOCK_N, BLOCK_K] in fp32 (up to
    MAX_ROWS, spelled out: Triton keeps no list of tensors across a loop), so the weight
    tile loaded once serves every row and all tensors stay 2-D: a 3-D [rows, N, K] tile
    moved x between layouts through shared memory on every step (2.3 TB/s at best).
    """
    # The kernels find tl and their helpers among this module's globals, as Triton looks
    # names up (not in this function's closure).
    global tl, _store_row, _int4_row
    import triton
    import triton.language

    tl = triton.language

    @triton.jit
    def _store_row(acc, row, rn, nmask, scale, BIAS, Y, stride_ym, HAS_BIAS: tl.constexpr):
        y = tl.sum(acc, axis=1) * scale
        if HAS_BIAS:
            y += tl.load(BIAS + rn, mask=nmask, other=0.0).to(tl.float32)
        tl.store(Y + row * stride_ym + rn, y.to(Y.dtype.element_ty), mask=nmask)

    @triton.jit
    def _int8(
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
                # W is read as uint8: u ^ 0x80 = q + 128, OR-ed into 2**23's mantissa.
                bits = w.to(tl.int32) ^ 0x4B000080  # MAGIC_BITS | 0x80
                wf = bits.to(tl.float32, bitcast=True) - 8388736.0  # MAGIC + 128
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

    @triton.jit
    def _int4_row(acc, x_ptrs, w_hi, w_lo):
        x_hi = tl.load(x_ptrs).to(tl.float32)
        x_lo = tl.load(x_ptrs + 1).to(tl.float32)
        return acc + x_hi[None, :] * w_hi + x_lo[None, :] * w_lo

    @triton.jit
    def _int4(
        X, P, SZ, BIAS, Y, N, K, stride_xm, stride_ym,
        M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP: tl.constexpr, HAS_BIAS: tl.constexpr,
    ):  # fmt: skip
        HALF: tl.constexpr = GROUP // 2
        rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        rj = tl.arange(0, HALF)  # byte j of a group holds channels 2j (high) and 2j+1
        nmask = rn < N
        p_ptrs = P + rn.to(tl.int64)[:, None] * (K // 2) + rj[None, :]
        x_ptrs = X + 2 * rj
        sz_ptrs = SZ + rn * 2
        acc0 = tl.zeros([BLOCK_N, HALF], tl.float32)
        acc1 = tl.zeros([BLOCK_N, HALF], tl.float32)
        acc2 = tl.zeros([BLOCK_N, HALF], tl.float32)
        acc3 = tl.zeros([BLOCK_N, HALF], tl.float32)
        for _g in range(0, K // GROUP):
            u = tl.load(p_ptrs, mask=nmask[:, None], other=0).to(tl.int32)
            scale = tl.load(sz_ptrs, mask=nmask, other=0.0).to(tl.float32)[:, None]
            zero = tl.load(sz_ptrs + 1, mask=nmask, other=0.0).to(tl.float32)[:, None]
            # q - 8 for each nibble: MAGIC_BITS | q, as a float, less MAGIC + 8.
            hi = ((u >> 4) | 0x4B000000).to(tl.float32, bitcast=True) - 8388616.0
            lo = ((u & 15) | 0x4B000000).to(tl.float32, bitcast=True) - 8388616.0
            w_hi = hi * scale + zero
            w_lo = lo * scale + zero
            acc0 = _int4_row(acc0, x_ptrs, w_hi, w_lo)
            if M > 1:
                acc1 = _int4_row(acc1, x_ptrs + stride_xm, w_hi, w_lo)
            if M > 2:
                acc2 = _int4_row(acc2, x_ptrs + 2 * stride_xm, w_hi, w_lo)
            if M > 3:
                acc3 = _int4_row(acc3, x_ptrs + 3 * stride_xm, w_hi, w_lo)
            p_ptrs += HALF
            x_ptrs += GROUP
            sz_ptrs += 2 * N
        one = tl.full([BLOCK_N], 1.0, tl.float32)
        _store_row(acc0, 0, rn, nmask, one, BIAS, Y, stride_ym, HAS_BIAS)
        if M > 1:
            _store_row(acc1, 1, rn, nmask, one, BIAS, Y, stride_ym, HAS_BIAS)
        if M > 2:
            _store_row(acc2, 2, rn, nmask, one, BIAS, Y, stride_ym, HAS_BIAS)
        if M > 3:
            _store_row(acc3, 3, rn, nmask, one, BIAS, Y, stride_ym, HAS_BIAS)

    return _int8, _int4


def _rows(x: torch.Tensor) -> torch.Tensor:
    if x.dim() != 2 or x.shape[0] > MAX_ROWS:
        raise ValueError(f"the weight-only GEMV takes [rows <= {MAX_ROWS}, K], got {list(x.shape)}")
    return x if x.stride(-1) == 1 else x.contiguous()


def launch_int8(
    x: torch.Tensor,
    weight: torch.Tensor,
    scales: torch.Tensor,
    bias: torch.Tensor | None,
    cut: GemvLaunch,
    magic_cast: bool = True,
) -> torch.Tensor:
    """The int8 kernel with an explicit tile (the op's body; the benchmark's sweep)."""
    x = _rows(x)
    m, k = x.shape
    n = weight.shape[0]
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    int8, _ = _kernels()
    # Read as bytes: the magic cast flips the sign bit itself.
    w = weight.view(torch.uint8) if magic_cast else weight
    wrap_triton(int8)[(-(-n // cut.block_n),)](
        x, w, scales, bias if bias is not None else scales, y, n, k, x.stride(0), y.stride(0),
        M=m, BLOCK_N=cut.block_n, BLOCK_K=cut.block_k,
        EVEN_K=k % cut.block_k == 0, HAS_BIAS=bias is not None, MAGIC_CAST=magic_cast,
        num_warps=cut.num_warps,
    )  # fmt: skip
    return y


def launch_int4(
    x: torch.Tensor,
    nibbles: torch.Tensor,
    scales_zeros: torch.Tensor,
    group: int,
    bias: torch.Tensor | None,
    cut: GemvLaunch,
) -> torch.Tensor:
    """The int4 kernel with an explicit tile (``cut.block_k`` is the group)."""
    x = _rows(x)
    m, k = x.shape
    n = nibbles.shape[0]
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    _, int4 = _kernels()
    wrap_triton(int4)[(-(-n // cut.block_n),)](
        x, nibbles, scales_zeros, bias if bias is not None else scales_zeros, y, n, k,
        x.stride(0), y.stride(0), M=m, BLOCK_N=cut.block_n, GROUP=group,
        HAS_BIAS=bias is not None, num_warps=cut.num_warps,
    )  # fmt: skip
    return y


# Registered at import: Dynamo must meet a registered op, and refuses to register one
# from inside a function it traces.
@triton_op("acache::int8_gemv", mutates_args=())
def int8_gemv(
    x: torch.Tensor, weight: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """x [M <= MAX_ROWS, K]; weight int8 [N, K]; scales [N]; bias [N] or None -> [M, N]."""
    cut = int8_launch(x.shape[0], weight.shape[0], weight.shape[1])
    return launch_int8(x, weight, scales, bias, cut)


@triton_op("acache::int4_gemv", mutates_args=())
def int4_gemv(
    x: torch.Tensor,
    nibbles: torch.Tensor,
    scales_zeros: torch.Tensor,
    group: int,
    bias: torch.Tensor | None,
) -> torch.Tensor:
    """x [M <= MAX_ROWS, K]; nibbles uint8 [N, K/2]; scales_zeros [K/group, N, 2] -> [M, N]."""
    cut = int4_launch(x.shape[0], nibbles.shape[0], group)
    return launch_int4(x, nibbles, scales_zeros, group, bias, cut)
