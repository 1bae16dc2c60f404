"""Break-even against eager: after how many requests a compiled start has paid for itself.

``break_even`` turns medians into a verdict and n*; ``break_even_interval`` says how sure
that n* is, from the spread of the processes' start times and the requests' latencies.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any

from .stats import bootstrap, percentile

BOOTSTRAP_ROUNDS = 2000


def break_even(
    ttfr_backend: float, latency_backend: float, ttfr_eager: float, latency_eager: float
) -> dict[str, Any]:
    """n* = (ttfr_b - ttfr_e) / (lat_e - lat_b), in requests and in seconds of serving.

    Verdicts:
    ``immediately``  the backend's first result comes no later than eager's and it
                     is no slower per request: ahead from the first request on;
    ``after``        it starts later but is faster per request: level after n*
                     requests, i.e. n* x lat_b seconds of serving after its first result;
    ``never``        it starts later and is not faster per request;
    ``ahead-then-behind``  it starts no later but is slower per request: eager
                     overtakes it after ``eager_overtakes_after_requests``.
    """
    extra = ttfr_backend - ttfr_eager
    gain = latency_eager - latency_backend
    base: dict[str, Any] = {
        "startup_extra_s": extra,
        "per_request_gain_s": gain,
        "ttfr_backend_s": ttfr_backend,
        "ttfr_eager_s": ttfr_eager,
        "latency_backend_s": latency_backend,
        "latency_eager_s": latency_eager,
        "requests": None,
        "seconds": None,
        "level_at_s": None,
    }
    if extra <= 0 and gain >= 0:
        return {**base, "verdict": "immediately", "requests": 0.0, "seconds": 0.0}
    if extra <= 0:
        return {
            **base,
            "verdict": "ahead-then-behind",
            "eager_overtakes_after_requests": extra / gain,
        }
    if gain <= 0:
        return {**base, "verdict": "never"}
    n = extra / gain
    return {
        **base,
        "verdict": "after",
        "requests": n,
        "seconds": n * latency_backend,
        # Since process start, both have then served n requests: the two lines cross.
        "level_at_s": ttfr_backend + n * latency_backend,
    }


def first_results(results: list[dict[str, Any]]) -> list[float]:
    """Each process's time to first result, in seconds since its start."""
    return [r["phases"]["first_result"] for r in results if "first_result" in r.get("phases", {})]


def request_times(results: list[dict[str, Any]]) -> list[float]:
    """Every timed seed request's seconds (prefill + N tokens), over all processes."""
    return [x for r in results for x in r.get("steady", {}).get("request_s", [])]


def _requests_to_break_even(
    ttfr_b: Sequence[float], lat_b: Sequence[float], ttfr_e: Sequence[float], lat_e: Sequence[float]
) -> float:
    """n* of medians (break_even's), as one number: 0 when ahead from the start, inf when
    never ahead for good (``never``, and ``ahead-then-behind``: eager overtakes it)."""
    be = break_even(
        statistics.median(ttfr_b), statistics.median(lat_b),
        statistics.median(ttfr_e), statistics.median(lat_e),
    )  # fmt: skip
    if be["verdict"] == "after":
        return float(be["requests"])
    return 0.0 if be["verdict"] == "immediately" else math.inf


def break_even_interval(
    backend: list[dict[str, Any]], eager: list[dict[str, Any]]
) -> dict[str, Any] | None:
    """A 95% bootstrap interval of the break-even in requests: the processes' times to
    first result and the timed requests' latencies, each resampled. ``high`` None: in
    some resamples the backend is never level (not faster per request)."""
    samples = [first_results(backend), request_times(backend)]
    samples += [first_results(eager), request_times(eager)]
    if not all(samples):
        return None
    dist = bootstrap(_requests_to_break_even, samples, rounds=BOOTSTRAP_ROUNDS)
    # Where a percentile's neighbours include "never" (inf), so is the percentile.
    low, high = (
        math.inf if math.isinf(dist[math.ceil((len(dist) - 1) * q / 100)]) else percentile(dist, q)
        for q in (2.5, 97.5)
    )
    return {  # None: never level (JSON has no infinity)
        "low": None if math.isinf(low) else low,
        "high": None if math.isinf(high) else high,
        "confidence": 0.95,
        "method": f"bootstrap, {BOOTSTRAP_ROUNDS} resamples of runs and requests",
        "processes": [len(samples[0]), len(samples[2])],
        "requests_timed": [len(samples[1]), len(samples[3])],
    }
