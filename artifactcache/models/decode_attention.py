"""Decode attention that reads only the filled part of a static KV cache (split-KV).

One query per row (a decode step) attends to the cache positions ``lo[b] .. p`` of
its row, p = ``input_pos[0]``. The cache keeps its allocated shape, so a step built
on it is static and captures in one CUDA graph, yet its cost follows the used length:
the filled range is cut into ``n_splits`` chunks at run time (flash-decoding), and
each program loops over its chunk's tiles only.

- ``partial``: one program per (row, kv head, chunk) attends all ``n_rep`` query heads
  of the kv head to its chunk, writing an unnormalized sum, a max and a denominator
  per query head. With one chunk (a batch that fills the GPU by itself) it writes the
  output directly, and ``combine`` is not launched.
- ``combine``: one program per (row, query head) merges the chunks.

``lo[b]`` folds the causal mask's other terms (models/common.py's decode_lo): the
row's first real slot, the sliding window, and the padding row that sees only its
own position. So a sliding-window model reads at most its window.

Triton is imported on the first call only (CUDA builds of inductor and aoti);
elsewhere :func:`decode_attention_reference` is the same arithmetic in torch, and
the parity tests (Triton's interpreter) hold the kernel to it and to SDPA.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import torch

# Triton's kernels read ``tl`` from this module's globals; _kernels() sets it, so that
# importing this module costs no Triton import (the CPU package has none of its own).
tl: Any = None

# (row, kv head) programs x chunks the grid aims at: a few programs per SM of an H200.
TARGET_PROGRAMS = 512
MAX_SPLITS = 32


def split_count(pairs: int, slots: int, block_n: int) -> int:
    """Chunks the filled range is cut into, for ``pairs`` (row, kv head) programs."""
    return max(1, min(TARGET_PROGRAMS // pairs, MAX_SPLITS, -(-slots // block_n)))


def tile_rows(rep: int, head_dim: int) -> int:
    """Cache positions a program loads at once: its [rep, tile, head_dim] product stays
    at 8k fp32 values, in registers."""
    return max(16, 8192 // (_next_pow2(rep) * _next_pow2(head_dim)))


def _next_pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


@functools.cache
def _kernels() -> tuple[Any, Any]:
    """(partial, combine), Triton-compiled on first use."""
    global tl
    import triton
    import triton.language

    tl = triton.language

    @triton.jit
    def _partial(
        Q, K, V, LO, POS, M_OUT, L_OUT, ACC_OUT, OUT,
        stride_qb, stride_qh, stride_kb, stride_kh, stride_ks, stride_vb, stride_vh, stride_vs,
        stride_ob, stride_oh, n_kv_heads, n_heads, SCALE: tl.constexpr,
        REP: tl.constexpr, REP_P2: tl.constexpr, D: tl.constexpr, D_P2: tl.constexpr,
        BLOCK_N: tl.constexpr, N_SPLITS: tl.constexpr,
    ):  # fmt: skip
        bh = tl.program_id(0)
        split = tl.program_id(1)
        b = bh // n_kv_heads
        hkv = bh % n_kv_heads
        p = tl.load(POS)
        lo = tl.load(LO + b)
        # This program's chunk of lo .. p, in whole tiles; the last chunks may be empty.
        chunk = tl.cdiv(tl.cdiv(p + 1 - lo, N_SPLITS), BLOCK_N) * BLOCK_N
        start = lo + split * chunk
        end = tl.minimum(start + chunk, p + 1)
        r = tl.arange(0, REP_P2)
        d = tl.arange(0, D_P2)
        rmask = r < REP
        dmask = d < D
        heads = hkv * REP + r
        q = tl.load(
            Q + b * stride_qb + heads[:, None] * stride_qh + d[None, :],
            mask=rmask[:, None] & dmask[None, :], other=0.0,
        ).to(tl.float32) * SCALE  # fmt: skip
        m = tl.full([REP_P2], float("-inf"), tl.float32)
        den = tl.zeros([REP_P2], tl.float32)
        acc = tl.zeros([REP_P2, D_P2], tl.float32)
        k_row = K + b * stride_kb + hkv * stride_kh
        v_row = V + b * stride_vb + hkv * stride_vh
        n0 = start
        # A while loop: its trip count is the filled length's (Triton's interpreter,
        # which the tests run, takes no loaded value as a range() bound).
        while n0 < end:
            n = n0 + tl.arange(0, BLOCK_N)
            nmask = n < end
            kv_mask = nmask[:, None] & dmask[None, :]
            # Both tiles' loads first, so they are in flight together.
            k = tl.load(k_row + n[:, None] * stride_ks + d[None, :], mask=kv_mask, other=0.0)
            v = tl.load(v_row + n[:, None] * stride_vs + d[None, :], mask=kv_mask, other=0.0)
            s = tl.sum(q[:, None, :] * k.to(tl.float32)[None, :, :], axis=2)
            s = tl.where(nmask[None, :], s, float("-inf"))
            # Every tile holds a filled position (n0 < end), so m_new is finite.
            m_new = tl.maximum(m, tl.max(s, axis=1))
            alpha = tl.exp(m - m_new)
            w = tl.exp(s - m_new[:, None])
            # Loop-carried values keep their fp32 type, as the compiler requires.
            den = (den * alpha + tl.sum(w, axis=1)).to(tl.float32)
            pv = tl.sum(w[:, :, None] * v.to(tl.float32)[None, :, :], 1)
            acc = (acc * alpha[:, None] + pv).to(tl.float32)
            m = m_new.to(tl.float32)
            n0 += BLOCK_N
        out_mask = rmask[:, None] & dmask[None, :]
        if N_SPLITS == 1:
            out = acc / den[:, None]
            at = OUT + b * stride_ob + heads[:, None] * stride_oh + d[None, :]
            tl.store(at, out.to(OUT.dtype.element_ty), mask=out_mask)
        else:
            at = (b * n_heads + heads) * N_SPLITS + split
            tl.store(M_OUT + at, m, mask=rmask)
            tl.store(L_OUT + at, den, mask=rmask)
            tl.store(ACC_OUT + at[:, None] * D + d[None, :], acc, mask=out_mask)

    @triton.jit
    def _combine(
        M_IN, L_IN, ACC_IN, OUT, stride_ob, stride_oh, n_heads,
        D: tl.constexpr, D_P2: tl.constexpr, N_SPLITS: tl.constexpr, SPLITS_P2: tl.constexpr,
    ):  # fmt: skip
        bh = tl.program_id(0)
        b = bh // n_heads
        h = bh % n_heads
        s = tl.arange(0, SPLITS_P2)
        d = tl.arange(0, D_P2)
        dmask = d < D
        real = s < N_SPLITS
        at = bh * N_SPLITS + s
        # An empty chunk wrote m = -inf and weighs 0; chunk 0 is never empty.
        m = tl.load(M_IN + at, mask=real, other=float("-inf"))
        den = tl.load(L_IN + at, mask=real, other=0.0)
        m_max = tl.max(m, axis=0)
        w = tl.exp(m - m_max)
        acc = tl.load(
            ACC_IN + at[:, None] * D + d[None, :], mask=real[:, None] & dmask[None, :], other=0.0
        )
        out = tl.sum(acc * w[:, None], axis=0) / tl.sum(den * w, axis=0)
        tl.store(OUT + b * stride_ob + h * stride_oh + d, out.to(OUT.dtype.element_ty), mask=dmask)

    return _partial, _combine


@functools.cache
def _op() -> Any:
    """The custom op (registered once), which torch.export and AOTInductor carry."""
    from torch.library import triton_op, wrap_triton

    @triton_op("acache::decode_attention", mutates_args=())
    def _decode_attention(
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        lo: torch.Tensor,
        input_pos: torch.Tensor,
    ) -> torch.Tensor:
        B, H, _, D = q.shape
        Hkv, S = k_cache.shape[1], k_cache.shape[2]
        rep = H // Hkv
        block_n = tile_rows(rep, D)
        n_splits = split_count(B * Hkv, S, block_n)
        q = q.contiguous()
        out = torch.empty((B, H, 1, D), dtype=q.dtype, device=q.device)
        parts = n_splits  # the partials' buffers (unused with one chunk)
        m = torch.empty((B, H, parts), dtype=torch.float32, device=q.device)
        den = torch.empty_like(m)
        acc = torch.empty((B, H, parts, D), dtype=torch.float32, device=q.device)
        partial, combine = _kernels()
        wrap_triton(partial)[(B * Hkv, n_splits)](
            q, k_cache, v_cache, lo, input_pos, m, den, acc, out,
            q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
            v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
            out.stride(0), out.stride(1), Hkv, H, SCALE=1.0 / math.sqrt(D),
            REP=rep, REP_P2=_next_pow2(rep), D=D, D_P2=_next_pow2(D), BLOCK_N=block_n,
            N_SPLITS=n_splits, num_warps=4,
        )  # fmt: skip
        if n_splits > 1:
            wrap_triton(combine)[(B * H,)](
                m, den, acc, out, out.stride(0), out.stride(1), H,
                D=D, D_P2=_next_pow2(D), N_SPLITS=n_splits, SPLITS_P2=_next_pow2(n_splits),
                num_warps=4,
            )  # fmt: skip
        return out

    return _decode_attention


def decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    lo: torch.Tensor,
    input_pos: torch.Tensor,
) -> torch.Tensor:
    """q [B, H, 1, D]; k/v_cache [B, Hkv, S, D] (D contiguous); lo [B], input_pos [1]
    int64 -> [B, H, 1, D] in q's dtype: softmax(q k^T / sqrt(D)) v over ``lo[b] .. p``."""
    return _op()(q, k_cache, v_cache, lo, input_pos)


def decode_attention_reference(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    lo: torch.Tensor,
    input_pos: torch.Tensor,
) -> torch.Tensor:
    """The same attention in torch (fp32 softmax), for the tests."""
    rep = q.shape[1] // k_cache.shape[1]
    k = k_cache.repeat_interleave(rep, dim=1).float()
    v = v_cache.repeat_interleave(rep, dim=1).float()
    s = torch.arange(k.shape[2], device=q.device)
    p = input_pos[-1]
    keep = (s[None, :] >= lo[:, None]) & (s[None, :] <= p)  # [B, S]
    scores = (q.float() @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(~keep[:, None, None, :], float("-inf"))
    return (scores.softmax(-1) @ v).to(q.dtype)
