"""report.json -> report.md, and the PNG charts (charts.py).

The JSON is what compare.py writes (schema in docs/measurement.md). Every cell
comes from a measured value in it; a pair that did not run says why instead.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..devices import is_cuda
from ..errors import MeasureError
from .charts import draw_charts
from .report_rows import SEGMENTS, pair_of, phase_rows, prompt_len_pairs, segment_durations

# The warm time to first token acache aims for on a GPU (docs/measurement.md); a warm run
# over it is reported as a finding.
WARM_TTFR_GPU_TARGET_S = 8.0


def _f(x: float | None, fmt: str = "{:.1f}", unit: str = "") -> str:
    return "–" if x is None else fmt.format(x) + unit


def _spread(ph: dict[str, Any] | None) -> str:
    if not ph:
        return "–"
    if ph["n"] == 1:
        return f"{ph['median']:.2f} s"
    return f"{ph['median']:.2f} s ({ph['min']:.2f}–{ph['max']:.2f})"


def break_even_verdict(be: dict[str, Any] | None) -> str:
    """A break-even result in words, for tables and findings."""
    if not be:
        return "–"
    v = be["verdict"]
    if v == "immediately":
        return "pays off immediately"
    if v == "never":
        return "never pays off (not faster per request)"
    if v == "ahead-then-behind":
        return (
            f"ahead at start; eager overtakes after {be['eager_overtakes_after_requests']:.1f} req"
        )
    return f"{be['requests']:.1f} req ({be['seconds']:.1f} s serving)"


def _processes(report: dict[str, Any]) -> str:
    """Fresh processes per scenario, from the runs themselves: a report assembled from
    several calls' units (benchmarks/seed_report.py) may mix counts."""
    st = report["settings"]
    builds = st.get("builds")
    said = f"{st['runs']} fresh process(es) per scenario"
    if builds not in (None, st["runs"]):
        said += f" (cold: {builds}, --builds)"
    per_recipe: dict[str, dict[str, set[int]]] = {}
    units = [(k.split("/", 1)[0], p) for k, p in report.get("pairs", {}).items()]
    units += list(report.get("baselines", {}).items())
    for recipe, unit in units:
        for scen, sc in ((unit.get("coldstart") or {}).get("scenarios") or {}).items():
            kind = "cold" if scen == "cold" else "other"
            per_recipe.setdefault(recipe, {}).setdefault(kind, set()).add(sc["runs"])
    expected = {"cold": {builds or st["runs"]}, "other": {st["runs"]}}
    if all(c <= expected[k] for r in per_recipe.values() for k, c in r.items()):
        return said

    def one(r: dict[str, set[int]]) -> str:
        other, cold = sorted(r.get("other", set())), sorted(r.get("cold", set()))
        text = "/".join(map(str, other or cold))
        return text + (f" (cold {'/'.join(map(str, cold))})" if other and cold != other else "")

    return "fresh processes per scenario, as run: " + ", ".join(
        f"{name} {one(r)}" for name, r in per_recipe.items()
    )


def break_even_with_interval(be: dict[str, Any] | None) -> str:
    """break_even_verdict and, where measured, its 95% interval in requests."""
    text = break_even_verdict(be)
    iv = (be or {}).get("interval")
    if not iv:
        return text
    # One process a scenario: the resamples vary the requests alone, not the start.
    alone = ""
    if min(iv.get("processes") or [2]) < 2:
        alone = (
            " (requests' spread only: one process in a scenario; --runs 3 or more, "
            "and as many --builds for a cold start)"
        )
    if iv["low"] is None:
        return f"{text}; 95% interval: never level{alone}"
    high = "never" if iv["high"] is None else f"{iv['high']:.1f}"
    return f"{text}; 95% interval {iv['low']:.1f}–{high} req{alone}"


def break_even_is_uncertain(be: dict[str, Any] | None) -> bool:
    """The interval spans more than 2x, or runs to "never": more runs or requests needed."""
    iv = (be or {}).get("interval")
    if not iv or iv["low"] is None:  # none, or never level in every resample that counts
        return False
    return iv["high"] is None or iv["high"] > max(2 * iv["low"], iv["low"] + 1)


def _cell_status(pair: dict[str, Any] | None) -> str | None:
    """None when the pair has numbers; else the reason it has none."""
    if pair is None:
        return "not run"
    if pair["status"] == "ok":
        return None
    return f"{'not run' if pair['status'] == 'skipped' else 'failed'}: {pair['reason']}"


def _baseline(report: dict[str, Any], recipe: str) -> dict[str, Any] | None:
    """The eager scenario's summary for a recipe, or None where it did not run."""
    base = report.get("baselines", {}).get(recipe)
    if not base or base["status"] != "ok":
        return None
    return base["coldstart"]["scenarios"]["eager"]


def seed_table(report: dict[str, Any]) -> list[str]:
    backends = report["backends"]
    lines = [
        "| model | " + " | ".join(backends) + " |",
        "|---|" + "---:|" * len(backends),
    ]
    for recipe in report["recipes"]:
        cells = []
        for b in backends:
            p = pair_of(report, recipe, b)
            why = _cell_status(p)
            if why:
                cells.append(why)
                continue
            bench = p["bench"]
            if bench.get("kind") == "module":  # a model spec: calls, not tokens
                lat = bench["latency"]["p50"] * 1e3
                cells.append(f"{_f(bench['items_per_s'])} items/s (p50 {lat:.2f} ms)")
                continue
            if bench["decode_tok_s"] is None:
                cells.append("decode not resolvable (request ≤ prefill time)")
                continue
            tok = _f(bench["decode_tok_s"])
            pct = _f(bench["roofline_pct"], "{:.0f}", "%")
            cells.append(f"{tok} tok/s ({pct} roofline)")
        lines.append(f"| {recipe} | " + " | ".join(cells) + " |")
    return lines


def detail_table(report: dict[str, Any]) -> list[str]:
    head = (
        "| model | backend | decode tok/s | request p50 / p99 | prefill p50 | cold TTFR | "
        "warm TTFR | eager TTFR | cold/warm | break-even (warm) | GB/s | % roofline | "
        "compiled cold / warm | peak RSS | peak GPU cold / warm |"
    )
    lines = [head, "|---|---|" + "---:|" * 13]
    for recipe in report["recipes"]:
        eager_ttfr = _baseline(report, recipe)
        for b in report["backends"]:
            p = pair_of(report, recipe, b)
            why = _cell_status(p)
            if why:
                lines.append(f"| {recipe} | {b} | {why} |" + " |" * 12)
                continue
            cs, bench = p["coldstart"], p["bench"]
            sc = cs["scenarios"]
            cold, warm = sc.get("cold"), sc.get("warm")

            def ttfr(s: dict[str, Any] | None) -> str:
                return _spread(s["phases"].get("first_result")) if s else "–"

            def compiled(s: dict[str, Any] | None) -> str:
                return "/".join("yes" if c else "no" for c in s["compiled"]) if s else "–"

            mem = [s for s in sc.values()]
            rss = max(s.get("peak_rss_bytes", 0) for s in mem) / 2**30

            # Cold and warm apart: a cold process builds then loads, so it can hold a
            # second copy of the weights that a deployed (warm) process never does.
            def gib(s: dict[str, Any] | None) -> str:
                return _f(
                    (s or {}).get("peak_device_allocated_bytes", 0) / 2**30 or None,
                    "{:.1f}",
                    " GiB",
                )

            # eager pairs have one scenario; the others show cold and warm apart.
            gpu = gib(mem[0]) if not (cold or warm) else f"{gib(cold)} / {gib(warm)}"
            lines.append(
                f"| {recipe} | {b} | {_f(bench['decode_tok_s'])} | "
                f"{bench['request']['p50']:.3f} / {bench['request']['p99']:.3f} s"
                f" | {_f(bench['prefill']['p50'] * 1e3, '{:.1f}', ' ms')} | {ttfr(cold)} | "
                f"{ttfr(warm)} | {ttfr(eager_ttfr)} | {_f(cs.get('cold_warm_ratio'), '{:.1f}x')}"
                f" | {break_even_with_interval(cs.get('break_even_warm'))} | "
                f"{_f(bench['achieved_gbps'])} | "
                f"{_f(bench['roofline_pct'], '{:.0f}', '%')} | {compiled(cold)} / "
                f"{compiled(warm)} | {rss:.1f} GiB | {gpu} |"
            )
    return lines


def prompt_len_table(report: dict[str, Any]) -> list[str]:
    """Time to first token per prompt length (``--prompt-len``); [] when none was measured."""
    rows = [
        (r, b, bench.get("gemm_tflops"), x)
        for r, b, bench in prompt_len_pairs(report)
        for x in bench["prompt_lengths"]
    ]
    if not rows:
        return []
    lines = [
        "| model | backend | prompt tokens | TTFT p50 (min–max) | first at this length | "
        "prefill tok/s | prefill TFLOP/s | GEMM TFLOP/s | % FLOP roofline |",
        "|---|---|" + "---:|" * 7,
    ]
    for r, b, gemm, x in rows:
        t = x["ttft"]
        lines.append(
            f"| {r} | {b} | {x['prompt_len']} | {t['p50'] * 1e3:.2f} ms "
            f"({t['min'] * 1e3:.2f}–{t['max'] * 1e3:.2f}) | "
            f"{_f(_ms(x.get('ttft_first_s')), '{:.2f}', ' ms')} | "
            f"{_f(x['prefill_tok_s'], '{:.0f}')} | "
            f"{_f(x['achieved_tflops'], '{:.3g}')} | {_f(gemm, '{:.3g}')} | "
            f"{_f(x['flop_roofline_pct'], '{:.1f}', '%')} |"
        )
    return lines


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1e3


def phase_table(report: dict[str, Any]) -> list[str]:
    labels = [s[0] for s in SEGMENTS]
    lines = [
        "| run | " + " | ".join(labels) + " | total to first token | total to first request |",
        "|---|" + "---:|" * (len(labels) + 2),
    ]
    for label, results, ph in phase_rows(report):
        seg = segment_durations(results)
        lines.append(
            f"| {label} | "
            + " | ".join(f"{x:.2f} s" for x in seg)
            + f" | {_spread(ph.get('first_result'))} | {_spread(ph.get('first_request'))} |"
        )
    return lines


def compile_work(scenario: dict[str, Any]) -> str:
    """What a scenario's processes compiled, per process: "13 Triton kernels; 0 / ..."."""
    per_run = []
    for c in scenario.get("compile_counts") or []:
        parts = [f"{c['graphs']} graphs"] if c["graphs"] else []
        if c["triton_kernels"]:
            parts.append(f"{c['triton_kernels']} Triton kernels")
        if c["kernel_benchmarks"]:
            parts.append(f"{c['kernel_benchmarks']} kernel timings for tuning")
        per_run.append(", ".join(parts) or "nothing counted")
    return "; ".join(per_run) or "no counts"


def warm_start_problems(warm: dict[str, Any] | None) -> list[str]:
    """What a warm scenario did that a warm start must not: compile, or disagree with its
    build or with itself on tokens. One wording for coldstart's warning lines and the
    report's findings."""
    out = []
    if warm and any(warm["compiled"]):
        out.append(
            f"a warm run compiled ({compile_work(warm)}): the artifact did not carry all the warmth"
        )
    matches = (warm or {}).get("matches_build") or []
    if mismatched := [str(i + 1) for i, m in enumerate(matches) if m is False]:
        out.append(
            f"warm run {', '.join(mismatched)} gave other greedy tokens than the cold run "
            "that built its entry: the artifact does not reproduce its build"
        )
    if warm and warm.get("outputs_agree") is False:
        if matches and all(m is True for m in matches):
            out.append(
                "the builds of this key gave different greedy tokens (each warm run matches "
                "the cold run that built its entry): the compiler's tuning picked different "
                "kernels from one build to the next"
            )
        else:
            out.append("the warm processes' greedy tokens differ from one another")
    return out


def findings(report: dict[str, Any]) -> list[str]:
    """Measured facts that contradict what the design expects, stated plainly."""
    out = []
    gpu = is_cuda(report["settings"]["device"])
    for key, p in report["pairs"].items():
        if p["status"] != "ok":
            continue
        sc = p["coldstart"]["scenarios"]
        warm, cold = sc.get("warm"), sc.get("cold")
        out += [f"{key}: {problem}." for problem in warm_start_problems(warm)]
        if cold and not all(cold["compiled"]):
            out.append(f"{key}: a cold run did not compile (were the caches really empty?).")
        if warm and cold and warm["ttfr_s"] >= cold["ttfr_s"]:
            out.append(f"{key}: warm start ({warm['ttfr_s']:.2f} s) is not faster than cold.")
        if gpu and warm and warm["ttfr_s"] > WARM_TTFR_GPU_TARGET_S:
            out.append(
                f"{key}: warm time to first token {warm['ttfr_s']:.1f} s exceeds the "
                f"{WARM_TTFR_GPU_TARGET_S:.0f} s target (docs/perf-notes.md)."
            )
        if (p.get("bench") or {}).get("roofline_note"):
            out.append(f"{key}: {p['bench']['roofline_note']}.")
        be = p["coldstart"].get("break_even_warm")
        if be and be["verdict"] in ("never", "ahead-then-behind"):
            verdict = break_even_verdict(be)
            out.append(f"{key}: not faster than eager per request ({verdict}).")
        if be and break_even_is_uncertain(be):
            out.append(
                f"{key}: the warm break-even is uncertain ({break_even_with_interval(be)}): "
                "more --runs or --iters narrow it."
            )
    return out


def _bytecode_line(b: dict[str, Any] | None) -> str:
    if not b:
        return "not recorded"
    if b.get("torch_bytecode") is False and not b.get("writes_bytecode"):
        return ("none cached and none written: every process compiled each module it "
                "imported, seconds more per start than a normal install")  # fmt: skip
    if b.get("torch_bytecode") is None:
        return "unknown"
    return "cached" if b.get("torch_bytecode") else "written on first import"


def render_markdown(report: dict[str, Any], charts: list[str]) -> str:
    env, st = report["environment"], report["settings"]
    weights = st.get("weights") or f"random (seed {st['seed']})"
    # Every step runs the artifact's max_batch rows: a batch of 1 on a wider one pads.
    rows = f" on artifacts built for max_batch {st['max_batch']}" if st.get("max_batch") else ""
    lines = [
        "# acache comparison report",
        "",
        f"- date: {report['created']}",
        f"- command: `{report['command']}`",
        f"- device: {st['device']} ({env.get('gpu') or env.get('cpu') or 'cpu'}), "
        f"dtype {st['dtype']}{', ' + st['quant'] if st.get('quant') else ''}, weights {weights}",
        f"- versions: python {env.get('python')}, torch {env.get('torch')}, "
        f"triton {env.get('triton')}, cuda {env.get('cuda')}, "
        f"driver {env.get('driver') or 'not recorded'}",
        f"- bytecode: {_bytecode_line(env.get('bytecode'))}",
        f"- setup: batch 1{rows}, the recipe's bench prompt, {st['new_tokens_label']} new tokens, "
        f"greedy, no early stop; {_processes(report)}; "
        f"{st['iters']} timed requests per process after {st['warmup']} excluded",
        f"- modes: {st.get('modes') or {}}",
        "",
        "## Decode tokens/s (seed setup)",
        "",
        *seed_table(report),
        "",
        "## Cold, warm, eager and break-even",
        "",
        "TTFR = seconds from process start to the first generated token (median, min–max). "
        "Break-even uses the warm start against eager; see docs/measurement.md.",
        "",
        *detail_table(report),
        "",
        "## Phases (median seconds per segment)",
        "",
        *phase_table(report),
        "",
    ]
    ttft = prompt_len_table(report)
    if ttft:
        lines += [
            "## Time to first token by prompt length",
            "",
            "One prompt (batch 1) of each length, `generate(ids, 1)` after warm-up; prefill "
            "tok/s = prompt tokens / TTFT p50; % FLOP roofline = prefill FLOPs / TTFT p50 / the "
            "GEMM rate measured in the same process (measure/prefill.py).",
            "",
            *ttft,
            "",
        ]
    found = findings(report)
    lines += ["## Findings", ""] + ([f"- {f}" for f in found] or ["- none"]) + [""]
    if charts:
        lines += ["## Charts", ""] + [f"![{c}]({c})" for c in charts] + [""]
    return "\n".join(lines)


def write_report(report: dict[str, Any], out: Path) -> list[Path]:
    """report.json, report.md and the charts into ``out``; returns the paths written."""
    try:
        out.mkdir(parents=True, exist_ok=True)
        written = [out / "report.json"]
        (out / "report.json").write_text(json.dumps(report, indent=1, sort_keys=True) + "\n")
        charts, note = draw_charts(report, out)
        (out / "report.md").write_text(render_markdown(report, charts) + note)
    except OSError as e:
        raise MeasureError(f"cannot write the report into {out}: {e.strerror or e}") from None
    return written + [out / c for c in charts] + [out / "report.md"]


def main(argv: list[str] | None = None) -> int:
    """Re-render report.md and charts from an existing report.json: ``python -m ...report DIR``."""
    import sys

    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m artifactcache.measure.report OUT_DIR", file=sys.stderr)
        return 1
    out = Path(args[0])
    report = json.loads((out / "report.json").read_text())
    for p in write_report(report, out):
        print(p)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
