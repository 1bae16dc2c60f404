"""The rows a coldstart/compare report is read by: its pairs, phase rows and segments.

Shared by the tables (report.py) and the charts (charts.py); plain data, no drawing.
"""

from __future__ import annotations

import statistics
from typing import Any

# (label, from phase, to phase): the stacked segments of the phase chart.
SEGMENTS = (
    ("start-up + imports", None, "imports_done"),
    ("lookup/verify (+build)", "imports_done", "entry_ready"),
    ("weights", "entry_ready", "weights_ready"),
    ("artifact load", "weights_ready", "artifact_ready"),
    ("first token", "artifact_ready", "first_result"),
)
SEGMENT_COLORS = ("#bbbbbb", "#d62728", "#1f77b4", "#ff7f0e", "#2ca02c")


def pair_of(report: dict[str, Any], recipe: str, backend: str) -> dict[str, Any] | None:
    """The pair of (recipe, backend) in a report, or None where it was not run."""
    return report["pairs"].get(f"{recipe}/{backend}")


def ok_pairs(report: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    """(recipe, backend, pair) of each pair that has numbers."""
    out = []
    for key, p in report["pairs"].items():
        if p["status"] == "ok":
            r, b = key.rsplit("/", 1)  # a recipe may be a path; a backend has no "/"
            out.append((r, b, p))
    return out


def prompt_len_pairs(report: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    """(recipe, backend, bench) of each pair that measured prompt lengths, in report order."""
    out = []
    for r in report["recipes"]:
        for b in report["backends"]:
            p = pair_of(report, r, b)
            if p and p["status"] == "ok" and p["bench"].get("prompt_lengths"):
                out.append((r, b, p["bench"]))
    return out


def phase_rows(report: dict[str, Any]) -> list[tuple[str, list[dict[str, Any]], dict[str, Any]]]:
    """(label, raw runs, phase summary): eager baseline, then each backend's cold and warm."""
    rows = []
    for recipe in report["recipes"]:
        base = report.get("baselines", {}).get(recipe)
        if base and base["status"] == "ok":
            summ = base["coldstart"]["scenarios"]["eager"]
            rows.append((f"{recipe} eager", base["runs"]["eager"], summ["phases"]))
        for b in report["backends"]:
            p = pair_of(report, recipe, b)
            if b == "eager" or not p or p["status"] != "ok":
                continue
            for scen in ("cold", "warm"):
                if scen in p["runs"]:
                    summ = p["coldstart"]["scenarios"][scen]
                    rows.append((f"{recipe} {b} {scen}", p["runs"][scen], summ["phases"]))
    return rows


def segment_durations(results: list[dict[str, Any]]) -> list[float]:
    """Median duration of each SEGMENT over runs (per-run differences, then median)."""
    out = []
    for _label, a, b in SEGMENTS:
        vals = []
        for r in results:
            ph = r["phases"]
            if b in ph and (a is None or a in ph):
                vals.append(max(0.0, ph[b] - (ph[a] if a else 0.0)))
        out.append(statistics.median(vals) if vals else 0.0)
    return out
