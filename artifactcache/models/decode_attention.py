"""Decode attention that reads only the filled part of a static KV cache (split-KV).

One query per row (a decode step) attends to the cache positions ``lo[b] .. p``
of its row, p = ``input_pos[0]``. The cache keeps its allocated shape, so a step
built on it is static and captures in one CUDA graph, yet its cost follows the used
length: the grid covers every split of :func:`split_size` positions, and a program whose split
lies outside ``lo[b] .. p`` returns before it loads anything (flash-decoding).

- ``partial``: one program per (row, kv head, split) attends all ``n_rep`` query
  heads of the kv head to its split, writing an unnormalized sum, a max and a
  denominator per query head.
- ``combine``: one program per (row, query head) merges the splits in ``lo .. p``.

``lo[b]`` folds the causal mask's other terms (models/common.py's attention_mask):
the row's first real slot, the sliding window, and the padding row that sees only
its own position. So a sliding-window model reads at most its window.

The op is registered at import (torch.library's triton_op imports Triton and Dynamo,
so only split-KV models import this module); its kernels are compiled on first call.
The parity tests (tests/_decode_attention_child.py) hold the kernel to SDPA under the
causal mask, and to the same arithmetic written in torch.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import torch
from torch.library import triton_op, wrap_triton

# Triton's kernels read ``tl`` from this module's globals; _kernels() sets it when it
# first builds them.
tl: Any = None

# Positions one partial program reads (one tile).
SPLIT = 64


def split_size(rows: int, n_kv_heads: int) -> int:
    """Positions a partial program reads: one tile of SPLIT, whatever the batch.

    Measured on the H200 (docs/perf-notes.md): a program that loops over 2-8 tiles
    is 1.5-6x slower at batch 1 (the masked tiles' arithmetic, and registers), and
    at batch 32 it spilled. Large batches are where SDPA's one kernel wins instead
    (model_options.split_kv_decode keeps them on the bucketed SDPA by default).
    """
    return SPLIT


@functools.cache
def _kernels() -> tuple[Any, Any]:
    """(partial, combine), Triton-compiled on first use."""
    global tl
    import triton
    import triton.language

    tl = triton.language

    @triton.jit
    def _partial(
        Q, K, V, LO, POS, M_OUT, L_OUT, ACC_OUT,
        stride_qb, stride_qh, stride_kb, stride_kh, stride_ks, stride_vb, stride_vh, stride_vs,
        n_kv_heads, n_heads, SCALE: tl.constexpr,  # a constexpr: AOTI types a float as fp64
        REP: tl.constexpr, REP_P2: tl.constexpr, D: tl.constexpr, D_P2: tl.constexpr,
        SPLIT: tl.constexpr, BLOCK_N: tl.constexpr, N_SPLITS: tl.constexpr,
    ):  # fmt: skip
        bh = tl.program_id(0)
        split = tl.program_id(1)
        b = bh // n_kv_heads
        hkv = bh % n_kv_heads
        p = tl.load(POS)
        lo = tl.load(LO + b)
        start = tl.maximum(split * SPLIT, lo)
        end = tl.minimum((split + 1) * SPLIT, p + 1)
        if start < end:
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
            # A static loop over the split's tiles (masked to start .. end - 1): no
            # data-dependent trip count, so the compiled loop unrolls.
            for i in tl.static_range(SPLIT // BLOCK_N):
                n = split * SPLIT + i * BLOCK_N + tl.arange(0, BLOCK_N)
                nmask = (n >= start) & (n < end)
                kv_mask = nmask[:, None] & dmask[None, :]
                # Both tiles' loads first, so they are in flight together.
                k = tl.load(k_row + n[:, None] * stride_ks + d[None, :], mask=kv_mask, other=0.0)
                v = tl.load(v_row + n[:, None] * stride_vs + d[None, :], mask=kv_mask, other=0.0)
                s = tl.sum(q[:, None, :] * k.to(tl.float32)[None, :, :], axis=2)
                s = tl.where(nmask[None, :], s, float("-inf"))
                m_new = tl.maximum(m, tl.max(s, axis=1))
                # A tile before the first filled position leaves m at -inf: exponents
                # against 0 there, so they give 0 rather than exp(-inf + inf).
                m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
                alpha = tl.exp(m - m_ref)
                w = tl.exp(s - m_ref[:, None])
                den = den * alpha + tl.sum(w, axis=1)
                acc = acc * alpha[:, None] + tl.sum(w[:, :, None] * v.to(tl.float32)[None, :, :], 1)
                m = m_new
            at = (b * n_heads + heads) * N_SPLITS + split
            tl.store(M_OUT + at, m, mask=rmask)
            tl.store(L_OUT + at, den, mask=rmask)
            tl.store(
                ACC_OUT + at[:, None] * D + d[None, :], acc, mask=rmask[:, None] & dmask[None, :]
            )

    @triton.jit
    def _combine(
        M_IN, L_IN, ACC_IN, LO, POS, OUT, stride_ob, stride_oh, n_heads,
        D: tl.constexpr, D_P2: tl.constexpr, SPLIT: tl.constexpr,
        N_SPLITS: tl.constexpr, CHUNK: tl.constexpr,
    ):  # fmt: skip
        bh = tl.program_id(0)
        b = bh // n_heads
        h = bh % n_heads
        p = tl.load(POS)
        lo = tl.load(LO + b)
        d = tl.arange(0, D_P2)
        dmask = d < D
        # The splits in CHUNKs, merged with a running max: registers stay [CHUNK, D]
        # however long the cache.
        m_run = tl.max(tl.full([CHUNK], float("-inf"), tl.float32), axis=0)
        l_run = tl.sum(tl.zeros([CHUNK], tl.float32), axis=0)
        acc_run = tl.zeros([D_P2], tl.float32)
        for c in tl.static_range((N_SPLITS + CHUNK - 1) // CHUNK):
            s = c * CHUNK + tl.arange(0, CHUNK)
            active = (s >= lo // SPLIT) & (s <= p // SPLIT) & (s < N_SPLITS)
            at = bh * N_SPLITS + s
            m = tl.load(M_IN + at, mask=active, other=float("-inf"))
            den = tl.load(L_IN + at, mask=active, other=0.0)
            m_new = tl.maximum(m_run, tl.max(m, axis=0))
            # A chunk before the first filled split leaves the max at -inf.
            m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
            alpha = tl.exp(m_run - m_ref)
            w = tl.where(active, tl.exp(m - m_ref), 0.0)
            acc_mask = active[:, None] & dmask[None, :]
            acc = tl.load(ACC_IN + at[:, None] * D + d[None, :], mask=acc_mask, other=0.0)
            l_run = l_run * alpha + tl.sum(den * w, axis=0)
            acc_run = acc_run * alpha + tl.sum(acc * w[:, None], axis=0)
            m_run = m_new
        out = acc_run / l_run
        tl.store(OUT + b * stride_ob + h * stride_oh + d, out.to(OUT.dtype.element_ty), mask=dmask)

    return _partial, _combine


def _next_pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


# Registered at import: Dynamo must meet a registered op, and refuses to register one
# from inside a function it traces.
@triton_op("acache::decode_attention", mutates_args=())
def decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    lo: torch.Tensor,
    input_pos: torch.Tensor,
) -> torch.Tensor:
    """q [B, H, 1, D]; k/v_cache [B, Hkv, S, D] (D contiguous); lo [B], input_pos [1]
    int64 -> [B, H, 1, D] in q's dtype: softmax(q k^T / sqrt(D)) v over ``lo[b] .. p``."""
    B, H, _, D = q.shape
    Hkv, S = k_cache.shape[1], k_cache.shape[2]
    rep = H // Hkv
    split = split_size(B, Hkv)
    n_splits = -(-S // split)
    q = q.contiguous()
    m = torch.empty((B, H, n_splits), dtype=torch.float32, device=q.device)
    den = torch.empty_like(m)
    acc = torch.empty((B, H, n_splits, D), dtype=torch.float32, device=q.device)
    out = torch.empty((B, H, 1, D), dtype=q.dtype, device=q.device)
    rep_p2, d_p2 = _next_pow2(rep), _next_pow2(D)
    # The [REP, BLOCK_N, D] product stays at 8k fp32 values a program, in registers;
    # a tile is at most one split.
    block_n = min(split, max(16, 8192 // (rep_p2 * d_p2)))
    partial, combine = _kernels()
    wrap_triton(partial)[(B * Hkv, n_splits)](
        q, k_cache, v_cache, lo, input_pos, m, den, acc,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        Hkv, H, SCALE=1.0 / math.sqrt(D),
        REP=rep, REP_P2=rep_p2, D=D, D_P2=d_p2, SPLIT=split, BLOCK_N=block_n,
        N_SPLITS=n_splits, num_warps=4,
    )  # fmt: skip
    wrap_triton(combine)[(B * H,)](
        m, den, acc, lo, input_pos, out, out.stride(0), out.stride(1), H,
        D=D, D_P2=d_p2, SPLIT=split, N_SPLITS=n_splits, CHUNK=min(64, _next_pow2(n_splits)),
        num_warps=4,
    )  # fmt: skip
    return out
