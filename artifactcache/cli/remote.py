"""Remote tier commands: push, pull, prewarm (and the rows behind `ls --remote`).

Explicit commands fail loudly: a wrong bucket, rejected credentials, a down
server or a read-only push is one `error:` line and exit 1. Implicit pushes
during a build only warn (see store/remote.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from ..errors import RemoteError
from .app import (
    AllowSharedRoot,
    BackendOpt,
    CacheDir,
    DeviceOpt,
    DtypeOpt,
    ExtraOpt,
    JsonOut,
    ModeOpt,
    RecipeArg,
    Remote,
    RemoteReadOnly,
    SeedOpt,
    WeightsOpt,
    check_prefixes,
    console,
    emit_json,
    human_bytes,
    open_store,
    parse_extra,
)

Keys = Annotated[list[str], typer.Argument(help="Keys or unique prefixes (>= 8 hex chars).")]


def _tiered(
    cache_dir: Path | None, allow_shared_root: bool, remote: str | None, read_only: bool
) -> Any:
    if not remote:
        raise RemoteError(
            "no remote configured: pass --remote s3://bucket/prefix or set ACACHE_REMOTE"
        )
    return open_store(cache_dir, allow_shared_root, remote, read_only)


def _render(rows: list[dict[str, Any]], json: bool) -> None:
    if json:
        emit_json(rows)
        return
    for r in rows:
        console.print(
            f"{r['key'][:12]}  {r['status']:<7} {human_bytes(r['bytes']):>10}  {r['seconds']:.2f}s",
            highlight=False,
        )


# `acache ls --remote` (the ls command lives in cli/cache.py): a flag, since a bare
# `--remote` cannot take an optional value in Typer; the URL comes from
# --remote-url or ACACHE_REMOTE.
RemoteFlag = Annotated[
    bool, typer.Option("--remote", help="List the remote tier (ACACHE_REMOTE) instead.")
]
RemoteUrl = Annotated[
    str | None,
    typer.Option(
        "--remote-url", envvar="ACACHE_REMOTE", help="Remote for --remote.", show_default=False
    ),
]


def ls_remote(url: str | None, json: bool) -> None:
    """`acache ls --remote`: one row per remote key; incomplete uploads are marked."""
    from ..store.remote import list_remote

    if not url:
        raise RemoteError(
            "no remote configured: pass --remote-url s3://bucket/prefix or set ACACHE_REMOTE"
        )
    rows = list_remote(url)
    if json:
        emit_json(rows)
        return
    table = Table(title=f"{len(rows)} entries in {url}")
    for col in ("key", "recipe", "backend", "size", "build", "state"):
        table.add_column(col, overflow="fold")
    for r in rows:
        label = r.get("label", {})
        table.add_row(
            r["key"][:12],
            str(label.get("recipe", "-")),
            str(label.get("backend", "-")),
            human_bytes(r["size"]) if r["complete"] else "-",
            f"{r['build_seconds']:.1f}s" if r["complete"] else "-",
            "ok" if r["complete"] else r["problem"],
        )
    console.print(table)


def register(app: typer.Typer) -> None:
    @app.command("push")
    def push(
        keys: Keys,
        cache_dir: CacheDir = None,
        allow_shared_root: AllowSharedRoot = False,
        remote: Remote = None,
        remote_read_only: RemoteReadOnly = False,
        replace: Annotated[
            bool,
            typer.Option("--replace", help="Overwrite the remote copy (repairs a corrupt one)."),
        ] = False,
        json: JsonOut = False,
    ):
        """Upload local entries to the remote: files first, manifest last."""
        check_prefixes(keys)
        store = _tiered(cache_dir, allow_shared_root, remote, remote_read_only)
        _render([store.push(k, replace=replace) for k in keys], json)

    @app.command("pull")
    def pull(
        keys: Keys,
        cache_dir: CacheDir = None,
        allow_shared_root: AllowSharedRoot = False,
        remote: Remote = None,
        remote_read_only: RemoteReadOnly = False,
        json: JsonOut = False,
    ):
        """Download entries from the remote, verify every digest, publish them locally."""
        check_prefixes(keys, hint="see `acache ls --remote`")
        store = _tiered(cache_dir, allow_shared_root, remote, remote_read_only)
        _render([store.pull(k) for k in keys], json)

    @app.command("prewarm")
    def prewarm(
        recipe: RecipeArg,
        backend: BackendOpt,
        device: DeviceOpt = "cpu",
        dtype: DtypeOpt = "fp32",
        mode: ModeOpt = None,
        weights: WeightsOpt = None,
        seed: SeedOpt = 0,
        extra: ExtraOpt = None,
        cache_dir: CacheDir = None,
        allow_shared_root: AllowSharedRoot = False,
        remote: Remote = None,
        remote_read_only: RemoteReadOnly = False,
        json: JsonOut = False,
    ):
        """Pull and verify the artifact a recipe + backend needs (for a deploy hook); no build."""
        from ..api import key_for, make_context

        b, ctx = make_context(
            recipe, backend, device=device, dtype=dtype, mode=mode, weights=weights, seed=seed,
            extra=parse_extra(extra),
        )  # fmt: skip
        store = _tiered(cache_dir, allow_shared_root, remote, remote_read_only)
        info = key_for(b, ctx, memo_dir=store.base)
        row = store.pull(info.key)  # KeyLookupError (one line) if the remote lacks it
        row.update(recipe=ctx.recipe.name, backend=b.name)
        _render([row], json)
