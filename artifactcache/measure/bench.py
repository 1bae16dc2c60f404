"""Steady-state results: request latency, prefill, decode tokens/s, roofline.

This is the parent's side: it pools the timings the probe children report and
works out the rooflines. The timed loops run in the child (child/timing.py),
kept apart from everything that may compile or warm up (gpt-fast style): the
probe loads the Runner, ``measure_requests`` first runs ``warmup`` whole
requests that are excluded, then times ``iters`` requests. Every timer is
bracketed by a device synchronize.

One "request" is the seed's setup: ``recipe.bench.prompt_ids``, N new tokens,
greedy, no early stop (``eos_token_ids=()``: a checkpoint's EOS ids would
otherwise end a request early), as a batch of B copies of that prompt
(``generate_batch``; B = 1 is the seed's batch 1). Per iteration we time

* ``prefill_s``: a request of 1 new token, i.e. prefill plus the first greedy pick;
* ``request_s``: a request of N new tokens.

``decode_s = median(request_s) - median(prefill_s)`` covers the N - 1 decode
steps, so decode tokens/s per request (per row) = (N - 1) / decode_s, and B times
that in aggregate. ``request_tok_s = N / median(request_s)`` is the gpt-fast-style
figure that includes prefill. Step latency (``step_s``, p50/p99) comes from one
more request whose decode steps are each bracketed by a device synchronize.

Bandwidth roofline: bytes read per decode step = every weight except the input
embedding table (a decode step reads one row of it; when the LM head is tied to
it, the table is read as the head and counted once) + B times the KV of the
positions a row attends to (prompt + tokens so far, at most the sliding window:
the mean over the request's decode steps). The key ``bytes_per_token`` keeps its
name: it is the bytes of one step, which makes one token per row. The allocated
static KV cache is reported apart (``kv_allocated_bytes``): it is not what a step
needs, so an attention that reads all of it shows up as a low % of roofline.
Achieved GB/s = bytes/step x steps/s; % of roofline = that / the device's copy
bandwidth (bytes read + written per second of a large copy) measured in the same
process.

Time to first token per prompt length (``--prompt-len``) and its FLOP roofline:
measure/prefill.py.

FLOP roofline: FLOPs per decode step = B x (2 x the weights' parameters, the
embedding table excepted, + 4 x layers x heads x head_dim x the positions a row
attends to, for QK^T and PV). % of the FLOP roofline = achieved FLOP/s / the
device's dense matmul FLOP/s in the run's dtype, measured in the same process.
Decode is bandwidth-bound while its bytes take longer than its FLOPs
(``roofline_bound``).
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from .. import sizing
from ..devices import is_cuda
from ..errors import MeasureError
from .prefill import summarize_prompt_lens
from .stats import latency_stats, parse_counts

if TYPE_CHECKING:
    from ..config import Recipe


def with_bench_prompt(recipe: Recipe) -> Recipe:
    """``recipe``, with its bench prompt encoded by its checkpoint folder's tokenizer.json
    where it records no ids (a recipe derived from a folder's config.json): what the
    measurements run. The bench is no key factor, so the entries are the same."""
    if recipe.bench.prompt_ids or recipe.weights is None or not recipe.weights.is_dir():
        return recipe
    from ..generate.checkpoint import encode
    from ..sources.checkpoint import load_tokenizer

    tokenizer = load_tokenizer(recipe.weights)
    if tokenizer is None:
        return recipe  # resolve_new_tokens says what is missing
    ids = tuple(encode(tokenizer, recipe.bench.prompt))
    return dataclasses.replace(recipe, bench=dataclasses.replace(recipe.bench, prompt_ids=ids))


def resolve_new_tokens(recipe: Recipe, requested: int | None, batch: int = 1) -> int:
    """The seed's N (recipe.bench.max_new_tokens) or the user's, checked against shapes.

    With no explicit request, N is capped to what the recipe's static KV cache
    holds (tiny CPU recipes have max_seq_len 64); an explicit N that does not
    fit is a ShapeError.
    """
    n_prompt = len(recipe.bench.prompt_ids)
    if n_prompt == 0:
        raise MeasureError(
            f"recipe {recipe.name!r} has no [bench].prompt_ids to measure with, and no "
            "tokenizer.json in its checkpoint folder to encode its prompt: write prompt_ids "
            "in a recipe TOML (`acache recipe FOLDER > r.toml`)"
        )
    if requested is None:
        n = min(recipe.bench.max_new_tokens, recipe.shapes.max_seq_len - n_prompt)
    else:
        n = requested
    if n < 1:
        raise MeasureError(f"--new-tokens must be at least 1, got {n}")
    recipe.check_fits(n_prompt, n, batch)
    return n


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
    KV of the positions each of the ``batch`` rows attends to (the mean over the
    request's decode steps). One step makes one token per row. With ``quant``, the
    weights as quantized (int8: a byte per weight, plus the scales).

    ``kv_allocated_bytes`` is the whole static cache (max_batch x max_seq_len), reported
    apart: an attention that reads all of it every step does more than the roofline
    counts, and shows as a low % of roofline instead of hiding behind a larger byte
    count. Default request: the recipe's bench prompt and N (resolve_new_tokens).
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
        "kv_allocated_bytes": sizing.kv_allocated_bytes(recipe, dtype),
        "total": weights + kv_read,
    }


def flops_per_step(
    recipe: Recipe, dtype: str, batch: int = 1, *, prompt_len: int, new_tokens: int
) -> dict[str, Any]:
    """FLOPs of one decode step of ``batch`` rows: the weights' matmuls (2 per parameter,
    the embedding table, a lookup, excepted) and attention's QK^T and PV over the
    positions a row attends to (the mean over the request's decode steps)."""
    m = recipe.model
    weights, _ = sizing.weight_bytes(recipe, dtype)
    params = weights // sizing.DTYPE_BYTES[dtype]
    attended = mean_attended_positions(prompt_len, new_tokens, m.sliding_window)
    attention = 4 * m.n_layers * m.n_heads * m.head_dim * attended
    per_row = 2 * params + attention
    return {
        "parameters": params,
        "attention_per_row": round(attention),
        "total": round(batch * per_row),
    }


def roofline(
    bytes_token: int, decode_tok_s: float | None, copy_gbps: float | None
) -> dict[str, float | None]:
    """The bandwidth roofline of steps of ``bytes_token`` bytes at ``decode_tok_s`` steps/s."""
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


def flop_roofline(
    step_flops: int, steps_per_s: float | None, peak_tflops: float | None
) -> dict[str, float | None]:
    """The FLOP roofline of steps of ``step_flops`` FLOPs at ``steps_per_s``."""
    if steps_per_s is None:
        return {"achieved_tflops": None, "flop_roofline_pct": None}
    achieved = step_flops * steps_per_s / 1e12
    pct = 100.0 * achieved / peak_tflops if peak_tflops else None
    return {"achieved_tflops": achieved, "flop_roofline_pct": pct}


def roofline_bound(
    step_bytes: int, step_flops: int, copy_gbps: float | None, peak_tflops: float | None
) -> str | None:
    """Which roofline binds a step: the one its bytes or its FLOPs take longer on."""
    if not copy_gbps or not peak_tflops:
        return None
    bytes_s, flops_s = step_bytes / (copy_gbps * 1e9), step_flops / (peak_tflops * 1e12)
    return "bandwidth" if bytes_s >= flops_s else "compute"


def roofline_note(pct: float | None, device: str | None) -> str | None:
    """Why a roofline above 100% is not a result to believe, or None at or below it."""
    if pct is None or pct <= 100.0:
        return None
    if device is not None and is_cuda(device):
        return (
            f"{pct:.0f}% of the bandwidth roofline: the step reads fewer bytes than counted "
            "(a model small enough for the GPU's L2 cache) or the copy bandwidth is too low"
        )
    return (
        f"{pct:.0f}% of the bandwidth roofline: on a CPU part of each step's bytes come "
        "from its caches, which the copy test (a buffer larger than them) does not see"
    )


def _median_of(probes: Sequence[dict[str, Any]], key: str, field: str) -> float | None:
    vals = [p[key][field] for p in probes if p.get(key)]
    return statistics.median(vals) if vals else None


def summarize(
    recipe: Recipe,
    dtype: str,
    probes: Sequence[dict[str, Any]],
    batch: int = 1,
    *,
    quant: str | None = None,
) -> dict[str, Any]:
    """Pool the steady-state timings of one or more probes into one bench result.

    ``batch`` is the rows of each request (the probes' ``steady.batch`` when they say).
    """
    batch = probes[0]["steady"].get("batch", batch)
    prefill = [x for p in probes for x in p["steady"]["prefill_s"]]
    request = [x for p in probes for x in p["steady"]["request_s"]]
    steps = [x for p in probes for x in (p["steady"].get("step_s") or [])]
    n = probes[0]["steady"]["new_tokens"]
    rates = derived_rates(prefill, request, n)
    copy_gbps = _median_of(probes, "copy_bandwidth", "gbps")
    peak_tflops = _median_of(probes, "matmul_flops", "tflops")
    prompt_len = probes[0].get("prompt_len") or len(recipe.bench.prompt_ids)
    bpt = bytes_per_token(recipe, dtype, batch, prompt_len=prompt_len, new_tokens=n, quant=quant)
    fps = flops_per_step(recipe, dtype, batch, prompt_len=prompt_len, new_tokens=n)
    per_row = rates["decode_tok_s"]
    bandwidth = roofline(bpt["total"], per_row, copy_gbps)
    return {
        "iterations": len(request),
        "processes": len(probes),
        "new_tokens": n,
        "batch": batch,
        "max_batch": recipe.shapes.max_batch,
        "max_seq_len": recipe.shapes.max_seq_len,
        "prefill": latency_stats(prefill),
        "request": latency_stats(request),
        "step": latency_stats(steps) if steps else None,
        **rates,
        "aggregate_decode_tok_s": None if per_row is None else batch * per_row,
        "aggregate_request_tok_s": batch * rates["request_tok_s"],
        "bytes_per_token": bpt,
        "flops_per_step": fps,
        "copy_gbps": copy_gbps,
        "matmul_tflops": peak_tflops,
        **bandwidth,
        **flop_roofline(fps["total"], per_row, peak_tflops),
        "roofline_bound": roofline_bound(bpt["total"], fps["total"], copy_gbps, peak_tflops),
        "roofline_note": roofline_note(bandwidth["roofline_pct"], probes[0].get("device")),
        # The dense GEMM rate of this run (the same measurement as matmul_tflops), which
        # the prompt lengths' % of the FLOP roofline divides by (measure/prefill.py).
        "gemm_tflops": peak_tflops,
        "gemm_n": (probes[0].get("matmul_flops") or {}).get("n"),
        "prompt_lengths": summarize_prompt_lens(recipe, dtype, probes, peak_tflops),
    }


def summarize_module(probes: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """A module bench result: latency percentiles and items/s at the probes' batch size.

    The LLM-only fields (tokens/s, roofline) are there as None so reports that
    show both kinds render a dash for them.
    """
    lat = [x for p in probes for x in p["steady"]["request_s"]]
    batch = probes[0]["steady"]["batch"]
    med = statistics.median(lat)
    stats = latency_stats(lat)
    return {
        "kind": "module",
        "iterations": len(lat),
        "processes": len(probes),
        "batch": batch,
        "inputs": probes[0].get("inputs"),
        "latency": stats,
        "items_per_s": batch / med if med > 0 else None,
        "request": stats,
        "prefill": stats,
        "request_median_s": med,
        "decode_tok_s": None,
        "request_tok_s": None,
        "achieved_gbps": None,
        "roofline_pct": None,
        "copy_gbps": None,
    }


def parse_batches(text: str) -> list[int]:
    """``--batch 1,8,32`` -> [1, 8, 32]: positive, distinct (one-line MeasureError else)."""
    return parse_counts(
        text, "--batch", "1,8,32", what="batch sizes", one="batch size", unit="size"
    )


def parse_module_batches(text: str | None) -> list[int | None]:
    """A model spec's ``--batch 1,32`` -> [1, 32]; None -> [None] (the inputs' own batch)."""
    if text is None:
        return [None]
    try:
        sizes = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise MeasureError(f"--batch takes integers like 1,32, got {text!r}") from None
    if not sizes or min(sizes) < 1:
        raise MeasureError(f"--batch takes sizes of at least 1, got {text!r}")
    return list(dict.fromkeys(sizes))


def check_batch(recipe: Recipe, batch: int) -> None:
    """A batch of ``batch`` bench prompts must fit the recipe's shapes (its max_batch)."""
    if batch < 1:
        raise MeasureError(f"--batch must be at least 1, got {batch}")
    recipe.check_fits(len(recipe.bench.prompt_ids) or 1, 0, batch)  # ShapeError past max_batch
