"""Time to first token by prompt length (``--prompt-len``): prompts, checks, FLOPs, results.

``acache bench RECIPE --prompt-len 16,128,512`` times, per prompt length N, the
request ``runner.generate(ids, 1)``: the whole prefill of N tokens plus the first
greedy pick, one prompt (batch 1), bracketed by device synchronizes, after
``warmup`` excluded requests of that length (child/timing.py ``measure_ttft``).
That is the TTFT; its p50 and spread (min, max, percentiles) are over the bench's
``iters`` repeats. From it:

* prefill tokens/s = N / TTFT p50;
* % of the FLOP roofline = (prefill FLOPs / TTFT p50) / the dense GEMM rate, a square
  matmul in the run's dtype measured in the same child process (``gemm_tflops``:
  child/timing.py ``matmul_flops``, 8192 on CUDA, 1024 on CPU, best of several
  synchronized rounds after a warm-up). No rate is ever assumed.

The prompt of length N (``prompt_of_length``) is the recipe's ``[bench].prompt_ids``
tiled (repeated, then cut) to N ids: deterministic, and inside the vocabulary since
the recipe's ids are checked to be. Timing does not depend on which ids they are.

``--prompt-len`` is a measurement option, never a build choice: it is not part of
BuildChoices and changes no cache key. A length must leave the artifact room for
the first new token (N + 1 <= max_seq_len); that is checked before anything is
built or spawned.

Nothing here imports torch except through sizing's parameter count.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..errors import MeasureError, ShapeError
from .stats import latency_stats, parse_counts

if TYPE_CHECKING:
    from ..config import Recipe


def parse_prompt_lens(text: str) -> list[int]:
    """``--prompt-len 16,128,512`` -> [16, 128, 512]: positive, distinct integers, in the
    order given (a one-line MeasureError else). Fit to an artifact: check_prompt_lens."""
    return parse_counts(
        text, "--prompt-len", "16,128,512", what="prompt lengths in tokens",
        one="prompt length", unit="length",
    )  # fmt: skip


def check_prompt_lens(recipe: Recipe, lens: Sequence[int]) -> None:
    """Each length N must be >= 1 and leave the artifact a position for the first new
    token (N + 1 <= max_seq_len of ``recipe``, its shapes as built); one line else."""
    if lens and not recipe.bench.prompt_ids:
        raise MeasureError(f"recipe {recipe.name!r} has no [bench].prompt_ids to measure with")
    m = recipe.shapes.max_seq_len
    for n in lens:
        if n < 1:
            raise MeasureError(f"--prompt-len lengths must be at least 1, got {n}")
        if n + 1 > m:
            raise ShapeError(
                f"--prompt-len {n} does not fit: {n} prompt tokens + 1 new token = {n + 1} "
                f"exceed {recipe.name}'s max_seq_len {m}; build with --max-seq-len {n + 1} "
                f"or more, or measure shorter prompts"
            )


def prompt_of_length(recipe: Recipe, n: int) -> list[int]:
    """The deterministic prompt of ``n`` ids: the recipe's bench prompt ids, tiled."""
    ids = list(recipe.bench.prompt_ids)
    if not ids:
        raise MeasureError(f"recipe {recipe.name!r} has no [bench].prompt_ids to measure with")
    reps = -(-n // len(ids))  # ceil
    return (ids * reps)[:n]


def prefill_flops(
    parameters: int,
    n_layers: int,
    n_heads: int,
    head_dim: int,
    prompt_len: int,
    sliding_window: int | None = None,
    lm_head: int = 0,
) -> dict[str, int]:
    """FLOPs of the prefill of one prompt of ``prompt_len`` tokens (batch 1).

    * linear: 2 x ``parameters`` x prompt_len, where ``parameters`` are the weights
      without the input embedding table (a lookup, no FLOPs); every weight is one
      multiply-add per token, except the LM head's ``lm_head`` weights (vocab x dim),
      counted once: the first token needs the last position's logits only, and that
      is all acache's causal first pass computes (as transformers' ``logits_to_keep=1``);
    * attention: QK^T and PV, 2 FLOPs x 2 matmuls x head_dim per (query, key) pair
      per head per layer, over the pairs a causal mask keeps: prompt_len^2 / 2, i.e.
      4 x n_layers x prompt_len^2 x n_heads x head_dim / 2. With a sliding window
      W < prompt_len each query sees at most W keys: W x prompt_len - W^2 / 2 pairs.

    Softmax, norms and the rotary embedding are left out (a few FLOPs per element,
    noise beside the matmuls). A pass that computes more than this (the masked path's
    head over every position for a prompt under 16 tokens, an attention that computes
    the masked pairs too or reads the whole static cache) shows as a lower % of the
    roofline: this counts the work a first token needs, not the work done.
    """
    n = prompt_len
    w = n if sliding_window is None else min(sliding_window, n)
    pairs = w * n - w * w / 2  # = n^2 / 2 when every earlier key is in the window
    linear = 2 * (parameters - lm_head) * n + 2 * lm_head
    attention = round(4 * n_layers * n_heads * head_dim * pairs)
    return {"parameters": parameters, "linear": linear, "attention": attention,
            "total": linear + attention}  # fmt: skip


def recipe_prefill_flops(recipe: Recipe, dtype: str, prompt_len: int) -> dict[str, int]:
    """prefill_flops for ``recipe``: its parameters counted as bench.flops_per_step does."""
    from .. import sizing

    m = recipe.model
    weights, _ = sizing.weight_bytes(recipe, dtype)
    params = weights // sizing.DTYPE_BYTES[dtype]
    return prefill_flops(
        params, m.n_layers, m.n_heads, m.head_dim, prompt_len, m.sliding_window,
        lm_head=m.vocab_size * m.dim,
    )  # fmt: skip


def summarize_prompt_lens(
    recipe: Recipe, dtype: str, probes: Sequence[dict[str, Any]], gemm_tflops: float | None
) -> list[dict[str, Any]]:
    """One result per measured prompt length, the probes' TTFT timings pooled (see the
    module doc); [] when no probe measured any."""
    pooled: dict[int, list[float]] = {}
    firsts: dict[int, list[float]] = {}
    for p in probes:
        for row in p.get("ttft") or []:
            pooled.setdefault(row["prompt_len"], []).extend(row["ttft_s"])
            if row.get("first_s") is not None:  # absent from probes of older reports
                firsts.setdefault(row["prompt_len"], []).append(row["first_s"])
    out = []
    for n, times in pooled.items():
        p50 = statistics.median(times)
        flops = recipe_prefill_flops(recipe, dtype, n)
        achieved = flops["total"] / p50 / 1e12 if p50 > 0 else None
        pct = 100.0 * achieved / gemm_tflops if achieved is not None and gemm_tflops else None
        out.append(
            {
                "prompt_len": n,
                "iterations": len(times),
                "ttft_s": times,
                "ttft": latency_stats(times),
                "ttft_p50_s": p50,
                # The first request of that length in each process (its median).
                "ttft_first_s": statistics.median(firsts[n]) if firsts.get(n) else None,
                "prefill_tok_s": n / p50 if p50 > 0 else None,
                "prefill_flops": flops,
                "achieved_tflops": achieved,
                "flop_roofline_pct": pct,
            }
        )
    return out
