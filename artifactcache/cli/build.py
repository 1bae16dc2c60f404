"""`acache recipes`, `acache recipe`, `acache build`: thin wrappers over artifactcache.api.

Heavy imports (torch, the backends) happen inside the command functions, so
`acache --help` and the cache commands stay fast.
"""

from __future__ import annotations

import sys
from dataclasses import asdict
from typing import TYPE_CHECKING, Annotated, Any

import typer

from .app import (
    AllowSharedRoot,
    CacheDir,
    DefaultBackendOpt,
    JsonOut,
    RebuildUntrusted,
    RecipeArg,
    Remote,
    RemoteReadOnly,
    RemoteTrustUnsigned,
    SigningKeyOpt,
    TrustedKeysOpt,
    open_store,
)
from .choices import with_choices
from .module import is_spec
from .render import console, emit_json, err_console, human_bytes, print_table, progress

if TYPE_CHECKING:
    from ..choices import BuildChoices
    from ..store.protocol import Store


def register(app: typer.Typer) -> None:
    @app.command("recipes")
    def recipes_cmd(json_out: JsonOut = False) -> None:
        """List the built-in recipes."""
        from ..recipes import list_recipes

        recs = list_recipes()
        if json_out:
            emit_json(
                [
                    {
                        "name": r.name,
                        "family": r.family,
                        "description": r.description,
                        "source": r.source,
                        "model": asdict(r.model),
                        "shapes": asdict(r.shapes),
                        "bench": asdict(r.bench),
                    }
                    for r in recs
                ]
            )
            return
        cols = ["recipe", "family", "dim", "layers", "heads/kv", "vocab", "description"]
        rows = [
            [r.name, r.family, r.model.dim, r.model.n_layers,
             f"{r.model.n_heads}/{r.model.n_kv_heads}", r.model.vocab_size, r.description]
            for r in recs
        ]  # fmt: skip
        print_table(None, cols, rows)

    @app.command("recipe")
    def recipe_cmd(recipe: RecipeArg, json_out: JsonOut = False) -> None:
        """Print a recipe as TOML: for a checkpoint folder, the one derived from its config.json.

        Save it, edit [shapes] or [bench], and pass the file as RECIPE: it names the
        folder's weights and gives the same key as the folder while unedited.
        """
        from ..recipes import load_recipe, recipe_to_dict, recipe_to_toml

        rec = load_recipe(recipe)
        if json_out:
            emit_json(recipe_to_dict(rec))
            return
        sys.stdout.write(recipe_to_toml(rec))

    @app.command("build")
    @with_choices
    def build_cmd(
        recipe: RecipeArg,
        choices: BuildChoices,
        backend: DefaultBackendOpt = None,
        force: Annotated[bool, typer.Option("--force", help="Rebuild even on a hit.")] = False,
        json_out: JsonOut = False,
        cache_dir: CacheDir = None,
        allow_shared_root: AllowSharedRoot = False,
        remote: Remote = None,
        remote_read_only: RemoteReadOnly = False,
        signing_key: SigningKeyOpt = None,
        trusted_keys: TrustedKeysOpt = None,
        remote_trust_unsigned: RemoteTrustUnsigned = False,
        rebuild_untrusted: RebuildUntrusted = False,
    ) -> None:
        """Build an artifact into the cache (a hit returns at once); print its key.

        RECIPE may be a model spec, pkg.module:factory or path/file.py:factory.
        """
        from .. import api

        store_opts = dict(
            signing_key=signing_key,
            trusted_keys=trusted_keys,
            trust_unsigned=remote_trust_unsigned,
            rebuild_untrusted=rebuild_untrusted,
        )
        # Every argument is checked before the store is opened (a spec's factory runs).
        if is_spec(recipe):
            from ..devices import check_device
            from .module import checked_spec, compile_spec

            choices.check_scope("module")
            check_device(choices.device)  # a GPU torch cannot see: before the spec's import
            mspec = checked_spec(recipe, backend, choices)

            def build(store: Store) -> Any:
                return compile_spec(mspec, backend, choices, store=store, force=force)[0]
        else:
            api.make_context(recipe, backend, choices, check_checkpoint=True)

            def build(store: Store) -> Any:
                return api.build(recipe, backend, choices, force=force, store=store)

        store = open_store(cache_dir, allow_shared_root, remote, remote_read_only, **store_opts)
        with progress(f"building {recipe} with {backend}"):
            res = build(store)
        _print_build(res, json_out)


def status_of(res: Any) -> str:
    """How an entry came: built here, pulled from the remote tier, or a local hit."""
    return "built" if res.built else ("pulled" if res.source == "pulled" else "hit")


def _print_build(res: Any, json_out: bool) -> None:
    if json_out:
        emit_json(
            {
                "key": res.key,
                "status": status_of(res),
                "built": res.built,
                "source": res.source,
                "seconds": round(res.seconds, 3),
                "bytes": res.bytes,
                "path": str(res.entry.path),
                "phases": res.phases,
            }
        )
        return
    console.print(
        f"{res.key}  {status_of(res)}  {res.seconds:.2f} s  {human_bytes(res.bytes)}",
        highlight=False,
    )
    if line := res.phases_summary():
        err_console.print(line, highlight=False)  # stdout stays the one line scripts read
