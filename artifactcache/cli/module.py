"""CLI pieces for a model spec (``pkg.mod:factory`` / ``file.py:factory``) in place of a recipe.

build, run, key, coldstart, bench and compare take a spec where they take a recipe;
this module holds the shared option and the spec-specific bodies, so each command
only branches once. Nothing here imports torch at module level.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer

from ..errors import AcacheError

if TYPE_CHECKING:
    from ..store.protocol import Store

InputOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--input",
        help="For a model spec (pkg.mod:factory): an input SHAPE[:DTYPE[:HIGH]], e.g. "
        "1x3x224x224 or 1x128:int64:30522 (repeatable; default: the factory's inputs).",
        show_default=False,
    ),
]


def is_spec(recipe: str) -> bool:
    from ..module_spec import is_module_spec

    return is_module_spec(recipe)


def refuse_inputs(inputs: list[str] | None) -> None:
    if inputs:
        raise AcacheError("--input is for a model spec (pkg.mod:factory), not for a recipe")


def options_of(mode: str | None, extra: dict[str, Any]) -> dict[str, Any]:
    return {**({"mode": mode} if mode else {}), **extra}


def compile_spec(
    spec_text: str,
    inputs: list[str] | None,
    backend: str,
    *,
    device: str,
    dtype: str,
    mode: str | None,
    extra: dict[str, Any],
    seed: int,
    store: Store,
    force: bool = False,
    batch: int | None = None,
) -> tuple[Any, Any, Any]:
    """(BuildResult, CompiledModule, ModuleSpec): the factory, the key, then hit or build."""
    from ..api import module as module_api
    from ..module_spec import spec_from_cli

    spec = spec_from_cli(spec_text, inputs, device=device, dtype=dtype, seed=seed, batch=batch)
    res, compiled = module_api.compile_with_result(
        spec, backend, options=options_of(mode, extra), store=store, force=force
    )
    return res, compiled, spec


def key_info(
    spec_text: str, inputs: list[str] | None, backend: str, *, device: str, dtype: str,
    mode: str | None, seed: int, extra: dict[str, Any] | None = None,
) -> Any:  # fmt: skip
    from ..api import module as module_api
    from ..module_spec import spec_from_cli

    spec = spec_from_cli(spec_text, inputs, device=device, dtype=dtype, seed=seed)
    opts = module_api.module_options(backend, spec, options_of(mode, extra or {}))
    return module_api.module_key_for(backend, spec, opts)[1]


def output_summary(out: Any) -> list[dict[str, Any]]:
    """Each output tensor's path in the output structure, shape, dtype and checksum."""
    import torch

    from ..backends.shared.torch_private import output_leaves

    rows = []
    for path, t in output_leaves(out):
        if not isinstance(t, torch.Tensor):
            continue
        rows.append(
            {
                "output": path or "output",
                "shape": list(t.shape),
                "dtype": str(t.dtype).removeprefix("torch."),
                "checksum": float(t.detach().double().sum().item()),
            }
        )
    return rows


def parse_batches(text: str | None) -> list[int | None]:
    """``1,32`` -> [1, 32]; None -> [None] (the inputs' own batch)."""
    from ..errors import MeasureError

    if text is None:
        return [None]
    try:
        sizes = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise MeasureError(f"--batches takes integers like 1,32, got {text!r}") from None
    if not sizes or min(sizes) < 1:
        raise MeasureError(f"--batches takes sizes of at least 1, got {text!r}")
    return list(dict.fromkeys(sizes))


def bench_module(
    spec_text: str, backend: str, *, inputs: list[str] | None, batches: str | None,
    device: str, dtype: str, mode: str | None, iters: int, warmup: int, seed: int,
    cache_dir: Any, allow_shared_root: bool, json_out: bool, extra: dict[str, Any] | None = None,
) -> None:  # fmt: skip
    """`acache bench SPEC`: one probe per batch size; latency percentiles and items/s."""
    import tempfile
    from pathlib import Path

    from rich.table import Table

    from ..errors import MeasureError
    from ..measure import bench, coldstart
    from ..module_spec import check_cli_spec
    from .app import console, emit_json, err_console, shown

    sizes = parse_batches(batches)
    for b in sizes:
        check_cli_spec(spec_text, inputs, dtype, b)
    if iters < 1 or warmup < 1:
        raise MeasureError(f"--iters and --warmup must be at least 1, got {iters} and {warmup}")
    rows = []
    for b in sizes:
        ps = coldstart.ProbeSpec(
            recipe=spec_text, backend=backend, device=device, dtype=dtype, mode=mode,
            seed=seed, iters=iters, warmup=warmup, inputs=list(inputs or []), batch=b,
            extra=dict(extra or {}),
            extra_flags=["--allow-shared-root"] if allow_shared_root else [],
        )  # fmt: skip
        log = Path(tempfile.mkstemp(prefix="acache-bench-", suffix=".log")[1])
        err_console.print(f"[dim]bench {shown(spec_text)}/{backend} batch {b or 'as given'}[/dim]")
        probe = coldstart.spawn_probe(ps, cache_dir, log_path=log)  # kept on failure
        log.unlink(missing_ok=True)
        res = bench.summarize_module([probe])
        res.update(
            recipe=spec_text, backend=backend, device=device, dtype=dtype, mode=mode,
            key=probe.get("key"), phases=probe["phases"], memory=probe["memory"],
            environment=probe["environment"],
        )  # fmt: skip
        rows.append(res)
    if json_out:
        emit_json({"kind": "module", "recipe": spec_text, "backend": backend, "batches": rows})
        return
    title = f"bench {shown(spec_text)} / {backend} ({device}, {dtype}, {iters} timed calls)"
    t = Table(title=title)
    for col in ("batch", "inputs", "p50 ms", "p90 ms", "p99 ms", "items/s"):
        t.add_column(col, justify="left" if col == "inputs" else "right")
    for r in rows:
        lat = r["latency"]
        t.add_row(
            str(r["batch"]), ", ".join(r["inputs"] or []),
            *(f"{lat[q] * 1e3:.2f}" for q in ("p50", "p90", "p99")),
            f"{r['items_per_s']:.1f}" if r["items_per_s"] else "–",
        )  # fmt: skip
    console.print(t)
