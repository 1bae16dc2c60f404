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
from typing import TYPE_CHECKING, Annotated, Any

import typer

from ..devices import is_cuda
from ..errors import ArgumentError
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
    check_seed_option,
    old_spelling,
    open_store,
)
from .choices import with_choices
from .module import is_spec
from .render import console, emit_json, err_console, human_bytes, print_table, shown

if TYPE_CHECKING:
    from ..choices import BuildChoices
    from ..store.protocol import Store


# Not a terminal (a CI log, a pipe): a plain line once the work has run this long, and
# its time when done, so a hit stays quiet and a minutes-long build says what it does.
PLAIN_PROGRESS_AFTER_S = 1.0


@contextlib.contextmanager
def _spinner(text: str) -> Iterator[None]:
    """A spinner on stderr while something slow runs when a person watches; else plain
    progress lines (PLAIN_PROGRESS_AFTER_S)."""
    if sys.stderr.isatty():
        with err_console.status(text):
            yield
        return
    import threading
    import time

    t0 = time.perf_counter()
    said = threading.Event()

    def say() -> None:
        said.set()
        err_console.print(f"{shown(text)} ...", highlight=False)

    timer = threading.Timer(PLAIN_PROGRESS_AFTER_S, say)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
    if said.is_set():  # done: on an error its one line is the last word
        err_console.print(f"{shown(text)}: {time.perf_counter() - t0:.1f} s", highlight=False)


def generate_and_print(
    runner: Any,
    ids: list[int],
    max_new_tokens: int,
    choices: dict[str, Any],
    tokenizer: Any,
    out: Any,
    *,
    show: bool,
) -> tuple[list[int], str | None]:
    """Generate; (new ids, their text or None). With ``show`` the text goes to ``out``:
    token by token when ``out`` is a terminal, else once at the end."""
    from ..generate.checkpoint import TextStream

    if tokenizer is not None and show and out.isatty():
        text = TextStream(tokenizer, ids)
        new = []
        for token in runner.stream(ids, max_new_tokens, **choices):
            new.append(token)
            out.write(text.push(token))
            out.flush()
        out.write("\n")
        return new, text.text
    new = runner.generate(ids, max_new_tokens, **choices)
    if tokenizer is None:
        if show:
            out.write(" ".join(str(i) for i in new) + "\n")
        return new, None
    text = TextStream(tokenizer, ids)
    for token in new:
        text.push(token)
    if show:
        out.write(text.text + "\n")
    return new, text.text


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
        with _spinner(f"building {recipe} with {backend}"):
            res = build(store)
        _print_build(res, json_out)

    @app.command("run")
    @with_choices
    def run_cmd(
        recipe: RecipeArg,
        choices: BuildChoices,
        backend: DefaultBackendOpt = None,
        prompt: Annotated[
            str | None,
            typer.Option("--prompt", help="Prompt text (needs tokenizer.json in the checkpoint)."),
        ] = None,
        tokens: Annotated[
            str | None, typer.Option("--tokens", help="Prompt token ids, e.g. 1,15043,29892.")
        ] = None,
        max_new_tokens: Annotated[
            int | None,
            typer.Option(
                "--new-tokens",
                help="New tokens, at most: EOS stops sooner (default: the recipe's, cut to "
                "fit max_seq_len).",
                show_default=False,
            ),
        ] = None,
        max_new_tokens_old: Annotated[
            int | None, typer.Option("--max-new-tokens", hidden=True)
        ] = None,
        temperature: Annotated[
            float, typer.Option("--temperature", help="0 is greedy; > 0 samples.")
        ] = 0.0,
        top_k: Annotated[
            int | None, typer.Option("--top-k", help="Sample from the k likeliest tokens.")
        ] = None,
        top_p: Annotated[
            float | None, typer.Option("--top-p", help="Nucleus sampling mass, in (0, 1].")
        ] = None,
        sample_seed: Annotated[
            int | None,
            typer.Option(
                "--sample-seed",
                help="Seed for sampling (--seed seeds random weights).",
                callback=check_seed_option,
            ),
        ] = None,
        eos_id: Annotated[
            list[int] | None,
            typer.Option(
                "--eos-id",
                help="Stop after this token id, repeatable (default: the checkpoint's EOS ids).",
            ),
        ] = None,
        no_eos: Annotated[
            bool, typer.Option("--no-eos", help="Never stop early: exactly --new-tokens.")
        ] = False,
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
        """Generate from the cached artifact (building it on a miss): text with a tokenizer.

        With a model spec (pkg.module:factory) instead: run it once on its inputs
        and print each output's shape and checksum.
        """
        from .. import api
        from ..generate import Checkpoint, resolve_request
        from ..recipes import load_recipe
        from ..sources.checkpoint import checkpoint_folder

        max_new_tokens = old_spelling(
            max_new_tokens, max_new_tokens_old, "--new-tokens", "--max-new-tokens"
        )

        if is_spec(recipe):
            choices.check_scope("module")
            generation = {
                "--prompt": prompt is not None, "--tokens": tokens is not None,
                "--new-tokens": max_new_tokens is not None, "--temperature": temperature != 0.0,
                "--top-k": top_k is not None, "--top-p": top_p is not None,
                "--sample-seed": sample_seed is not None, "--eos-id": bool(eos_id),
                "--no-eos": no_eos,
            }  # fmt: skip
            if given := [flag for flag, was_given in generation.items() if was_given]:
                raise ArgumentError(
                    f"{given[0]} is for generating from a recipe; a model spec runs once on "
                    "its inputs"
                )
            from .module import checked_spec

            mspec = checked_spec(recipe, backend, choices)  # before the store, as checks are
            store = open_store(
                cache_dir, allow_shared_root, remote, remote_read_only, signing_key=signing_key,
                trusted_keys=trusted_keys, trust_unsigned=remote_trust_unsigned,
                rebuild_untrusted=rebuild_untrusted,
            )  # fmt: skip
            _run_module(recipe, mspec, backend, choices, store, json_out)
            return
        choices.check_scope("recipe")

        # --max-batch picks the artifact; the prompt runs as a batch of one on it.
        rec = load_recipe(recipe).with_shapes(
            max_seq_len=choices.max_seq_len, max_batch=choices.max_batch
        )
        folder = checkpoint_folder(choices.weights if choices.weights is not None else rec.weights)
        ckpt = Checkpoint(folder) if folder is not None else None
        req = resolve_request(
            rec, ckpt, prompt=prompt, tokens=tokens, max_new_tokens=max_new_tokens,
            eos_ids=eos_id, no_eos=no_eos, temperature=temperature, top_k=top_k, top_p=top_p,
            seed=sample_seed,
        )  # fmt: skip
        ids, eos = req.prompt_ids, req.eos_token_ids
        # The recipe above carries the shapes; the rest of the choices go whole.
        common = choices.replace(max_seq_len=None, max_batch=None)
        # Every argument is checked before the store is opened: a bad one leaves it as it was.
        api.check_generation(rec, ids, req.max_new_tokens)
        api.make_context(rec, backend, common, check_checkpoint=True)
        store = open_store(
            cache_dir,
            allow_shared_root,
            remote,
            remote_read_only,
            signing_key=signing_key,
            trusted_keys=trusted_keys,
            trust_unsigned=remote_trust_unsigned,
            rebuild_untrusted=rebuild_untrusted,
        )
        # One lookup: a hit is counted once, and the key is computed once.
        t0 = time.perf_counter()
        with _spinner(f"loading {rec.name} with {backend} (building on a miss)"):
            res, runner = api.load_with_result(rec, backend, common, store=store)
        t1 = time.perf_counter()
        tok = ckpt.tokenizer if ckpt is not None else None
        new, text = generate_and_print(
            runner, ids, req.max_new_tokens, req.generate_kwargs(), tok, sys.stdout,
            show=not json_out,
        )  # fmt: skip
        t2 = time.perf_counter()
        status = "built" if res.built else ("pulled" if res.source == "pulled" else "hit")
        eos_used = runner.eos_token_ids if eos is None else eos
        stop = "eos" if new and new[-1] in eos_used else "length"
        if json_out:
            emit_json(
                {
                    "key": res.key,
                    "status": status,
                    "prompt_ids": ids,
                    "new_ids": new,
                    "text": text,
                    "stop": stop,
                    # key + hit/pull/build (a lookup on a hit), then the backend's load
                    "entry_seconds": round(res.seconds, 3),
                    "build_seconds": round(res.seconds, 3),  # its old name, for one release
                    "load_seconds": round(t1 - t0 - res.seconds, 3),
                    "generate_seconds": round(t2 - t1, 3),
                }
            )
            return
        err_console.print(
            f"{res.key[:16]}  {status}  load {t1 - t0 - res.seconds:.2f} s  "
            f"{len(new)} tokens in {t2 - t1:.2f} s ({stop})",
            highlight=False,
        )


def _status(res: Any) -> str:
    return "built" if res.built else ("pulled" if res.source == "pulled" else "hit")


def _print_build(res: Any, json_out: bool) -> None:
    if json_out:
        emit_json(
            {
                "key": res.key,
                "status": _status(res),
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
        f"{res.key}  {_status(res)}  {res.seconds:.2f} s  {human_bytes(res.bytes)}",
        highlight=False,
    )
    if line := res.phases_summary():
        err_console.print(line, highlight=False)  # stdout stays the one line scripts read


def _run_module(
    spec: str, mspec: Any, backend: str, choices: BuildChoices, store: Store, json_out: bool
) -> None:
    """`acache run SPEC`: load (building on a miss), one call, each output's shape/checksum."""
    from .module import compile_spec, output_summary

    t0 = time.perf_counter()
    with _spinner(f"loading {spec} with {backend} (building on a miss)"):
        res, compiled = compile_spec(mspec, backend, choices, store=store)
    t1 = time.perf_counter()
    out = compiled(*mspec.example_inputs)
    if is_cuda(choices.device):
        import torch

        torch.cuda.synchronize(choices.device)
    t2 = time.perf_counter()
    rows = output_summary(out)
    if json_out:
        emit_json(
            {
                "key": res.key,
                "status": _status(res),
                "inputs": [s.describe() for s in mspec.inputs],
                "outputs": rows,
                "entry_seconds": round(res.seconds, 3),
                "build_seconds": round(res.seconds, 3),  # its old name, for one release
                "load_seconds": round(t1 - t0 - res.seconds, 3),
                "call_seconds": round(t2 - t1, 3),
            }
        )
        return
    err_console.print(
        f"{res.key[:16]}  {_status(res)}  load {t1 - t0 - res.seconds:.2f} s  "
        f"first call {t2 - t1:.3f} s",
        highlight=False,
    )
    for r in rows:
        shape = "x".join(map(str, r["shape"])) or "scalar"
        print(f"{r['output']}  {shape}  {r['dtype']}  checksum {r['checksum']:.6g}")
