"""`acache key` and `acache diff`: what a build would be keyed by, and why two keys differ.

``key --diff PREFIX`` answers "why did this miss?": the factors that part the key
these arguments give from an entry already in the cache.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from ..choices import BuildChoices
from .app import (
    AllowSharedRoot,
    BackendOpt,
    CacheDir,
    JsonOut,
    RecipeArg,
    check_prefixes,
    open_store,
)
from .choices import with_choices
from .module import is_spec
from .render import console, emit_json, print_table


def _store(cache_dir: Path | None, allow_shared_root: bool) -> Any:
    return open_store(cache_dir, allow_shared_root)  # local only: no --remote here


def _print_diff(diffs: list[Any], name_a: str, name_b: str, json: bool, **extra: Any) -> None:
    if json:
        rows = [{"factor": d.path, "a": d.a, "b": d.b} for d in diffs]
        emit_json({**extra, "differ": rows} if extra else rows)  # diff's list, as it was
        return
    if not diffs:
        console.print(f"{name_a} and {name_b} have identical factors", highlight=False)
        return
    said = "1 factor differs" if len(diffs) == 1 else f"{len(diffs)} factors differ"
    print_table(said, ["factor", name_a, name_b],
                [[d.path, d.a, d.b] for d in diffs])  # fmt: skip


def register(app: typer.Typer) -> None:
    @app.command("key")
    @with_choices
    def key(
        recipe: RecipeArg,
        backend: BackendOpt,
        choices: BuildChoices,
        explain: Annotated[bool, typer.Option("--explain", help="Print every factor.")] = False,
        diff_with: Annotated[
            str | None,
            typer.Option(
                "--diff",
                metavar="KEY",
                help="Name the factors that part this key from a cached entry's (a key or "
                "prefix): why a build missed it.",
            ),
        ] = None,
        cache_dir: CacheDir = None,
        allow_shared_root: AllowSharedRoot = False,
        json: JsonOut = False,
    ):
        """Print the cache key a build would use (and, with --explain, what it covers).

        RECIPE may be a model spec (pkg.module:factory) with its --input shapes.
        """
        from ..keys import diff_factors, flatten

        if diff_with is not None:
            check_prefixes([diff_with])
        store = None  # opened after the arguments are checked, and only where needed
        if is_spec(recipe):
            from .module import key_info

            info = key_info(recipe, backend, choices)
        else:
            from ..api import key_for, make_context

            # A key says what a build would be keyed by; whether it fits here is the build's
            # question, so memory is not checked. A checkpoint that no build could load
            # has no key worth printing.
            b, ctx = make_context(
                recipe, backend, choices, check_memory=False, check_checkpoint=True
            )
            # Only a real checkpoint needs the store (its digest memo lives there).
            if ctx.weights.path is not None:
                store = _store(cache_dir, allow_shared_root)
            info = key_for(b, ctx, memo_dir=store.base if store is not None else None)
        if diff_with is not None:
            store = store if store is not None else _store(cache_dir, allow_shared_root)
            entry = store.peek(diff_with)
            diffs = diff_factors(entry.factors, info.factors)
            _print_diff(diffs, entry.key[:12], f"{info.key[:12]} (these arguments)", json,
                        key=info.key, entry=entry.key)  # fmt: skip
            return
        if json:
            emit_json(
                {
                    "key": info.key,
                    "full_key": info.full_key,
                    "arch_key": info.arch_key,
                    "factors": info.factors,
                }
            )
            return
        console.print(info.key, highlight=False)
        if explain:
            print_table(None, ["factor", "value"], flatten(info.factors))

    @app.command("diff")
    def diff(
        key1: Annotated[str, typer.Argument(help="First key or prefix.")],
        key2: Annotated[str, typer.Argument(help="Second key or prefix.")],
        cache_dir: CacheDir = None,
        allow_shared_root: AllowSharedRoot = False,
        json: JsonOut = False,
    ):
        """Name the factors that differ between two entries (a key not built yet: `acache
        key ... --diff KEY`)."""
        from ..keys import diff_factors

        check_prefixes([key1, key2])
        store = _store(cache_dir, allow_shared_root)
        a, b = store.peek(key1), store.peek(key2)
        _print_diff(diff_factors(a.factors, b.factors), a.key[:12], b.key[:12], json)
