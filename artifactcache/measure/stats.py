"""Summary statistics (percentiles, a seeded bootstrap) and the comma lists of counts the
measure commands take."""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Callable, Sequence

from ..errors import MeasureError


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


def bootstrap(
    stat: Callable[..., float],
    samples: Sequence[Sequence[float]],
    *,
    rounds: int = 2000,
    seed: int = 0,
) -> list[float]:
    """``stat`` of ``rounds`` resamples (each sample drawn with replacement, on its own),
    sorted; seeded, so a report renders the same interval from the same timings."""
    rng = random.Random(seed)
    out = []
    for _ in range(rounds):
        drawn = [[xs[rng.randrange(len(xs))] for _ in xs] for xs in samples]
        out.append(stat(*drawn))
    return sorted(out)


def parse_counts(
    text: str, flag: str, example: str, *, what: str, one: str, unit: str
) -> list[int]:
    """``flag``'s comma list of ``what`` -> positive, distinct ints in the order given; a
    one-line MeasureError else (``one``: a single one named alone, ``unit``: its noun)."""
    parts = [x.strip() for x in text.split(",") if x.strip()]
    try:
        counts = [int(x) for x in parts]
    except ValueError:
        raise MeasureError(
            f"{flag} takes {what} separated by commas, e.g. {example}; got {text!r}"
        ) from None
    if not counts:
        raise MeasureError(f"{flag} needs at least one {one}, e.g. {example}")
    for n in counts:
        if n < 1:
            raise MeasureError(f"{flag} {unit}s must be at least 1, got {n}")
    if len(set(counts)) != len(counts):
        raise MeasureError(f"{flag} names a {unit} twice: {text}")
    return counts
