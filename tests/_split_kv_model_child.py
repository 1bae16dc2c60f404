"""The split-KV decode path of the models and the runner, against SDPA, on the CPU.

Run by tests/test_models_decode_attention.py in a fresh interpreter, because
TRITON_INTERPRET must be set before Triton is first imported. For each tiny recipe,
two eager fp32 models with the same weights: one decoding through SDPA over length
buckets, one through the split-KV kernel (in Triton's interpreter) over the whole
static cache, and a third whose kernel also rotates q and k and writes the cache
(``split_kv_rope``), with the L2 prefetch of each block's projection after attention
(``attention_prefetch``). Prints one "ok: RECIPE" line per recipe where the three agree.
"""

from __future__ import annotations

import dataclasses
import os
import sys

os.environ["TRITON_INTERPRET"] = "1"  # before the first import of Triton

import torch  # noqa: E402

from artifactcache.backends.shared.runner import StepRunner  # noqa: E402
from artifactcache.backends.shared.steps import kv_buckets_of  # noqa: E402
from artifactcache.kv_buckets import kv_bucket  # noqa: E402
from artifactcache.models import build_model  # noqa: E402
from artifactcache.models.common import key_positions  # noqa: E402
from artifactcache.recipes import load_recipe  # noqa: E402

# Prompts past one 256-position bucket, so the bucketed model reads 512 of its 600 slots
# (a dynamic length, a spare slot) while the split-KV one combines the 3 filled of its 5
# 128-position splits.
PROMPTS = [[(5 * i + 11 * j) % 200 + 3 for j in range(n)] for i, n in enumerate((300, 7, 119))]
MAX_SEQ_LEN = 600


def long_recipe(name: str):
    """The tiny recipe with room for MAX_SEQ_LEN positions (and a sliding window kept)."""
    rec = load_recipe(name)
    rec = dataclasses.replace(
        rec, model=dataclasses.replace(rec.model, max_position_embeddings=4096)
    )
    return rec.with_shapes(max_seq_len=MAX_SEQ_LEN, max_batch=3)


def check(name: str) -> None:
    recipe = long_recipe(name)
    s = recipe.shapes.max_seq_len
    plain = build_model(recipe)
    split = build_model(recipe, split_kv_decode=True)
    # The third also runs the L2 prefetch's extra programs (the interpreter's stand-in).
    rope = build_model(recipe, split_kv_decode=True, split_kv_rope=True, attention_prefetch=1 << 20)
    assert kv_buckets_of(plain) and not kv_buckets_of(split)
    slots = [m.model.layers[0].self_attn.kv_cache.k_cache.shape[2] for m in (plain, split)]
    assert slots == [s + 1, s], slots  # the bucketed cache's spare slot; none for split-KV
    cpu = torch.device("cpu")
    runs = [
        StepRunner(recipe, m, m, cpu, kv_len_hint=True, kv_buckets=kv_buckets_of(m))
        for m in (plain, split, rope)
    ]
    want, got, got_rope = (r.generate_batch(PROMPTS, 4, eos_token_ids=()) for r in runs)
    assert got == want, (name, got, want)
    assert got_rope == want, (name, "rope in the kernel", got_rope, want)
    # One decode step's logits, after the same prefill, rows left-padded as the runner does.
    n = max(len(p) for p in PROMPTS)
    idx = torch.tensor([[0] * (n - len(p)) + p for p in PROMPTS])
    row_start = torch.tensor([n - len(p) for p in PROMPTS])
    logits = []
    for m in (plain, split, rope):
        with torch.no_grad():
            m(idx, torch.arange(n), row_start)
            length = kv_bucket(n + 1, s, kv_buckets_of(m))
            kv_pos = key_positions(s)[:length]
            logits.append(m(idx[:, -1:], torch.tensor([n]), row_start, kv_pos))
    torch.testing.assert_close(logits[1], logits[0], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(logits[2], logits[0], rtol=1e-4, atol=1e-5)


if __name__ == "__main__":
    for name in sys.argv[1:]:
        check(name)
        print("ok:", name, flush=True)
