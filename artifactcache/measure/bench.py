"""Steady-state measurement: request latency, prefill, decode tokens/s, roofline.

The timed loop is kept apart from everything that may compile or warm up
(gpt-fast style): the caller loads the Runner, ``measure_requests`` first runs
``warmup`` whole requests that are excluded, then times ``iters`` requests.
Every timer is bracketed by a device synchronize.

One "request" is the seed's setup: batch 1, ``recipe.bench.prompt_ids``, N new
tokens, greedy, no early stop (``eos_token_ids=()``: a checkpoint's EOS ids would
otherwise end a request early). Per iteration we time

* ``prefill_s``: ``generate(prompt, 1)``, i.e. prefill plus the first greedy pick;
* ``request_s``: ``generate(prompt, N)``, the whole request.

``decode_s = median(request_s) - median(prefill_s)`` covers the N - 1 decode
steps, so decode tokens/s = (N - 1) / decode_s. ``request_tok_s = N /
median(request_s)`` is the gpt-fast-style figure that includes prefill.

Roofline: bytes read per decoded token = every weight except the input
embedding table (a decode step reads one row of it; when the LM head is tied to
it, the table is read as the head and counted once) + the KV of the positions
the step attends to (prompt + tokens so far, at most the sliding window: the
mean over the request's decode steps). The allocated static KV cache is reported
apart (``kv_allocated_bytes``): it is not what a step needs, so an attention that
reads all of it shows up as a low % of roofline. Achieved GB/s = bytes/token x
decode tok/s; % of roofline = that / the device's copy bandwidth (bytes read +
written per second of a large copy) measured in the same process.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from .. import sizing
from ..errors import MeasureError

if TYPE_CHECKING:
    import torch

    from ..recipes import Recipe

NO_EOS: tuple[int, ...] = ()  # the seed benchmark never stops early
# CPU copy buffer: far beyond any last-level cache, so the copy streams DRAM.
CPU_COPY_BYTES = 512 << 20
CUDA_COPY_BYTES = 2 << 30


def resolve_new_tokens(recipe: Recipe, requested: int | None, batch: int = 1) -> int:
    """The seed's N (recipe.bench.max_new_tokens) or the user's, checked against shapes.

    With no explicit request, N is capped to what the recipe's static KV cache
    holds (tiny CPU recipes have max_seq_len 64); an explicit N that does not
    fit is a ShapeError.
    """
    n_prompt = len(recipe.bench.prompt_ids)
    if n_prompt == 0:
        raise MeasureError(f"recipe {recipe.name!r} has no [bench].prompt_ids to measure with")
    if requested is None:
        n = min(recipe.bench.max_new_tokens, recipe.shapes.max_seq_len - n_prompt)
    else:
        n = requested
    if n < 1:
        raise MeasureError(f"--new-tokens must be at least 1, got {n}")
    recipe.check_fits(n_prompt, n, batch)
    return n


def sync(dev: torch.device) -> None:
    import torch

    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (q in [0, 100]), like numpy's default."""
    if not values:
        raise ValueError("percentile of no values")
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def latency_stats(values: Sequence[float]) -> dict[str, float]:
    return {
        "p50": percentile(values, 50),
        "p90": percentile(values, 90),
        "p99": percentile(values, 99),
        "min": min(values),
        "max": max(values),
        "mean": statistics.fmean(values),
    }


def measure_requests(
    runner: Any,
    prompt: Sequence[int],
    new_tokens: int,
    *,
    iters: int,
    warmup: int,
    device: torch.device,
) -> dict[str, Any]:
    """Warm-up requests (excluded), then ``iters`` timed (prefill, request) pairs."""
    if iters < 1:
        raise MeasureError(f"iterations must be at least 1, got {iters}")
    if warmup < 1:
        # The first full request is also how first_request is stamped; a backend
        # that compiles its decode step lazily would otherwise pollute the timings.
        raise MeasureError(f"warm-up must be at least 1 request, got {warmup}")
    prompt = list(prompt)
    first_end = None
    for _ in range(warmup):
        runner.generate(prompt, new_tokens, eos_token_ids=NO_EOS)
        sync(device)
        if first_end is None:
            first_end = time.perf_counter()
    prefill: list[float] = []
    request: list[float] = []
    tokens: list[int] = []
    for _ in range(iters):
        sync(device)
        t = time.perf_counter()
        runner.generate(prompt, 1, eos_token_ids=NO_EOS)
        sync(device)
        prefill.append(time.perf_counter() - t)
        t = time.perf_counter()
        tokens = runner.generate(prompt, new_tokens, eos_token_ids=NO_EOS)
        sync(device)
        request.append(time.perf_counter() - t)
    if len(tokens) != new_tokens:
        raise MeasureError(f"the runner returned {len(tokens)} tokens for {new_tokens} asked")
    return {
        "first_request_end": first_end,
        "iters": iters,
        "warmup": warmup,
        "new_tokens": new_tokens,
        "prefill_s": prefill,
        "request_s": request,
        "tokens": tokens,
        **derived_rates(prefill, request, new_tokens),
    }


def derived_rates(
    prefill: Sequence[float], request: Sequence[float], new_tokens: int
) -> dict[str, Any]:
    """Medians and tokens/s from the raw per-iteration timings (see module doc)."""
    pre, req = statistics.median(prefill), statistics.median(request)
    decode = req - pre
    out: dict[str, Any] = {
        "prefill_median_s": pre,
        "request_median_s": req,
        "request_tok_s": new_tokens / req,
        "decode_s": decode,
        "decode_tok_s": None,
    }
    # N = 1 has no decode step; timing noise can also make decode <= 0 for tiny N.
    if new_tokens > 1 and decode > 0:
        out["decode_tok_s"] = (new_tokens - 1) / decode
    return out


def copy_bandwidth(dev: torch.device, nbytes: int | None = None, rounds: int = 5) -> dict[str, Any]:
    """Best-of-``rounds`` device copy bandwidth, counting bytes read + written."""
    import torch

    if nbytes is None:
        nbytes = CUDA_COPY_BYTES if dev.type == "cuda" else CPU_COPY_BYTES
        if dev.type == "cuda":
            free, _ = torch.cuda.mem_get_info(dev)
            nbytes = min(nbytes, int(free * 0.4))  # two buffers, leave headroom
    n = max(nbytes // 4, 1)
    src = torch.ones(n, dtype=torch.float32, device=dev)
    dst = torch.empty_like(src)
    # Enough copies per timed round that a synchronize's latency is noise.
    per_round = 20 if dev.type == "cuda" else 2
    dst.copy_(src)
    sync(dev)
    best = math.inf
    for _ in range(rounds):
        sync(dev)
        t = time.perf_counter()
        for _ in range(per_round):
            dst.copy_(src)
        sync(dev)
        best = min(best, (time.perf_counter() - t) / per_round)
    moved = 2 * n * 4
    del src, dst
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    return {"bytes": n * 4, "seconds": best, "gbps": moved / best / 1e9, "rounds": rounds}


def mean_attended_positions(
    prompt_len: int, new_tokens: int, sliding_window: int | None = None
) -> float:
    """KV positions a decode step of the request attends to, averaged over its steps.

    Decode step k (k = 1 .. N - 1) feeds the token at position prompt_len + k - 1 and
    attends to prompt_len + k positions (at most ``sliding_window``). A request of one
    new token has no decode step: the prompt's positions are what its prefill attended.
    """
    steps = [prompt_len + k for k in range(1, new_tokens)]
    if sliding_window is not None:
        steps = [min(n, sliding_window) for n in steps]
    return sum(steps) / len(steps) if steps else float(prompt_len)


def bytes_per_token(
    recipe: Recipe,
    dtype: str,
    batch: int = 1,
    *,
    prompt_len: int | None = None,
    new_tokens: int | None = None,
    quant: str | None = None,
) -> dict[str, Any]:
    """Bytes a decode step needs to read: weights without the embedding table, plus the
    KV of the positions it attends to (the mean over the request's decode steps).
    With ``quant``, the weights as quantized (int8: a byte per weight, plus the scales).

    ``kv_allocated_bytes`` is the whole static cache, reported apart: an attention
    that reads all of it every step does more than the roofline counts, and shows as
    a low % of roofline instead of hiding behind a larger byte count. Default
    request: the recipe's bench prompt and N (resolve_new_tokens).
    """
    if prompt_len is None:
        prompt_len = len(recipe.bench.prompt_ids)
    if new_tokens is None:
        new_tokens = resolve_new_tokens(recipe, None, batch)
    weights, embed = sizing.weight_bytes(recipe, dtype, quant)
    per_position = sizing.kv_bytes_per_position(recipe, dtype, batch)
    attended = mean_attended_positions(prompt_len, new_tokens, recipe.model.sliding_window)
    kv_read = round(per_position * attended)
    return {
        "weights": weights,
        "embedding_excluded": embed,
        "kv_read": kv_read,
        "kv_mean_positions": attended,
        "kv_allocated_bytes": per_position * recipe.shapes.max_seq_len,
        "total": weights + kv_read,
    }


def roofline(
    bytes_token: int, decode_tok_s: float | None, copy_gbps: float | None
) -> dict[str, float | None]:
    if decode_tok_s is None:
        return {"achieved_gbps": None, "roofline_pct": None, "roofline_tok_s": None}
    achieved = bytes_token * decode_tok_s / 1e9
    if not copy_gbps:
        return {"achieved_gbps": achieved, "roofline_pct": None, "roofline_tok_s": None}
    return {
        "achieved_gbps": achieved,
        "roofline_pct": 100.0 * achieved / copy_gbps,
        "roofline_tok_s": copy_gbps * 1e9 / bytes_token,
    }


def summarize(
    recipe: Recipe,
    dtype: str,
    probes: Sequence[dict[str, Any]],
    batch: int = 1,
    *,
    quant: str | None = None,
) -> dict[str, Any]:
    """Pool the steady-state timings of one or more probes into one bench result."""
    prefill = [x for p in probes for x in p["steady"]["prefill_s"]]
    request = [x for p in probes for x in p["steady"]["request_s"]]
    n = probes[0]["steady"]["new_tokens"]
    rates = derived_rates(prefill, request, n)
    bw = [p["copy_bandwidth"]["gbps"] for p in probes if p.get("copy_bandwidth")]
    copy_gbps = statistics.median(bw) if bw else None
    bpt = bytes_per_token(
        recipe, dtype, batch, prompt_len=probes[0].get("prompt_len"), new_tokens=n, quant=quant
    )
    return {
        "iterations": len(request),
        "processes": len(probes),
        "new_tokens": n,
        "batch": batch,
        "prefill": latency_stats(prefill),
        "request": latency_stats(request),
        **rates,
        "bytes_per_token": bpt,
        "copy_gbps": copy_gbps,
        **roofline(bpt["total"], rates["decode_tok_s"], copy_gbps),
    }


def check_batch(recipe: Recipe, batch: int) -> None:
    """Batch must fit the recipe; the Runner interface decodes one sequence."""
    if batch < 1:
        raise MeasureError(f"--batch must be at least 1, got {batch}")
    recipe.check_fits(len(recipe.bench.prompt_ids) or 1, 0, batch)  # ShapeError past max_batch
    if batch != 1:
        raise MeasureError(
            f"batch {batch} fits the recipe, but the Runner interface (generate) decodes one "
            "sequence at a time; only --batch 1 can be measured"
        )
