"""The cases of tests/test_models_decode_attention.py, run in a process of their own.

TRITON_INTERPRET must be set before Triton is first imported (its own library
functions are decorated then), which pytest's process cannot promise; so the test
runs this file in a fresh interpreter: ``python tests/_decode_attention_child.py``.
"""

from __future__ import annotations

import math
import os
import sys

os.environ["TRITON_INTERPRET"] = "1"  # before the first import of Triton

import torch  # noqa: E402

from artifactcache.models import decode_attention as da  # noqa: E402
from artifactcache.models import l2_prefetch  # noqa: E402
from artifactcache.models.common import attention_mask, decode_lo, sdpa  # noqa: E402
from artifactcache.models.decode_attention import (  # noqa: E402
    Launch,
    decode_attention,
    decode_attention_rope,
)
from artifactcache.models.rope import apply_rope  # noqa: E402

# A long cache's split: the cases below that name it are several splits long.
SPLIT = da.launch_config(1, 1, 1 << 20).split


def decode_attention_reference(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    lo: torch.Tensor,
    input_pos: torch.Tensor,
) -> torch.Tensor:
    """The kernel's arithmetic in torch (fp32 softmax over lo[b] .. p)."""
    rep = q.shape[1] // k_cache.shape[1]
    k = k_cache.repeat_interleave(rep, dim=1).float()
    v = v_cache.repeat_interleave(rep, dim=1).float()
    s = torch.arange(k.shape[2], device=q.device)
    p = input_pos[-1]
    keep = (s[None, :] >= lo[:, None]) & (s[None, :] <= p)  # [B, S]
    scores = (q.float() @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(~keep[:, None, None, :], float("-inf"))
    return (scores.softmax(-1) @ v).to(q.dtype)


CASES = {
    # (B, H, Hkv, D, slots, position, sliding window, row_start)
    "mha, a position past one split": (1, 4, 4, 128, 300, 200, None, None),
    "gqa, head_dim 80, padded rows": (3, 8, 2, 80, 130, 100, None, [0, 5, 101]),
    "one kv head, head_dim 96, a window": (2, 4, 1, 96, 70, 69, 16, [0, 3]),
    "the first position": (1, 2, 2, 64, 64, 0, None, None),
    "the last slot": (2, 4, 2, 32, 2 * SPLIT + 5, 2 * SPLIT + 4, None, [7, 0]),
    # 80 (row, kv head) pairs: the 256-position split of 65 to 256 pairs, two of them.
    "a batch of 16 rows, 80 pairs": (16, 5, 5, 16, 300, 280, None, list(range(16))),
    "70 splits: combined in two chunks": (1, 2, 2, 16, 70 * SPLIT, 69 * SPLIT + 5, None, None),
    "five query heads a kv head (padded to 16 rows)": (2, 10, 2, 32, 150, 140, None, [0, 4]),
    "32 query heads a kv head (no padded row)": (1, 32, 1, 16, 100, 80, None, None),
    "the position at a later split's first slot": (1, 4, 2, 64, 3 * SPLIT, SPLIT, None, None),
    "a padding row past one split (lo = p)": (
        2,
        4,
        4,
        32,
        3 * SPLIT,
        2 * SPLIT + 3,
        None,
        [0, 2 * SPLIT + 10],
    ),  # fmt: skip
}


def the_kernel_gives_sdpa_under_the_causal_mask(case):
    B, H, Hkv, D, S, p, window, rows = case
    torch.manual_seed(0)
    q = torch.randn(B, H, 1, D)
    k, v = torch.randn(B, Hkv, S, D), torch.randn(B, Hkv, S, D)
    pos = torch.tensor([p])
    row_start = torch.tensor(rows) if rows else None
    lo = decode_lo(pos, row_start, window, B)
    got = decode_attention(q, k, v, lo, pos)
    mask = attention_mask(pos, torch.arange(S), window, row_start)
    want = sdpa(q, k, v, mask, H // Hkv)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(decode_attention_reference(q, k, v, lo, pos), want)


def the_rope_op_rotates_writes_and_attends_as_torch_does(case, rot=None):
    """decode_attention_rope on the projections' q/k/v against apply_rope, the cache
    written at p (index_copy_, as KVCache.write does) and the plain op: the same output,
    and the same caches after it (p's slot written, no other). q/k/v are strided views
    of one projection, as the models pass them. fp32 only: the interpreter truncates to
    bf16 where the GPU rounds, so bf16 is the GPU test's (test_on_cuda_the_rope_op_...)."""
    B, H, Hkv, D, S, p, window, rows = case
    rot = rot or D
    torch.manual_seed(3)
    qkv = torch.randn(B, 1, (H + 2 * Hkv) * D)
    q, k, v = qkv.split([H * D, Hkv * D, Hkv * D], dim=-1)
    q = q.view(B, 1, H, D).transpose(1, 2)
    k = k.view(B, 1, Hkv, D).transpose(1, 2)
    v = v.view(B, 1, Hkv, D).transpose(1, 2)
    angles = torch.rand(1, rot // 2) * 6.28
    cos = torch.cat([angles.cos()] * 2, dim=-1)
    sin = torch.cat([angles.sin()] * 2, dim=-1)
    k_cache, v_cache = torch.randn(B, Hkv, S, D), torch.randn(B, Hkv, S, D)
    pos = torch.tensor([p])
    lo = decode_lo(pos, torch.tensor(rows) if rows else None, window, B)
    want_k, want_v = k_cache.clone(), v_cache.clone()
    want_k.index_copy_(2, pos, apply_rope(k, cos, sin, rot))
    want_v.index_copy_(2, pos, v)
    want = decode_attention(apply_rope(q, cos, sin, rot), want_k, want_v, lo, pos)
    got = decode_attention_rope(q, k, v, cos, sin, k_cache, v_cache, lo, pos)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(k_cache, want_k, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(v_cache, want_v, rtol=0, atol=0)


def positions_past_the_query_are_never_read():
    """Garbage (NaN) beyond the position and before lo must not reach the output."""
    B, H, D, S, p = 2, 2, 64, 3 * SPLIT, SPLIT + 3
    torch.manual_seed(1)
    q = torch.randn(B, H, 1, D)
    k, v = torch.randn(B, H, S, D), torch.randn(B, H, S, D)
    row_start = torch.tensor([0, 9])
    clean = decode_attention(q, k, v, decode_lo(torch.tensor([p]), row_start, None, B),
                             torch.tensor([p]))  # fmt: skip
    k[:, :, p + 1 :] = v[:, :, p + 1 :] = float("nan")
    k[1, :, :9] = v[1, :, :9] = float("nan")
    lo = decode_lo(torch.tensor([p]), row_start, None, B)
    torch.testing.assert_close(decode_attention(q, k, v, lo, torch.tensor([p])), clean)


def half_precision_stays_within_its_rounding_of_fp32():
    """The tensor-core path (products in the cache's dtype, fp32 sums). In fp16: Triton's
    interpreter (3.6 to 3.9) multiplies bf16 tiles as integers, so bf16 itself is held to
    SDPA on the GPU (benchmarks/split_kv_check.py, max_abs_diff_vs_sdpa)."""
    torch.manual_seed(2)
    q = torch.randn(1, 4, 1, 128)
    k, v = torch.randn(1, 4, 200, 128), torch.randn(1, 4, 200, 128)
    pos, lo = torch.tensor([150]), torch.zeros(1, dtype=torch.int64)
    want = decode_attention(q, k, v, lo, pos)
    got = decode_attention(q.half(), k.half(), v.half(), lo, pos)
    assert got.dtype == torch.float16
    torch.testing.assert_close(got.float(), want, rtol=2e-2, atol=2e-2)


def the_prefetching_programs_leave_the_attention_alone():
    """With ``after`` given, the extra programs (here the interpreter's load a chunk and
    its never-taken store) run beside the pairs': both ops give what they give without
    them, bit for bit, on a one-split cache (the partial kernel writes the output) and a
    three-split one (the combine's partial sums), with more bytes asked than the weight
    has. (An extra program that attended instead would recompute the last pair's values
    and go unseen here: the ``is_pair`` gate is held by reading, not by this case.)"""
    threads, chunk = l2_prefetch.PREFETCH_THREADS, l2_prefetch.PREFETCH_CHUNK
    after = torch.randn(3 * threads + 5, chunk // 4)  # fp32
    weight_bytes = after.numel() * after.element_size()
    assert l2_prefetch.plan(weight_bytes * 2, weight_bytes, 2).programs == 4
    for case in (CASES["gqa, head_dim 80, padded rows"], CASES["the last slot"]):
        B, H, Hkv, D, S, p, window, rows = case
        torch.manual_seed(4)
        q = torch.randn(B, H, 1, D)
        k, v = torch.randn(B, Hkv, S, D), torch.randn(B, Hkv, S, D)
        pos = torch.tensor([p])
        lo = decode_lo(pos, torch.tensor(rows) if rows else None, window, B)
        want = decode_attention(q, k, v, lo, pos)
        got = decode_attention(q, k, v, lo, pos, after, 2 * weight_bytes)
        torch.testing.assert_close(got, want, rtol=0, atol=0)
        qkv = torch.randn(B, 1, (H + 2 * Hkv) * D)
        q1, k1, v1 = (t.view(B, 1, -1, D).transpose(1, 2)
                      for t in qkv.split([H * D, Hkv * D, Hkv * D], dim=-1))  # fmt: skip
        cos, sin = torch.rand(1, D).cos(), torch.rand(1, D).sin()
        caches = [(k.clone(), v.clone()) for _ in range(2)]
        plain = decode_attention_rope(q1, k1, v1, cos, sin, *caches[0], lo, pos)
        pre = decode_attention_rope(q1, k1, v1, cos, sin, *caches[1], lo, pos, after, 1 << 20)
        torch.testing.assert_close(pre, plain, rtol=0, atol=0)
        torch.testing.assert_close(caches[1], caches[0], rtol=0, atol=0)


def decode_lo_folds_the_masks_terms():
    pos = torch.tensor([10])
    assert decode_lo(pos, None, None, 2).tolist() == [0, 0]
    assert decode_lo(pos, torch.tensor([3, 11]), None, 2).tolist() == [3, 10]  # padding row
    assert decode_lo(pos, torch.tensor([3, 0]), 4, 2).tolist() == [7, 7]  # the window


# Other cuts than the default's, on the cases they change: one tile a split, a split
# streamed in eight tiles (the loop's first and last tiles partly masked), and the
# 512-position split of large batches.
OTHER_LAUNCHES = {
    "one tile a split": Launch(split=64, block_n=64),
    "eight tiles a split": Launch(split=256, block_n=32),
    "a 512-position split": Launch(split=512, block_n=64),
}
OTHER_LAUNCH_CASES = ("gqa, head_dim 80, padded rows", "one kv head, head_dim 96, a window",
                      "the last slot")  # fmt: skip


if __name__ == "__main__":
    # The batch case's point: the 256-position split of 65 to 256 pairs, over two splits.
    assert da.launch_config(16, 5, 300).split == 256, da.launch_config(16, 5, 300)
    for name, case in CASES.items():
        the_kernel_gives_sdpa_under_the_causal_mask(case)
        print("ok:", name)
    for check in (
        positions_past_the_query_are_never_read,
        half_precision_stays_within_its_rounding_of_fp32,
        the_prefetching_programs_leave_the_attention_alone,
        decode_lo_folds_the_masks_terms,
    ):
        check()
        print("ok:", check.__name__)
    for name, case in CASES.items():
        the_rope_op_rotates_writes_and_attends_as_torch_does(case)
        print("ok: rope,", name)
    # phi-2's partial rotation: 32 of 80 dims.
    the_rope_op_rotates_writes_and_attends_as_torch_does(CASES["gqa, head_dim 80, padded rows"], 32)
    print("ok: rope, 32 of 80 dims rotated")
    default = da.launch_config
    for label, launch in OTHER_LAUNCHES.items():
        da.launch_config = lambda rows, heads, slots, launch=launch: launch
        try:
            for name in OTHER_LAUNCH_CASES:
                the_kernel_gives_sdpa_under_the_causal_mask(CASES[name])
                the_rope_op_rotates_writes_and_attends_as_torch_does(CASES[name])
                print(f"ok: {name}, {label}")
        finally:
            da.launch_config = default
    sys.exit(0)
