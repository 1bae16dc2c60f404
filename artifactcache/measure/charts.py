"""The report's PNG charts (matplotlib, Agg: no display needed): decode tokens/s per
backend, the start-up phases of cold, warm and eager processes, and time to first token
by prompt length. Each chart function returns False when it had nothing to draw.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .report_rows import (
    SEGMENT_COLORS,
    SEGMENTS,
    ok_pairs,
    phase_rows,
    prompt_len_pairs,
    segment_durations,
)


def _pyplot() -> Any:
    """matplotlib.pyplot on the Agg backend: no display needed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _saved(plt: Any, fig: Any, path: Path) -> bool:
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def chart_tokens(report: dict[str, Any], path: Path) -> bool:
    plt = _pyplot()
    recipes, backends = report["recipes"], report["backends"]
    ok = {(r, b): p for r, b, p in ok_pairs(report) if p["bench"]["decode_tok_s"]}
    if not ok:
        return False
    width = 0.8 / max(len(backends), 1)
    # Capped width: five models x four backends must still fit a page.
    fig, ax = plt.subplots(figsize=(min(16, max(6, 0.8 * len(recipes) * len(backends))), 4.5))
    for j, b in enumerate(backends):
        xs, ys = [], []
        for i, r in enumerate(recipes):
            if (r, b) in ok:
                xs.append(i + (j - (len(backends) - 1) / 2) * width)
                ys.append(ok[(r, b)]["bench"]["decode_tok_s"])
        if not xs:  # nothing measured: an empty series would still get a (wrong) legend patch
            continue
        # An explicit colour per backend, stable whichever backends have numbers.
        bars = ax.bar(xs, ys, width, label=b, color=f"C{j}")
        ax.bar_label(bars, fmt="%.0f", fontsize=7)
    ax.set_xticks(range(len(recipes)), recipes)
    ax.set_ylabel("decode tokens/s (batch 1)")
    ax.set_title(f"Decode throughput, {report['settings']['device']} {report['settings']['dtype']}")
    ax.legend()
    return _saved(plt, fig, path)


def chart_ttft(report: dict[str, Any], path: Path) -> bool:
    """TTFT p50 against prompt length, one line per (recipe, backend); False: none measured."""
    plt = _pyplot()
    series = [(r, b, bench["prompt_lengths"]) for r, b, bench in prompt_len_pairs(report)]
    if not series:
        return False
    fig, ax = plt.subplots(figsize=(7, 4.5))
    styles = ("-", "--", ":", "-.")
    for r, b, rows in series:
        pts = sorted((x["prompt_len"], x["ttft"]["p50"] * 1e3) for x in rows)
        # A colour per backend, a line style per recipe: stable whatever ran.
        i, j = report["recipes"].index(r), report["backends"].index(b)
        label = f"{r} {b}" if len(report["recipes"]) > 1 else b
        ax.plot([n for n, _ in pts], [ms for _, ms in pts], styles[i % len(styles)],
                marker="o", label=label, color=f"C{j}")  # fmt: skip
    ax.set_xscale("log")
    lens = sorted({x["prompt_len"] for _, _, rows in series for x in rows})
    ax.set_xticks(lens, [str(n) for n in lens])  # the measured lengths, not powers of ten
    ax.minorticks_off()
    ax.set_xlabel("prompt tokens")
    ax.set_ylabel("time to first token, p50 (ms)")
    st = report["settings"]
    ax.set_title(f"Time to first token by prompt length, {st['device']} {st['dtype']}")
    ax.legend(fontsize=8)
    return _saved(plt, fig, path)


def chart_phases(report: dict[str, Any], path: Path) -> bool:
    plt = _pyplot()
    rows = [(label, segment_durations(results)) for label, results, _ in phase_rows(report)]
    if not rows:
        return False
    fig, ax = plt.subplots(figsize=(9, 0.45 * len(rows) + 1.5))
    left = [0.0] * len(rows)
    for k, (label, _a, _b) in enumerate(SEGMENTS):
        widths = [seg[k] for _, seg in rows]
        ax.barh(range(len(rows)), widths, left=left, color=SEGMENT_COLORS[k], label=label)
        left = [x + w for x, w in zip(left, widths, strict=True)]
    ax.set_yticks(range(len(rows)), [lbl for lbl, _ in rows], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("seconds from process start to first token (median per segment)")
    ax.set_title("Cold vs warm vs eager start")
    ax.legend(fontsize=7, loc="lower right")
    return _saved(plt, fig, path)


# Each chart: the function that draws it, and why it is absent when that drew nothing.
CHARTS = {
    "tokens_per_s.png": (chart_tokens, "no backend measured a decode rate"),
    "phases.png": (chart_phases, "no run recorded its phases"),
    "ttft_by_prompt_len.png": (chart_ttft, "no prompt length was timed (--prompt-len)"),
}


def expected_charts(report: dict[str, Any]) -> list[str]:
    """The charts a report is meant to have: TTFT by prompt length only when asked."""
    asked = (report.get("settings") or {}).get("prompt_lens")
    return [c for c in CHARTS if asked or c != "ttft_by_prompt_len.png"]


def skipped_charts(report: dict[str, Any], written: list[Path]) -> list[tuple[str, str]]:
    """(chart, why) for each expected chart write_report did not draw."""
    import importlib.util

    names = {p.name for p in written}
    no_mpl = importlib.util.find_spec("matplotlib") is None
    return [
        (c, "matplotlib is not installed here" if no_mpl else CHARTS[c][1])
        for c in expected_charts(report)
        if c not in names
    ]


def draw_charts(report: dict[str, Any], out: Path) -> tuple[list[str], str]:
    """(the chart files drawn into ``out``, a note naming each expected one not drawn)."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        # matplotlib is a dev extra, often absent on GPU machines: keep the numbers;
        # the charts can be drawn from report.json wherever it is installed.
        return [], (
            "\nCharts not drawn: matplotlib is not installed here; run "
            "`python -m artifactcache.measure.report DIR` where it is.\n"
        )
    charts = []
    for name, (draw, _) in CHARTS.items():
        if draw(report, out / name):
            charts.append(name)
    not_drawn = [f"{c} ({CHARTS[c][1]})" for c in expected_charts(report) if c not in charts]
    return charts, f"\nCharts not drawn: {'; '.join(not_drawn)}.\n" if not_drawn else ""
