"""CLI pieces for a model spec (``pkg.mod:factory`` / ``file.py:factory``) in place of a recipe.

build, run, key, coldstart, bench and compare take a spec where they take a recipe;
this module holds the shared option and the spec-specific bodies, so each command
only branches once. Nothing here imports torch at module level.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..choices import BuildChoices
    from ..store.protocol import Store


def is_spec(recipe: str) -> bool:
    from ..sources.module import is_module_spec

    return is_module_spec(recipe)


def checked_spec(spec_text: str, backend: str, choices: BuildChoices) -> Any:
    """The ModuleSpec (its factory called, its inputs made) with the backend's options and
    availability checked: what a command does before it opens the cache, so that a
    factory that raises or a choice that does not fit leaves the cache as it was."""
    from ..api import module_options
    from ..api.module import check_module_choices, module_choices, spec_of

    spec = spec_of(spec_text, choices)
    check_module_choices(backend, module_choices(backend, spec, module_options(choices)))
    return spec


def compile_spec(
    spec: Any, backend: str, choices: BuildChoices, *, store: Store, force: bool = False
) -> tuple[Any, Any]:
    """(BuildResult, CompiledModule) for a checked_spec(): the key, then hit or build."""
    from ..api import module_options
    from ..api.module import compile_with_result

    return compile_with_result(
        spec, backend, options=module_options(choices), store=store, force=force
    )


def key_info(spec_text: str, backend: str, choices: BuildChoices) -> Any:
    from ..api import module_options
    from ..api.module import module_choices, module_key_for, spec_of

    spec = spec_of(spec_text, choices)
    opts = module_choices(backend, spec, module_options(choices))
    return module_key_for(backend, spec, opts)[1]


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


def bench_module(
    spec_text: str, backend: str, choices: BuildChoices, *, batches: str | None, iters: int,
    warmup: int, cache_dir: Any, allow_shared_root: bool, json_out: bool,
) -> None:  # fmt: skip
    """`acache bench SPEC`: one probe per batch size; latency percentiles and items/s."""
    from rich.table import Table

    from ..measure import bench, benchmark
    from .render import emit_json, err_console, print_wide, shown

    def say(msg: str, _done: int, _total: int) -> None:
        err_console.print(f"[dim]{shown(msg)}[/dim]")

    rows = benchmark.run_module_bench(
        spec_text, backend, choices, bench.parse_module_batches(batches), iters=iters,
        warmup=warmup, cache_dir=cache_dir, allow_shared_root=allow_shared_root, progress=say,
    )  # fmt: skip
    if json_out:
        emit_json({"kind": "module", "recipe": spec_text, "backend": backend, "batches": rows})
        return
    title = (
        f"bench {shown(spec_text)} / {backend} ({choices.device}, {choices.dtype}, "
        f"{iters} timed calls)"
    )
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
    print_wide(t)
