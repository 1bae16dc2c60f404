"""`acache recipes`, `acache build`, `acache run`: thin wrappers over artifactcache.api.

Heavy imports (torch, the backends) happen inside the command functions, so
`acache --help` and the cache commands stay fast.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict
from typing import Annotated, Any

import typer

from ..errors import ArgumentError
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
    RemoteTrustUnsigned,
    SeedOpt,
    SigningKeyOpt,
    TrustedKeysOpt,
    WeightsOpt,
    console,
    emit_json,
    err_console,
    human_bytes,
    open_store,
    parse_extra,
)


@contextlib.contextmanager
def _spinner(text: str) -> Iterator[None]:
    """A spinner on stderr while something slow runs, only when a person watches."""
    if sys.stderr.isatty():
        with err_console.status(text):
            yield
    else:
        yield


def parse_token_ids(text: str) -> list[int]:
    """'1,2,3' or '1 2 3' -> [1, 2, 3]; anything else is a one-line error."""
    parts = text.replace(",", " ").split()
    if not parts:
        raise ArgumentError("--tokens is empty: pass ids like --tokens 1,15043,29892")
    try:
        return [int(p) for p in parts]
    except ValueError:
        raise ArgumentError(
            f"--tokens must be integers separated by commas or spaces, got {text!r}"
        ) from None


def _tokenizer(recipe: Any) -> Any:
    """The recipe's tokenizer from the local Hugging Face cache, or None."""
    name = recipe.bench.tokenizer
    if not name:
        return None
    try:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(name, local_files_only=True)
    except Exception:  # not installed, not downloaded, or unreadable: all mean "no tokenizer"
        return None


def prompt_ids_for(recipe: Any, prompt: str | None, tokens: str | None) -> tuple[list[int], Any]:
    """The prompt's token ids and a tokenizer (or None) for printing text back."""
    if prompt is not None and tokens is not None:
        raise ArgumentError("pass either --prompt or --tokens, not both")
    if tokens is not None:
        return parse_token_ids(tokens), None
    if prompt is None or (prompt == recipe.bench.prompt and recipe.bench.prompt_ids):
        if not recipe.bench.prompt_ids:
            raise ArgumentError(f"recipe {recipe.name} has no bench.prompt_ids: pass --tokens IDS")
        return list(recipe.bench.prompt_ids), None
    tok = _tokenizer(recipe)
    if tok is None:
        raise ArgumentError(
            f"no tokenizer for {recipe.name} is available locally to encode --prompt; "
            "pass token ids with --tokens IDS"
        )
    return list(tok.encode(prompt)), tok


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
        from rich.table import Table

        table = Table("recipe", "family", "dim", "layers", "heads/kv", "vocab", "description")
        for r in recs:
            m = r.model
            table.add_row(
                r.name,
                r.family,
                str(m.dim),
                str(m.n_layers),
                f"{m.n_heads}/{m.n_kv_heads}",
                str(m.vocab_size),
                r.description,
            )
        console.print(table)

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
    def build_cmd(
        recipe: RecipeArg,
        backend: BackendOpt = "eager",
        device: DeviceOpt = "cpu",
        dtype: DtypeOpt = "fp32",
        mode: ModeOpt = None,
        weights: WeightsOpt = None,
        seed: SeedOpt = 0,
        extra: ExtraOpt = None,
        force: Annotated[bool, typer.Option("--force", help="Rebuild even on a hit.")] = False,
        json_out: JsonOut = False,
        cache_dir: CacheDir = None,
        allow_shared_root: AllowSharedRoot = False,
        remote: Remote = None,
        remote_read_only: RemoteReadOnly = False,
        signing_key: SigningKeyOpt = None,
        trusted_keys: TrustedKeysOpt = None,
        remote_trust_unsigned: RemoteTrustUnsigned = False,
    ) -> None:
        """Build an artifact into the cache (a hit returns at once); print its key."""
        from .. import api

        choices = dict(
            device=device, dtype=dtype, mode=mode, weights=weights, seed=seed,
            extra=parse_extra(extra),
        )  # fmt: skip
        _, ctx = api.make_context(recipe, backend, **choices)  # before the store is opened
        store = open_store(
            cache_dir,
            allow_shared_root,
            remote,
            remote_read_only,
            signing_key=signing_key,
            trusted_keys=trusted_keys,
            trust_unsigned=remote_trust_unsigned,
        )
        with _spinner(f"building {recipe} with {backend}"):
            res = api.build(ctx.recipe, backend, force=force, store=store, **choices)
        status = "built" if res.built else ("pulled" if res.source == "pulled" else "hit")
        if json_out:
            emit_json(
                {
                    "key": res.key,
                    "status": status,
                    "built": res.built,
                    "source": res.source,
                    "seconds": round(res.seconds, 3),
                    "bytes": res.bytes,
                    "path": str(res.entry.path),
                }
            )
            return
        console.print(
            f"{res.key}  {status}  {res.seconds:.2f} s  {human_bytes(res.bytes)}",
            highlight=False,
        )

    @app.command("run")
    def run_cmd(
        recipe: RecipeArg,
        backend: BackendOpt = "eager",
        prompt: Annotated[
            str | None,
            typer.Option("--prompt", help="Prompt text (needs the tokenizer locally)."),
        ] = None,
        tokens: Annotated[
            str | None, typer.Option("--tokens", help="Prompt token ids, e.g. 1,15043,29892.")
        ] = None,
        max_new_tokens: Annotated[
            int | None,
            typer.Option(
                "--max-new-tokens",
                help="New tokens (default: the recipe's, cut to fit max_seq_len).",
                show_default=False,
            ),
        ] = None,
        device: DeviceOpt = "cpu",
        dtype: DtypeOpt = "fp32",
        mode: ModeOpt = None,
        weights: WeightsOpt = None,
        seed: SeedOpt = 0,
        extra: ExtraOpt = None,
        json_out: JsonOut = False,
        cache_dir: CacheDir = None,
        allow_shared_root: AllowSharedRoot = False,
        remote: Remote = None,
        remote_read_only: RemoteReadOnly = False,
        signing_key: SigningKeyOpt = None,
        trusted_keys: TrustedKeysOpt = None,
        remote_trust_unsigned: RemoteTrustUnsigned = False,
    ) -> None:
        """Generate greedily from the cached artifact (building it on a miss)."""
        from .. import api
        from ..recipes import load_recipe

        rec = load_recipe(recipe)
        ids, tok = prompt_ids_for(rec, prompt, tokens)
        if max_new_tokens is None:
            max_new_tokens = max(
                1, min(rec.bench.max_new_tokens, rec.shapes.max_seq_len - len(ids))
            )
        common = dict(
            device=device, dtype=dtype, mode=mode, weights=weights, seed=seed,
            extra=parse_extra(extra),
        )  # fmt: skip
        # Every argument is checked before the store is opened: a bad one leaves it as it was.
        api.check_generation(rec, ids, max_new_tokens)
        api.make_context(rec, backend, **common)
        store = open_store(
            cache_dir,
            allow_shared_root,
            remote,
            remote_read_only,
            signing_key=signing_key,
            trusted_keys=trusted_keys,
            trust_unsigned=remote_trust_unsigned,
        )
        # One lookup: a hit is counted once, and the key is computed once.
        t0 = time.perf_counter()
        with _spinner(f"loading {rec.name} with {backend} (building on a miss)"):
            res, runner = api.load_with_result(rec, backend, store=store, **common)
        t1 = time.perf_counter()
        new = runner.generate(ids, max_new_tokens)
        t2 = time.perf_counter()
        status = "built" if res.built else ("pulled" if res.source == "pulled" else "hit")
        text = tok.decode(new) if tok is not None else None
        if json_out:
            emit_json(
                {
                    "key": res.key,
                    "status": status,
                    "prompt_ids": ids,
                    "new_ids": new,
                    "text": text,
                    # key + hit/pull/build, then the backend's load of the entry
                    "build_seconds": round(res.seconds, 3),
                    "load_seconds": round(t1 - t0 - res.seconds, 3),
                    "generate_seconds": round(t2 - t1, 3),
                }
            )
            return
        err_console.print(
            f"{res.key[:16]}  {status}  load {t1 - t0 - res.seconds:.2f} s  "
            f"{len(new)} tokens in {t2 - t1:.2f} s",
            highlight=False,
        )
        print(" ".join(str(i) for i in new))
        if text is not None:
            print(text)
