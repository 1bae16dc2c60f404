"""Decode attention that reads only the filled part of a static KV cache (split-KV).

One query per row (a decode step) attends to the cache positions ``lo[b] .. p``
of its row, p = ``input_pos[0]``. The cache keeps its allocated shape, so a step
built on it is static and captures in one CUDA graph, yet its cost follows the used
length: the grid covers every split of :func:`launch_config`'s positions, and a
program whose split lies outside ``lo[b] .. p`` returns before it loads anything
(flash-decoding).

- ``partial``: one program per (row, kv head, split) attends all ``n_rep`` query
  heads of the kv head to the filled part of its split, tile by tile, both products on
  the tensor cores; it writes an unnormalized sum, a max and a denominator per query
  head.
- ``combine``: one program per (row, query head) merges the splits in ``lo .. p``.

A cache that one split covers (up to ``ONE_SPLIT_SLOTS`` positions, or the split the
rows' count takes) has no combine: its one program a (row, kv head) normalizes and writes
the output itself (``FINAL``), which saves a launch a layer.

:func:`decode_attention_rope` is the same step with the rotary embedding and the cache
write inside ``partial`` (``ROPE``): every program rotates its query heads as it loads
them, and the program whose split holds ``p`` rotates the new key, writes it and the new
value at ``p`` and takes position ``p`` into its softmax from its registers (its loop
stops before ``p``; p is its softmax's first position), so no program reads a position
another one writes. Rotating and writing in torch first takes Inductor two fused kernels
a layer (docs/perf-notes.md, attempts 65 and 67; backends/shared/model_options.py says
where the op is the default).

``after``: the weight of the projection that follows the attention (its o_proj). Extra
programs of ``partial`` pull its first ``after_bytes`` into L2 while the attention runs
(models/l2_prefetch.py says why and how); the attention's programs are unchanged.

``lo[b]`` folds the causal mask's other terms (models/common.py's attention_mask):
the row's first real slot, the sliding window, and the padding row that sees only
its own position. So a sliding-window model reads at most its window.

The op is registered at import (torch.library's triton_op imports Triton and Dynamo,
so only split-KV models import this module); its kernels are compiled on first call.
The parity tests (tests/_decode_attention_child.py) hold the kernel to SDPA under the
causal mask, and to the same arithmetic written in torch, in Triton's interpreter.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch.library import triton_op, wrap_triton

from . import l2_prefetch as pf
from .lazy_kernels import kernel_getattr, once

# Triton's kernels read ``tl`` from this module's globals; _kernels() sets it when it
# first builds them.
tl: Any = None


@dataclass(frozen=True)
class Launch:
    """How the partial kernel cuts the cache: ``split`` positions a program (its grid
    covers the allocated slots), streamed in tiles of ``block_n`` with ``stages`` tiles
    in flight."""

    split: int
    block_n: int = 64
    num_warps: int = 4
    stages: int = 3

    @property
    def tile(self) -> int:
        """Positions a loop step reads: block_n, at most the split."""
        return min(self.block_n, self.split)


# The longest cache read by one split, one program a (row, kv head): at the seed context
# (256 slots, position <= 205) the split of 128 has one active split in the first 122
# steps anyway, so the second split and the combine kernel bought nothing there
# (docs/perf-notes.md, attempt 70).
ONE_SPLIT_SLOTS = 256


def launch_config(rows: int, n_kv_heads: int, slots: int) -> Launch:
    """The partial kernel's cut for ``rows`` x ``n_kv_heads`` (row, kv head) pairs over
    ``slots`` allocated positions.

    A cache of up to ONE_SPLIT_SLOTS positions is one split (rounded up to a power of
    two, the tile's shape, and at least 16, the fewest rows tl.dot takes), so no combine
    runs.

    Few pairs need short splits to fill the GPU's SMs; many pairs fill it anyway, and
    there longer splits mean fewer programs for the grid to launch over the allocated
    slots and less for the combine to merge. Measured on the H200 (docs/perf-notes.md,
    attempt 15; benchmarks/split_kv_check.py swaps this function out for its sweep):
    32 pairs best at 64-128 positions, 1024 pairs at 512. 256 between is not measured.
    """
    if slots <= ONE_SPLIT_SLOTS:
        return Launch(split=max(16, _next_pow2(slots)))
    pairs = rows * n_kv_heads
    return Launch(split=128 if pairs <= 64 else 256 if pairs <= 256 else 512)


def q_rows(rep: int) -> int:
    """The rows of a program's q tile (its QB): the kv head's ``rep`` query heads padded
    to a power of two of at least 16, what tl.dot takes."""
    return max(16, _next_pow2(rep))


def staged_bytes(cut: Launch, elem_bytes: int, d_p2: int, qb: int = 16) -> int:
    """Shared memory the partial kernel's K/V tiles take, an upper estimate: the pipelined
    loop holds ``stages - 1`` tiles of K and V (one when it is not pipelined), plus a
    quarter tile and q's ``qb``-row tile for the products' layout changes (the latter
    what a 16-position tile's count exceeds the quarter by). The sm_90 compile test
    holds it to Triton's own count."""
    tile = 2 * cut.tile * d_p2 * elem_bytes
    return max(cut.stages - 1, 1) * tile + tile // 4 + qb * d_p2 * elem_bytes


def fit_shared_memory(cut: Launch, elem_bytes: int, d_p2: int, limit: int, qb: int = 16) -> Launch:
    """``cut`` with fewer stages, then smaller tiles, until its tiles fit ``limit`` bytes
    of shared memory: fp32 at three stages takes 152 KB, over a consumer GPU's 99 KB.
    ``qb``: q's rows a program (:func:`q_rows`)."""
    while staged_bytes(cut, elem_bytes, d_p2, qb) > limit and cut.stages > 1:
        cut = replace(cut, stages=cut.stages - 1)
    while staged_bytes(cut, elem_bytes, d_p2, qb) > limit and cut.block_n > 16:
        cut = replace(cut, block_n=cut.block_n // 2)
    return cut


def shared_memory_limit(device: torch.device) -> int:
    """The shared memory one program may use on ``device`` (48 KB where torch's
    properties do not say, as Inductor assumes)."""
    props = torch.cuda.get_device_properties(device)
    return int(getattr(props, "shared_memory_per_block_optin", 48 * 1024))


def kernel_constants(
    rep: int,
    head_dim: int,
    slots: int,
    cut: Launch,
    fp32: bool,
    rot: int | None = None,
    prefetch: int = 0,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The constexprs the ops launch (partial, combine) with, for ``rep`` query heads a
    kv head, ``slots`` allocated positions and ``cut``; ``rot``: the rotated dims of
    decode_attention_rope (None: the plain op); ``prefetch``: l2_prefetch's mode. One
    split (``FINAL``): the partial kernel writes the output, and no combine runs. The
    sm_90 compile test compiles the kernels with these."""
    d_p2 = _next_pow2(head_dim)
    n_splits = -(-slots // cut.split)
    partial = {
        "SCALE": 1.0 / math.sqrt(head_dim), "REP": rep, "QB": q_rows(rep),
        "D": head_dim, "D_P2": d_p2, "SPLIT": cut.split, "BLOCK_N": cut.tile,
        "N_SPLITS": n_splits, "STAGES": cut.stages,
        # fp32 models keep fp32 products (tf32 would cost them parity with eager).
        "PRECISION": "ieee" if fp32 else "tf32",
        "ROPE": rot is not None, "ROT": rot or 0, "FINAL": n_splits == 1,
        "PREFETCH": prefetch, "PF_THREADS": 32 * cut.num_warps, "PF_CHUNK": pf.PREFETCH_CHUNK,
    }  # fmt: skip
    combine = {"D": head_dim, "D_P2": d_p2, "SPLIT": cut.split, "N_SPLITS": n_splits,
               "CHUNK": min(64, _next_pow2(n_splits))}  # fmt: skip
    return partial, combine


@once
def _kernels() -> tuple[Any, Any]:
    """(partial, combine), Triton-compiled on first use, and set as this module's
    globals (models/lazy_kernels.py says why)."""
    global tl, _rotated, _partial, _combine, _PREFETCH_PTX, _PREFETCH_LINE_PTX
    import triton
    import triton.language

    tl = triton.language
    _PREFETCH_PTX = tl.constexpr(pf.BULK_PTX)
    _PREFETCH_LINE_PTX = tl.constexpr(pf.LINE_PTX)

    @triton.jit
    def _rotated(X, rows, d, mask, COS, SIN, ROT: tl.constexpr):
        """The rows of X ([R, D_P2] at ``rows[:, None] + d``) rotated as apply_rope does
        in fp32 (HF's rotate_half over the first ROT dims), in X's dtype."""
        half = ROT // 2
        partner = tl.where(d < half, d + half, tl.where(d < ROT, d - half, d))
        x = tl.load(X + rows[:, None] + d[None, :], mask=mask, other=0.0).to(tl.float32)
        y = tl.load(X + rows[:, None] + partner[None, :], mask=mask, other=0.0).to(tl.float32)
        y = tl.where(d < half, -y, y)
        cos = tl.load(COS + d, mask=d < ROT, other=1.0).to(tl.float32)
        sin = tl.load(SIN + d, mask=d < ROT, other=0.0).to(tl.float32)
        return (x * cos[None, :] + y * sin[None, :]).to(X.dtype.element_ty)

    @triton.jit
    def _partial(
        Q, K, V, LO, POS, M_OUT, L_OUT, ACC_OUT, OUT, K_NEW, V_NEW, COS, SIN, PF,
        stride_qb, stride_qh, stride_kb, stride_kh, stride_ks, stride_vb, stride_vh, stride_vs,
        stride_ob, stride_oh, stride_knb, stride_knh, stride_vnb, stride_vnh,
        n_kv_heads, n_heads, n_pairs, pf_chunks,
        SCALE: tl.constexpr,  # a constexpr: AOTI types a float as fp64
        REP: tl.constexpr, QB: tl.constexpr, D: tl.constexpr, D_P2: tl.constexpr,
        SPLIT: tl.constexpr, BLOCK_N: tl.constexpr, N_SPLITS: tl.constexpr,
        STAGES: tl.constexpr, PRECISION: tl.constexpr, ROPE: tl.constexpr, ROT: tl.constexpr,
        FINAL: tl.constexpr, PREFETCH: tl.constexpr, PF_THREADS: tl.constexpr,
        PF_CHUNK: tl.constexpr,
    ):  # fmt: skip
        bh = tl.program_id(0)
        split = tl.program_id(1)
        p = tl.load(POS)
        is_pair = bh < n_pairs  # the programs past the pairs prefetch (l2_prefetch.py)
        if PREFETCH > 0:
            if (bh >= n_pairs) & (split == 0):
                chunk = (bh - n_pairs) * PF_THREADS + tl.arange(0, PF_THREADS)
                wanted = chunk < pf_chunks
                at = PF.to(tl.int64) + chunk.to(tl.int64) * PF_CHUNK  # modes 1 and 3
                if PREFETCH == 1:
                    size = tl.full([PF_THREADS], PF_CHUNK, tl.int32)
                    done = tl.inline_asm_elementwise(
                        asm=_PREFETCH_PTX, constraints="=r,l,r,r",
                        args=[at & -16, wanted.to(tl.int32), size], dtype=tl.int32,
                        is_pure=True, pack=1,
                    )  # fmt: skip
                elif PREFETCH == 3:
                    done = tl.zeros([PF_THREADS], tl.int32)
                    for line in tl.static_range(PF_CHUNK // 128):
                        done |= tl.inline_asm_elementwise(
                            asm=_PREFETCH_LINE_PTX, constraints="=r,l,r",
                            args=[at + line * 128, wanted.to(tl.int32)], dtype=tl.int32,
                            is_pure=True, pack=1,
                        )  # fmt: skip
                else:  # the interpreter's stand-in: a value a chunk
                    done = tl.load(PF + chunk, mask=wanted, other=0).to(tl.int32)
                    done = tl.where(p < 0, done, 0)
                # Never taken (done is 0), but it uses the prefetch's result.
                tl.store(M_OUT + chunk * 0, done.to(tl.float32), mask=done != 0)
        pair = tl.minimum(bh, n_pairs - 1)
        b = pair // n_kv_heads
        hkv = pair % n_kv_heads
        lo = tl.load(LO + b)
        start = tl.maximum(split * SPLIT, lo)
        last = p + 1
        owns_p = split < 0  # False, as a value of the type ROPE's branch gives it
        if ROPE:
            # p's key and value come from K_NEW/V_NEW through registers, not the cache.
            last = p
            owns_p = split == p // SPLIT
        end = tl.minimum((split + 1) * SPLIT, last)
        if ((start < end) | owns_p) & is_pair:
            # The kv head's REP query heads are the rows of a [QB, D] tile (QB >= 16, what
            # tl.dot takes), so both products run on the tensor cores and the K and V tiles
            # stream through shared memory, STAGES tiles in flight.
            r = tl.arange(0, QB)
            d = tl.arange(0, D_P2)
            rmask = r < REP
            dmask = d < D
            heads = hkv * REP + r
            qmask = rmask[:, None] & dmask[None, :]
            if ROPE:
                q = _rotated(Q, b * stride_qb + heads * stride_qh, d, qmask, COS, SIN, ROT)
            else:
                q = tl.load(
                    Q + b * stride_qb + heads[:, None] * stride_qh + d[None, :],
                    mask=qmask, other=0.0,
                )  # fmt: skip
            m = tl.full([QB], float("-inf"), tl.float32)
            den = tl.zeros([QB], tl.float32)
            acc = tl.zeros([QB, D_P2], tl.float32)
            # A row's offset in int64: a large cache passes more than 2**31 elements.
            k_row = K + b.to(tl.int64) * stride_kb + hkv * stride_kh
            v_row = V + b.to(tl.int64) * stride_vb + hkv * stride_vh
            if ROPE:  # a constexpr: no code for the plain op
                if owns_p:
                    # Before the tile loop, so these loads' latency is not added after it
                    # (attempt 65 measured that tail at 1.8 us a layer): p's key and value
                    # are written (the loop never reads p) and start the softmax as its
                    # first position: m = its score, weight exp(0) = 1.
                    one = tl.arange(0, 1)
                    kv_mask = (one[:, None] < 1) & dmask[None, :]
                    k_new = _rotated(K_NEW, b * stride_knb + hkv * stride_knh + one, d, kv_mask,
                                     COS, SIN, ROT)  # fmt: skip
                    v_new = tl.load(V_NEW + b * stride_vnb + hkv * stride_vnh + one[:, None]
                                    + d[None, :], mask=kv_mask, other=0.0)  # fmt: skip
                    tl.store(k_row + p * stride_ks + one[:, None] + d[None, :], k_new, mask=kv_mask)
                    tl.store(v_row + p * stride_vs + one[:, None] + d[None, :], v_new, mask=kv_mask)
                    m = tl.sum(q.to(tl.float32) * k_new.to(tl.float32), axis=1) * SCALE
                    den = tl.full([QB], 1.0, tl.float32)
                    acc = tl.zeros([QB, D_P2], tl.float32) + v_new.to(tl.float32)
            for t in tl.range(start // BLOCK_N, tl.cdiv(end, BLOCK_N), num_stages=STAGES):
                n = t * BLOCK_N + tl.arange(0, BLOCK_N)
                nmask = (n >= start) & (n < end)
                kv_mask = nmask[:, None] & dmask[None, :]
                k = tl.load(k_row + n[:, None] * stride_ks + d[None, :], mask=kv_mask, other=0.0)
                v = tl.load(v_row + n[:, None] * stride_vs + d[None, :], mask=kv_mask, other=0.0)
                s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * SCALE
                s = tl.where(nmask[None, :], s, float("-inf"))
                m_new = tl.maximum(m, tl.max(s, axis=1))
                # A tile before the first filled position leaves m at -inf: exponents
                # against 0 there, so they give 0 rather than exp(-inf + inf).
                m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
                alpha = tl.exp(m - m_ref)
                w = tl.exp(s - m_ref[:, None])
                den = den * alpha + tl.sum(w, axis=1)
                pv = tl.dot(w.to(v.dtype), v, input_precision=PRECISION)
                acc = acc * alpha[:, None] + pv
                m = m_new
            if FINAL:
                # The only split always holds p, so den >= 1: what combine would give.
                out = acc / den[:, None]
                tl.store(OUT + b * stride_ob + heads[:, None] * stride_oh + d[None, :],
                         out.to(OUT.dtype.element_ty), mask=qmask)  # fmt: skip
            else:
                at = (b * n_heads + heads) * N_SPLITS + split
                tl.store(M_OUT + at, m, mask=rmask)
                tl.store(L_OUT + at, den, mask=rmask)
                tl.store(ACC_OUT + at[:, None] * D + d[None, :], acc, mask=qmask)

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


__getattr__ = kernel_getattr(__name__, ("_rotated", "_partial", "_combine"), _kernels)


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
    after: torch.Tensor | None = None,
    after_bytes: int = 0,
) -> torch.Tensor:
    """q [B, H, 1, D]; k/v_cache [B, Hkv, S, D] (D contiguous); lo [B], input_pos [1]
    int64 -> [B, H, 1, D] in q's dtype: softmax(q k^T / sqrt(D)) v over ``lo[b] .. p``.
    ``after``: a contiguous weight whose first ``after_bytes`` are prefetched into L2
    (the module docstring)."""
    return _attend(q.contiguous(), k_cache, v_cache, lo, input_pos, None, after, after_bytes)


@triton_op("acache::decode_attention_rope", mutates_args=("k_cache", "v_cache"))
def decode_attention_rope(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    lo: torch.Tensor,
    input_pos: torch.Tensor,
    after: torch.Tensor | None = None,
    after_bytes: int = 0,
) -> torch.Tensor:
    """:func:`decode_attention` of q rotated, after writing k rotated and v at ``p``:
    q [B, H, 1, D] and k/v [B, Hkv, 1, D] as the projections give them (not rotated);
    cos/sin [1, R] the step's (R <= D rotated dims, models/rope.py's apply_rope)."""
    q, k, v, cos, sin = (
        t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v, cos, sin)
    )  # fmt: skip
    return _attend(q, k_cache, v_cache, lo, input_pos, (k, v, cos, sin), after, after_bytes)


def _attend(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    lo: torch.Tensor,
    input_pos: torch.Tensor,
    rope: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor] | None,
    after: torch.Tensor | None = None,
    after_bytes: int = 0,
) -> torch.Tensor:
    """Both ops' launches: ``rope`` is (k, v, cos, sin) for decode_attention_rope;
    ``after`` and ``after_bytes`` the L2 prefetch's."""
    B, H, _, D = q.shape
    Hkv, S = k_cache.shape[1], k_cache.shape[2]
    rep = H // Hkv
    if k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1:
        raise ValueError("decode_attention reads caches whose last dimension is contiguous")
    cut = launch_config(B, Hkv, S)
    if k_cache.is_cuda:
        limit = shared_memory_limit(q.device)
        cut = fit_shared_memory(cut, k_cache.element_size(), _next_pow2(D), limit, q_rows(rep))
    rot = None if rope is None else rope[2].shape[-1]
    plan = pf.Prefetch()
    # A strided weight is not one span of bytes: no prefetch (the weights the models
    # pass are contiguous).
    if after is not None and after_bytes > 0 and after.is_contiguous():
        nbytes = after.numel() * after.element_size()
        plan = pf.plan(after_bytes, nbytes, pf.mode(q.device), threads=32 * cut.num_warps)
    partial_consts, combine_consts = kernel_constants(
        rep, D, S, cut, fp32=q.dtype == torch.float32, rot=rot, prefetch=plan.mode
    )
    n_splits = partial_consts["N_SPLITS"]
    out = torch.empty((B, H, 1, D), dtype=q.dtype, device=q.device)
    # What a launch passes where its kernel reads or writes nothing: a scratch of its
    # own, not an output, so that were torch's analysis of the kernel to count every
    # argument as written, no output would be taken for it.
    unused = torch.empty(1, dtype=torch.float32, device=q.device)
    if partial_consts["FINAL"]:  # the partial kernel writes out
        m = den = acc = unused
    else:
        m = torch.empty((B, H, n_splits), dtype=torch.float32, device=q.device)
        den = torch.empty_like(m)
        acc = torch.empty((B, H, n_splits, D), dtype=torch.float32, device=q.device)
    # The plain op passes the caches where the new key and value would go: never read.
    k_new, v_new, cos, sin = rope if rope is not None else (k_cache, v_cache, unused, unused)
    partial, combine = _kernels()
    weight = after if plan.mode else unused
    wrap_triton(partial)[(B * Hkv + plan.programs, n_splits)](
        q, k_cache, v_cache, lo, input_pos, m, den, acc, out, k_new, v_new, cos, sin, weight,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), out.stride(0), out.stride(1),
        k_new.stride(0), k_new.stride(1), v_new.stride(0), v_new.stride(1),
        Hkv, H, B * Hkv, plan.chunks, **partial_consts, num_warps=cut.num_warps,
    )  # fmt: skip
    if partial_consts["FINAL"]:
        return out
    wrap_triton(combine)[(B * H,)](
        m, den, acc, lo, input_pos, out, out.stride(0), out.stride(1), H,
        **combine_consts, num_warps=4,
    )  # fmt: skip
    return out
