"""Measurement commands: coldstart, bench, compare.

Every argument is validated (recipe, backend, numbers, shapes, --out writable)
before any child process is spawned; the measuring happens in fresh probe
processes (artifactcache/measure/probe.py), never in this one.
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

from ..errors import MeasureError
from .app import (
    AllowSharedRoot,
    BackendExtraOpt,
    BackendOpt,
    CacheDir,
    DeviceOpt,
    DtypeOpt,
    ExtraOpt,
    JsonOut,
    MaxSeqLenOpt,
    ModeOpt,
    QuantOpt,
    RecipeArg,
    SeedOpt,
    WeightsOpt,
    console,
    emit_json,
    err_console,
    human_bytes,
    parse_backend_extras,
    parse_extra,
    refuse_max_seq_len,
    refuse_quant,
)
from .module import InputOpt, is_spec, refuse_inputs

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


def _command_line() -> str:
    return "acache " + " ".join(shlex.quote(a) for a in sys.argv[1:])


@contextlib.contextmanager
def _progress(total_hint: str) -> Iterator[Callable[[str, int, int], None]]:
    """A rich progress display on stderr (plain lines when stderr is not a terminal)."""
    from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    if not err_console.is_terminal:
        yield lambda msg, _d, _t: err_console.print(f"[dim]{msg}[/dim]", highlight=False)
        return
    cols = [SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn()]
    with Progress(*cols, console=err_console, transient=True) as bar:
        task = bar.add_task(total_hint, total=None)

        def update(msg: str, done: int, total: int) -> None:
            bar.update(task, description=msg, completed=done, total=total)
            bar.console.print(f"[dim]{msg}[/dim]", highlight=False)

        yield update


def _spec(recipes: list[str], backends: list[str], **kw: Any):
    from ..measure.compare import CompareSpec

    if kw.get("weights") is not None:
        kw["weights"] = str(kw["weights"])  # the probe's argv
    return CompareSpec(recipes=recipes, backends=backends, **kw)


def _require_available(spec: Any, backend: str) -> None:
    from ..errors import BackendUnavailable
    from ..measure.compare import availability

    ok, reason = availability(spec)[backend]
    if not ok:
        raise BackendUnavailable(f"backend {backend!r} is unavailable here: {reason}")


def _s(x: float | None, fmt: str = "{:.2f} s") -> str:
    return "–" if x is None else fmt.format(x)


def _render_coldstart(report: dict[str, Any], recipe: str, backend: str) -> None:
    from ..measure.report import break_even_verdict

    rows = []
    base = report["baselines"].get(recipe, {})
    if base.get("status") == "ok":
        rows.append(("eager", base["coldstart"]["scenarios"]["eager"]))
    pair = report["pairs"][f"{recipe}/{backend}"]
    if pair["status"] != "ok":
        raise MeasureError(pair["reason"])
    if backend != "eager":
        rows += [(s, pair["coldstart"]["scenarios"][s]) for s in ("cold", "warm")]
    t = Table(title=f"coldstart {recipe} / {backend} ({report['settings']['device']})")
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
    console.print(t)
    cs = pair["coldstart"]
    if "cold_warm_ratio" in cs:
        console.print(f"cold/warm time to first token: {cs['cold_warm_ratio']:.1f}x")
    for scen in ("warm", "cold"):
        if f"break_even_{scen}" in cs:
            console.print(
                f"break-even vs eager ({scen} start): "
                f"{break_even_verdict(cs[f'break_even_{scen}'])}"
            )


def coldstart_cmd(
    recipe: RecipeArg,
    backend: BackendOpt = "inductor",
    runs: Runs = 3,
    device: DeviceOpt = "cpu",
    dtype: DtypeOpt = "fp32",
    mode: ModeOpt = None,
    new_tokens: NewTokens = None,
    max_seq_len: MaxSeqLenOpt = None,
    iters: Iters = 3,
    weights: WeightsOpt = None,
    seed: SeedOpt = 0,
    extra: ExtraOpt = None,
    quant: QuantOpt = None,
    out: Annotated[
        Path | None, typer.Option("--out", help="Also write report.json/.md + charts here.")
    ] = None,
    json_out: JsonOut = False,
    inputs: InputOpt = None,
) -> None:
    """Cold vs warm vs eager start in fresh processes, and break-even against eager.

    RECIPE may be a model spec (pkg.module:factory); a request is then one call.
    """
    from ..measure import compare

    extras = parse_extra(extra)
    if not is_spec(recipe):
        refuse_inputs(inputs)
    spec = _spec(
        [recipe],
        [backend],
        inputs=list(inputs or []),
        device=device,
        dtype=dtype,
        weights=weights,
        seed=seed,
        runs=runs,
        new_tokens=new_tokens,
        max_seq_len=max_seq_len,
        iters=iters,
        modes={backend: mode} if mode else {},
        extras={backend: extras} if extras else {},
        quant=quant,
    )
    compare.validate(spec)
    if out is not None:
        compare.check_out_dir(out)
    _require_available(spec, backend)
    units = Path(tempfile.mkdtemp(prefix="acache-coldstart-units-"))
    try:
        with _progress("coldstart") as say:
            report = compare.run_compare(spec, units, command=_command_line(), progress=say)
    finally:
        shutil.rmtree(units, ignore_errors=True)
    if out is not None:
        from ..measure.report import write_report

        write_report(report, out)
    if json_out:
        emit_json(report)
        return
    _render_coldstart(report, recipe, backend)


def bench_cmd(
    recipe: RecipeArg,
    backend: BackendOpt = "eager",
    device: DeviceOpt = "cpu",
    dtype: DtypeOpt = "fp32",
    mode: ModeOpt = None,
    batch: Annotated[int, typer.Option("--batch", help="Batch size (must fit the recipe).")] = 1,
    new_tokens: NewTokens = None,
    max_seq_len: MaxSeqLenOpt = None,
    iters: Iters = 10,
    warmup: Warmup = 2,
    weights: WeightsOpt = None,
    seed: SeedOpt = 0,
    extra: ExtraOpt = None,
    quant: QuantOpt = None,
    cache_dir: CacheDir = None,
    allow_shared_root: AllowSharedRoot = False,
    json_out: JsonOut = False,
    inputs: InputOpt = None,
    batches: Annotated[
        str | None,
        typer.Option(
            "--batches",
            help="For a model spec: batch sizes, e.g. 1,32 (each sets dimension 0 of every "
            "input; one entry each unless dimension 0 is dynamic).",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Steady-state latency p50/p90/p99, decode tokens/s and % of roofline.

    Uses your cache (building the entry first if it is missing); the build and
    the warm-up are outside the timed loop. For a model spec (pkg.module:factory):
    call latency percentiles and items/s per batch size.
    """
    from ..measure import bench, coldstart, compare

    extras = parse_extra(extra)
    if is_spec(recipe):
        from .module import bench_module

        refuse_max_seq_len(max_seq_len)
        refuse_quant(quant)
        bench_module(
            recipe, backend, inputs=inputs, batches=batches, device=device, dtype=dtype,
            mode=mode, iters=iters, warmup=warmup, seed=seed, cache_dir=cache_dir,
            allow_shared_root=allow_shared_root, json_out=json_out, extra=extras,
        )  # fmt: skip
        return
    refuse_inputs(inputs)
    if batches is not None:
        raise MeasureError("--batches is for a model spec; a recipe takes --batch")
    spec = _spec(
        [recipe],
        [backend],
        device=device,
        dtype=dtype,
        weights=weights,
        seed=seed,
        new_tokens=new_tokens,
        max_seq_len=max_seq_len,
        iters=iters,
        warmup=warmup,
        modes={backend: mode} if mode else {},
        extras={backend: extras} if extras else {},
        quant=quant,
    )
    recipes = compare.validate(spec)
    bench.check_batch(recipes[recipe], batch)
    _require_available(spec, backend)
    ps = coldstart.ProbeSpec(
        recipe=recipe,
        backend=backend,
        device=device,
        dtype=dtype,
        mode=mode,
        weights=str(weights) if weights else None,
        seed=seed,
        new_tokens=new_tokens,
        max_seq_len=max_seq_len,
        iters=iters,
        warmup=warmup,
        copy_bandwidth=True,
        extra=extras,
        quant=quant,
        extra_flags=["--allow-shared-root"] if allow_shared_root else [],
    )
    log = Path(tempfile.mkstemp(prefix="acache-bench-", suffix=".log")[1])
    with _progress("bench") as say:
        say(f"bench {recipe}/{backend}: load (builds on a miss), {iters} timed requests", 0, 1)
        probe = coldstart.spawn_probe(ps, cache_dir, log_path=log)  # kept on failure
    log.unlink(missing_ok=True)
    res = bench.summarize(recipes[recipe], dtype, [probe], quant=quant)
    res.update(
        recipe=recipe,
        backend=backend,
        device=device,
        dtype=dtype,
        mode=mode,
        quant=quant,
        phases=probe["phases"],
        memory=probe["memory"],
        environment=probe["environment"],
        runner_info=probe.get("runner_info", {}),
    )
    if json_out:
        emit_json(res)
        return
    precision = f"{dtype}, {quant}" if quant else dtype
    t = Table(
        title=f"bench {recipe} / {backend} ({device}, {precision}, batch 1, "
        f"{res['new_tokens']} new tokens, {res['iterations']} timed)"
    )
    t.add_column("metric")
    t.add_column("value", justify="right")
    req, pre = res["request"], res["prefill"]
    t.add_row(
        "request p50 / p90 / p99", f"{req['p50']:.4f} / {req['p90']:.4f} / {req['p99']:.4f} s"
    )
    t.add_row(
        "prefill p50 / p90 / p99",
        f"{pre['p50'] * 1e3:.2f} / {pre['p90'] * 1e3:.2f} / {pre['p99'] * 1e3:.2f} ms",
    )
    t.add_row("decode tokens/s", _s(res["decode_tok_s"], "{:.1f}"))
    t.add_row("request tokens/s (incl. prefill)", f"{res['request_tok_s']:.1f}")
    bpt = res["bytes_per_token"]
    t.add_row("bytes read per token (KV filled)", human_bytes(bpt["total"]))
    t.add_row(
        f"KV cache allocated (max_seq_len {recipes[recipe].shapes.max_seq_len})",
        human_bytes(bpt["kv_allocated_bytes"]),
    )
    t.add_row("achieved GB/s", _s(res["achieved_gbps"], "{:.1f}"))
    t.add_row("device copy GB/s (same run)", _s(res["copy_gbps"], "{:.1f}"))
    t.add_row("% of roofline", _s(res["roofline_pct"], "{:.1f}%"))
    t.add_row("peak host RSS", human_bytes(res["memory"]["peak_rss_bytes"]))
    if "peak_device_allocated_bytes" in res["memory"]:
        t.add_row("peak device memory", human_bytes(res["memory"]["peak_device_allocated_bytes"]))
    console.print(t)


def compare_cmd(
    recipes: Annotated[str, typer.Option("--recipes", help="Comma-separated recipes.")],
    backends: Annotated[str, typer.Option("--backends", help="Comma-separated backends.")],
    out: Annotated[Path, typer.Option("--out", help="Report directory.")],
    device: DeviceOpt = "cpu",
    dtype: DtypeOpt = "fp32",
    runs: Runs = 1,
    new_tokens: NewTokens = None,
    max_seq_len: MaxSeqLenOpt = None,
    iters: Iters = 3,
    modes: Annotated[
        list[str] | None,
        typer.Option("--modes", help="BACKEND=MODE, e.g. inductor=reduce-overhead (repeatable)."),
    ] = None,
    weights: WeightsOpt = None,
    seed: SeedOpt = 0,
    extra: BackendExtraOpt = None,
    quant: QuantOpt = None,
    resume: Annotated[
        bool, typer.Option("--resume", help="Reuse finished units in OUT/units (resumable).")
    ] = False,
    json_out: JsonOut = False,
    inputs: InputOpt = None,
) -> None:
    """coldstart + bench for every recipe x backend; writes report.json, report.md, PNGs.

    --recipes may name model specs (pkg.module:factory); --input applies to each.
    """
    from ..measure import compare
    from ..measure.report import seed_table, write_report

    spec = _spec(
        compare.parse_list(recipes, "recipes"),
        compare.parse_list(backends, "backends"),
        inputs=list(inputs or []),
        device=device,
        dtype=dtype,
        weights=weights,
        seed=seed,
        runs=runs,
        new_tokens=new_tokens,
        max_seq_len=max_seq_len,
        iters=iters,
        modes=compare.parse_modes(modes or []),
        extras=parse_backend_extras(extra),
        quant=quant,
    )
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
    if json_out:
        emit_json(report)
        return
    for key, p in report["pairs"].items():
        if p["status"] != "ok":
            err_console.print(f"{key}: {p['status']}: {p['reason']}", highlight=False)
    console.print("\n".join(seed_table(report)), highlight=False)
    console.print("wrote " + ", ".join(str(p) for p in paths), highlight=False)


def register(app: typer.Typer) -> None:
    app.command("coldstart")(coldstart_cmd)
    app.command("bench")(bench_cmd)
    app.command("compare")(compare_cmd)
