"""Measurement commands: coldstart, bench, compare.

Every argument is validated (recipe, backend, numbers, shapes, --out writable)
before any child process is spawned; the measuring happens in fresh probe
processes (artifactcache/measure/child/probe.py), never in this one.
"""

from __future__ import annotations

import contextlib
import shlex
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from ..choices import BuildChoices
from ..errors import ArgumentError, MeasureError
from .app import (
    AllowSharedRoot,
    BackendExtraOpt,
    CacheDir,
    DefaultBackendOpt,
    JsonOut,
    RecipeArg,
    old_spelling,
    parse_backend_extras,
)
from .choices import with_choices
from .module import is_spec
from .render import console, emit_json, err_console, human_bytes, print_wide, shown

NewTokens = Annotated[
    int | None,
    typer.Option(
        "--new-tokens",
        help="New tokens per request (default: the recipe's, capped to its KV cache).",
        show_default=False,
    ),
]
Iters = Annotated[int, typer.Option("--iters", help="Timed requests per process.")]
Warmup = Annotated[int, typer.Option("--warmup", help="Excluded requests before timing.")]
Runs = Annotated[int, typer.Option("--runs", help="Fresh processes per scenario.")]
Builds = Annotated[
    int | None,
    typer.Option(
        "--builds",
        help="Cold (building) processes, 1 to --runs; the warm runs past the last one load "
        "its entry, so --builds 1 --runs 3 is one build and 3 warm starts of it "
        "[default: --runs].",
        show_default=False,
    ),
]
PromptLen = Annotated[
    str | None,
    typer.Option(
        "--prompt-len",
        help="Prompt lengths in tokens, e.g. 16,128,512: also time the first token (prefill "
        "+ one pick, batch 1) of a prompt of each length, with prefill tokens/s and % of the "
        "FLOP roofline (a GEMM measured in the same run). Each must fit max_seq_len - 1; "
        "not a build choice.",
        show_default=False,
    ),
]


def _prompt_lens(text: str | None, recipe_or_specs: list[str]) -> list[int]:
    """--prompt-len parsed (one-line error on bad text); only a recipe has prompts."""
    from ..measure.prefill import parse_prompt_lens

    if text is None:
        return []
    if all(is_spec(r) for r in recipe_or_specs):
        raise MeasureError("--prompt-len is for a recipe (an LLM's prompt), not a model spec")
    return parse_prompt_lens(text)


def _command_line() -> str:
    return "acache " + " ".join(shlex.quote(a) for a in sys.argv[1:])


@contextlib.contextmanager
def _progress(total_hint: str) -> Iterator[Callable[[str, int, int], None]]:
    """A rich progress display on stderr (plain lines when stderr is not a terminal)."""
    from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    if not err_console.is_terminal:
        yield lambda msg, _d, _t: err_console.print(f"[dim]{shown(msg)}[/dim]", highlight=False)
        return
    cols = [SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn()]
    with Progress(*cols, console=err_console, transient=True) as bar:
        task = bar.add_task(total_hint, total=None)

        def update(msg: str, done: int, total: int) -> None:
            bar.update(task, description=msg, completed=done, total=total)
            bar.console.print(f"[dim]{shown(msg)}[/dim]", highlight=False)

        yield update


def _s(x: float | None, fmt: str = "{:.2f} s") -> str:
    return "–" if x is None else fmt.format(x)


def _rate(x: float | None) -> str:
    """A rate with the digits that matter: 3521 GB/s on a GPU, 0.0214 TFLOP/s on a CPU."""
    if x is None:
        return "–"
    return f"{x:.0f}" if x >= 100 else f"{x:.1f}" if x >= 1 else f"{x:.3g}"


def _no_cache_dir(value: str | None) -> None:
    if value is not None:
        raise ArgumentError(
            "--cache-dir: coldstart and compare measure in fresh temporary caches on purpose "
            "(a cold start needs an empty one), so yours is never touched; to time an entry "
            "of your cache, use `acache bench --cache-dir DIR`"
        )


# Hidden: asked for, it says why there is none rather than click's "no such option".
NoCacheDir = Annotated[str | None, typer.Option("--cache-dir", hidden=True, callback=_no_cache_dir)]


def _runs(n: Any) -> str:
    return "1 run" if n == 1 else f"{n} runs"


def _builds(report: dict[str, Any]) -> str:
    st = report["settings"]
    builds = st.get("builds")
    return "" if builds in (None, st.get("runs")) else f", cold: {_runs(builds)}"


def _render_coldstart(report: dict[str, Any], recipe: str, backend: str) -> None:
    from ..measure.report import break_even_with_interval, warm_start_problems

    rows = []
    base = report["baselines"].get(recipe, {})
    if base.get("status") == "ok":
        rows.append(("eager", base["coldstart"]["scenarios"]["eager"]))
    pair = report["pairs"][f"{recipe}/{backend}"]
    if pair["status"] != "ok":
        raise MeasureError(pair["reason"])
    if backend != "eager":
        rows += [(s, pair["coldstart"]["scenarios"][s]) for s in ("cold", "warm")]
    t = Table(
        title=f"coldstart {shown(recipe)} / {backend} ({report['settings']['device']})",
        caption="imports … first token: seconds from the process's start to each point "
        f"(median of {_runs(report['settings'].get('runs'))}{_builds(report)}; first token: "
        "min–max); request: one request's latency once warm",
    )
    for col in ("scenario", "imports", "entry", "weights", "artifact", "first token", "request"):
        t.add_column(col, justify="left" if col == "scenario" else "right")
    t.add_column("compiled")
    for name, s in rows:
        ph = s["phases"]
        cells = [
            _s(ph[k]["median"]) if k in ph else "–"
            for k in ("imports_done", "entry_ready", "weights_ready", "artifact_ready")
        ]
        fr = ph["first_result"]
        span = f"{fr['median']:.2f} s ({fr['min']:.2f}–{fr['max']:.2f})"
        comp = "/".join("yes" if c else "no" for c in s["compiled"])
        t.add_row(name, *cells, span, _s(s["request_latency_s"], "{:.3f} s"), comp)
    print_wide(t)
    cs = pair["coldstart"]
    for problem in warm_start_problems(cs["scenarios"].get("warm")):
        err_console.print(f"warning: {problem}", highlight=False)
    if "cold_warm_ratio" in cs:
        console.print(f"cold/warm time to first token: {cs['cold_warm_ratio']:.1f}x")
    for scen in ("warm", "cold"):
        if f"break_even_{scen}" in cs:
            console.print(
                f"break-even vs eager ({scen} start): "
                f"{break_even_with_interval(cs[f'break_even_{scen}'])}"
            )


@with_choices
def coldstart_cmd(
    recipe: RecipeArg,
    choices: BuildChoices,
    backend: DefaultBackendOpt = None,
    runs: Runs = 3,
    builds: Builds = None,
    new_tokens: NewTokens = None,
    iters: Iters = 10,
    warmup: Warmup = 2,
    out: Annotated[
        Path | None, typer.Option("--out", help="Also write report.json/.md + charts here.")
    ] = None,
    json_out: JsonOut = False,
    prompt_len: PromptLen = None,
    cache_dir: NoCacheDir = None,
) -> None:
    """Cold vs warm vs eager start in fresh processes, and break-even against eager.

    RECIPE may be a model spec (pkg.module:factory); a request is then one call. A
    recipe's request is the seed's batch 1, also on a --max-batch artifact.
    """
    from ..measure import compare

    choices.check_scope("module" if is_spec(recipe) else "recipe")
    lens = _prompt_lens(prompt_len, [recipe])
    spec = compare.spec_for(
        [recipe], [backend], choices, runs=runs, builds=builds, new_tokens=new_tokens,
        iters=iters, warmup=warmup, prompt_lens=tuple(lens),
    )  # fmt: skip
    compare.validate(spec)
    if out is not None:
        compare.check_out_dir(out)
    compare.require_available(spec, backend)
    if backend == "eager":  # after every check: an error stays the one line
        err_console.print(
            "note: eager has no cold or warm start to compare, only its own start; "
            "pass --backend aoti or inductor to see what compiling costs and buys",
            highlight=False,
        )
    units = Path(tempfile.mkdtemp(prefix="acache-coldstart-units-"))
    try:
        with _progress("coldstart") as say:
            report = compare.run_compare(spec, units, command=_command_line(), progress=say)
    finally:
        shutil.rmtree(units, ignore_errors=True)
    if out is not None:
        from ..measure.charts import skipped_charts
        from ..measure.report import write_report

        for chart, why in skipped_charts(report, write_report(report, out)):
            err_console.print(f"note: {chart} not drawn: {why}", highlight=False)
    if json_out:
        emit_json(report)
        return
    _render_coldstart(report, recipe, backend)
    if lens:
        bench = report["pairs"][f"{recipe}/{backend}"]["bench"]
        runs = "eager runs" if backend == "eager" else "warm runs"
        _render_prompt_lens(f"{shown(recipe)} / {backend}, {runs}", [bench])


@with_choices
def bench_cmd(
    recipe: RecipeArg,
    choices: BuildChoices,
    backend: DefaultBackendOpt = None,
    batch: Annotated[
        str | None,
        typer.Option(
            "--batch",
            help="Batch sizes, e.g. 1,8,32 (default 1): a recipe's are measured on an "
            "artifact built for max_batch = that size (built on a miss), or on the "
            "--max-batch one; a model spec's set dimension 0 of every input (one entry each "
            "unless dimension 0 is dynamic).",
            show_default=False,
        ),
    ] = None,
    new_tokens: NewTokens = None,
    iters: Iters = 10,
    warmup: Warmup = 2,
    cache_dir: CacheDir = None,
    allow_shared_root: AllowSharedRoot = False,
    json_out: JsonOut = False,
    batches: Annotated[str | None, typer.Option("--batches", hidden=True)] = None,
    prompt_len: PromptLen = None,
) -> None:
    """Steady-state latency, tokens/s per request and in aggregate, % of both rooflines.

    Uses your cache (building the entry first if it is missing); the build and
    the warm-up are outside the timed loop. A request of batch B is B copies of the
    recipe's bench prompt. With --prompt-len: time to first token, prefill tokens/s and
    % of the FLOP roofline per prompt length. For a model spec (pkg.module:factory):
    call latency percentiles and items/s per batch size.
    """
    from ..measure import bench, benchmark

    lens = _prompt_lens(prompt_len, [recipe])
    batch = old_spelling(batch, batches, "--batch", "--batches")
    if is_spec(recipe):
        from .module import bench_module

        choices.check_scope("module")
        bench_module(
            recipe, backend, choices, batches=batch, iters=iters, warmup=warmup,
            cache_dir=cache_dir, allow_shared_root=allow_shared_root, json_out=json_out,
        )  # fmt: skip
        return
    choices.check_scope("recipe")
    sizes = bench.parse_batches(batch) if batch is not None else [1]
    with _progress("bench") as say:
        results = benchmark.run_bench(
            recipe, backend, choices, sizes, new_tokens=new_tokens, iters=iters, warmup=warmup,
            cache_dir=cache_dir, allow_shared_root=allow_shared_root, progress=say,
            prompt_lens=lens,
        )  # fmt: skip
    if json_out:
        emit_json(results[0] if len(results) == 1 else {"batches": results})
        return
    _render_bench(recipe, backend, choices.device, choices.dtype, results)
    if lens:
        _render_prompt_lens(f"{shown(recipe)} / {backend}", results)


def _render_bench(
    recipe: str, backend: str, device: str, dtype: str, results: list[dict[str, Any]]
) -> None:
    """One column per batch size."""
    first = results[0]
    precision = f"{dtype}, {first['quant']}" if first.get("quant") else dtype
    t = Table(
        title=f"bench {shown(recipe)} / {backend} ({device}, {precision}, "
        f"{first['new_tokens']} new tokens, {first['iterations']} timed)"
    )
    t.add_column("metric")
    for r in results:
        t.add_column(f"batch {r['batch']}", justify="right")

    def row(label: str, cell: Callable[[dict[str, Any]], str]) -> None:
        t.add_row(label, *(cell(r) for r in results))

    def ms(stats: dict[str, float] | None, key: str) -> str:
        return "–" if not stats else f"{stats[key] * 1e3:.2f}"

    row("artifact max_batch (entry)", lambda r: f"{r['max_batch']} ({r['entry']})")
    row("request p50 / p99 s", lambda r: f"{r['request']['p50']:.4f} / {r['request']['p99']:.4f}")
    row("prefill p50 ms", lambda r: ms(r["prefill"], "p50"))
    row("decode step p50 / p99 ms", lambda r: f"{ms(r['step'], 'p50')} / {ms(r['step'], 'p99')}")
    row("decode tok/s per request", lambda r: _rate(r["decode_tok_s"]))
    row("decode tok/s aggregate", lambda r: _rate(r["aggregate_decode_tok_s"]))
    row("request tok/s (incl. prefill)", lambda r: _rate(r["request_tok_s"]))
    row("bytes read per step (KV filled)", lambda r: human_bytes(r["bytes_per_token"]["total"]))
    row(
        f"KV cache allocated (max_seq_len {first['max_seq_len']} x max_batch)",
        lambda r: human_bytes(r["bytes_per_token"]["kv_allocated_bytes"]),
    )
    row("achieved GB/s", lambda r: _rate(r["achieved_gbps"]))
    row("device copy GB/s (same run)", lambda r: _rate(r["copy_gbps"]))
    row("% of bandwidth roofline", lambda r: _s(r["roofline_pct"], "{:.1f}%"))
    row("achieved TFLOP/s", lambda r: _rate(r["achieved_tflops"]))
    row("device matmul TFLOP/s (same run)", lambda r: _rate(r["matmul_tflops"]))
    row("% of FLOP roofline", lambda r: _s(r["flop_roofline_pct"], "{:.1f}%"))
    row("bound by", lambda r: r["roofline_bound"] or "–")
    row("peak host RSS", lambda r: human_bytes(r["memory"]["peak_rss_bytes"]))
    if any("peak_device_allocated_bytes" in r["memory"] for r in results):
        row(
            "peak device memory",
            lambda r: human_bytes(r["memory"].get("peak_device_allocated_bytes", 0)),
        )
    print_wide(t)
    for r in results:
        if r.get("roofline_note"):
            err_console.print(f"note: batch {r['batch']}: {r['roofline_note']}", highlight=False)


def _render_prompt_lens(title: str, results: list[dict[str, Any]]) -> None:
    """One row per (batch column, prompt length): TTFT, prefill tokens/s, % FLOP roofline."""
    several = len(results) > 1
    t = Table(
        title=f"time to first token by prompt length, {title} (one prompt, batch 1)",
        caption="GEMM: a dense matmul in the run's dtype, measured in the same process",
    )
    if several:
        t.add_column("batch column", justify="right")
    for col in ("prompt", "TTFT p50 ms", "min–max ms", "first at this length ms",
                "prefill tok/s", "prefill TFLOP/s", "GEMM TFLOP/s", "% FLOP roofline"):  # fmt: skip
        t.add_column(col, justify="right")
    for r in results:
        for x in r.get("prompt_lengths") or []:
            ttft = x["ttft"]
            cells = [
                str(x["prompt_len"]),
                f"{ttft['p50'] * 1e3:.2f}",
                f"{ttft['min'] * 1e3:.2f}–{ttft['max'] * 1e3:.2f}",
                "–" if x.get("ttft_first_s") is None else f"{x['ttft_first_s'] * 1e3:.2f}",
                _rate(x["prefill_tok_s"]),
                _rate(x["achieved_tflops"]),
                _rate(r.get("gemm_tflops")),
                _s(x["flop_roofline_pct"], "{:.1f}%"),
            ]
            where = f"{r['batch']} (max_batch {r['max_batch']})"
            t.add_row(*([where] if several else []), *cells)
    print_wide(t)


@with_choices(exclude=("mode", "extra"))
def compare_cmd(
    recipes: Annotated[str, typer.Option("--recipes", help="Comma-separated recipes.")],
    backends: Annotated[str, typer.Option("--backends", help="Comma-separated backends.")],
    out: Annotated[Path, typer.Option("--out", help="Report directory.")],
    choices: BuildChoices,
    runs: Runs = 3,
    builds: Builds = None,
    new_tokens: NewTokens = None,
    iters: Iters = 10,
    warmup: Warmup = 2,
    modes: Annotated[
        list[str] | None,
        typer.Option("--modes", help="BACKEND=MODE, e.g. inductor=reduce-overhead (repeatable)."),
    ] = None,
    extra: BackendExtraOpt = None,
    resume: Annotated[
        bool, typer.Option("--resume", help="Reuse finished units in OUT/units (resumable).")
    ] = False,
    json_out: JsonOut = False,
    prompt_len: PromptLen = None,
    cache_dir: NoCacheDir = None,
) -> None:
    """coldstart + bench for every recipe x backend; writes report.json, report.md, PNGs.

    --recipes may name model specs (pkg.module:factory); --input applies to each.
    """
    from ..measure import compare
    from ..measure.charts import skipped_charts
    from ..measure.report import seed_table, write_report

    names = compare.parse_list(recipes, "recipes")
    spec = compare.spec_for(
        names, compare.parse_list(backends, "backends"),
        choices, runs=runs, builds=builds, new_tokens=new_tokens, iters=iters,
        warmup=warmup, modes=compare.parse_modes(modes or []),
        extras=parse_backend_extras(extra),
        prompt_lens=tuple(_prompt_lens(prompt_len, names)),
    )  # fmt: skip
    compare.validate(spec)
    compare.check_out_dir(out)
    with _progress("compare") as say:
        report = compare.run_compare(
            spec,
            out,
            command=_command_line(),
            resume=resume,
            work_root=(out / "work") if resume else None,
            progress=say,
        )
    paths = write_report(report, out)
    for chart, why in skipped_charts(report, paths):
        err_console.print(f"note: {chart} not drawn: {why}", highlight=False)
    if json_out:
        emit_json(report)
        return
    for key, p in report["pairs"].items():
        if p["status"] != "ok":
            err_console.print(f"{key}: {p['status']}: {shown(p['reason'])}", highlight=False)
    console.print("\n".join(seed_table(report)), highlight=False)
    console.print("wrote " + ", ".join(shown(p) for p in paths), highlight=False)


def register(app: typer.Typer) -> None:
    app.command("coldstart")(coldstart_cmd)
    app.command("bench")(bench_cmd)
    app.command("compare")(compare_cmd)
