"""`acache run`: generate from the cached artifact (building it on a miss), or run a
model spec once. A thin wrapper over artifactcache.api and artifactcache.generate.

Several ``--prompt`` (or ``--tokens``) run as one batch on an artifact with rows for
them all: ``--max-batch`` if given, else the recipe's, or as many rows as prompts.
"""

from __future__ import annotations

import sys
import time
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
from .build import status_of
from .choices import with_choices
from .module import is_spec
from .render import emit_json, err_console, progress, terminal_text

if TYPE_CHECKING:
    from ..choices import BuildChoices
    from ..generate import GenerationRequest
    from ..store.protocol import Store


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
    token by token when ``out`` is a terminal (control characters escaped), else once
    at the end, exactly."""
    from ..generate.checkpoint import TextStream

    if tokenizer is not None and show and out.isatty():
        text = TextStream(tokenizer, ids)
        new = []
        for token in runner.stream(ids, max_new_tokens, **choices):
            new.append(token)
            out.write(terminal_text(text.push(token)))
            out.flush()
        out.write("\n")
        return new, text.text
    new = runner.generate(ids, max_new_tokens, **choices)
    text = continuation(tokenizer, ids, new)
    if show:
        out.write(_shown(out, new, text) + "\n")
    return new, text


def _shown(out: Any, new: list[int], text: str | None) -> str:
    """A row's output as ``out`` should get it: its text (escaped for a terminal, exact
    for a pipe), or its ids without a tokenizer."""
    if text is None:
        return " ".join(map(str, new))
    return terminal_text(text) if out.isatty() else text


def continuation(tokenizer: Any, prompt_ids: list[int], new: list[int]) -> str | None:
    """The text ``new`` adds after the prompt, or None without a tokenizer."""
    if tokenizer is None:
        return None
    from ..generate.checkpoint import decode_continuation

    return decode_continuation(tokenizer, prompt_ids, new)


def batch_header(i: int, n: int) -> str:
    """The line before row ``i`` (from 0) of ``n`` in a batch's plain output."""
    return f"--- prompt {i + 1} of {n} ---"


def generate_batch_and_print(
    runner: Any,
    prompts: list[list[int]],
    max_new_tokens: int,
    choices: dict[str, Any],
    tokenizer: Any,
    out: Any,
    *,
    show: bool,
) -> list[tuple[list[int], str | None]]:
    """The prompts as one batch; each row's (new ids, text or None). With ``show`` each
    row goes to ``out`` under its ``batch_header``, once the batch is done."""
    news = runner.generate_batch(prompts, max_new_tokens, **choices)
    rows = [(new, continuation(tokenizer, p, new)) for p, new in zip(prompts, news, strict=True)]
    if show:
        for i, (new, text) in enumerate(rows):
            out.write(f"{batch_header(i, len(rows))}\n{_shown(out, new, text)}\n")
    return rows


def register(app: typer.Typer) -> None:
    @app.command("run")
    @with_choices
    def run_cmd(
        recipe: RecipeArg,
        choices: BuildChoices,
        backend: DefaultBackendOpt = None,
        prompt: Annotated[
            list[str] | None,
            typer.Option(
                "--prompt",
                help="Prompt text (needs tokenizer.json in the checkpoint). Repeat it for a "
                "batch: the prompts run at once, on an artifact with a row for each.",
            ),
        ] = None,
        tokens: Annotated[
            list[str] | None,
            typer.Option(
                "--tokens", help="Prompt token ids, e.g. 1,15043,29892 (repeatable, as --prompt)."
            ),
        ] = None,
        chat: Annotated[
            bool,
            typer.Option(
                "--chat",
                help="Each --prompt is the user's turn, through the checkpoint's chat template "
                "(chat_template.jinja or tokenizer_config.json), the assistant's turn opened.",
            ),
        ] = False,
        system: Annotated[
            str | None,
            typer.Option("--system", help="A system turn before each prompt (implies --chat)."),
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
                help="Seed for sampling (--seed seeds random weights); in a batch, prompt i "
                "samples with seed + i.",
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

        Several --prompt (or --tokens) run as one batch. With a model spec
        (pkg.module:factory) instead: run it once on its inputs and print each output's
        shape and checksum.
        """
        from .. import api
        from ..generate import Checkpoint, resolve_request
        from ..generate.request import rows_for
        from ..recipes import load_recipe
        from ..sources.checkpoint import checkpoint_folder

        max_new_tokens = old_spelling(
            max_new_tokens, max_new_tokens_old, "--new-tokens", "--max-new-tokens"
        )
        store_opts = dict(
            signing_key=signing_key, trusted_keys=trusted_keys,
            trust_unsigned=remote_trust_unsigned, rebuild_untrusted=rebuild_untrusted,
        )  # fmt: skip

        if is_spec(recipe):
            choices.check_scope("module")
            generation = {
                "--prompt": bool(prompt), "--tokens": bool(tokens), "--chat": chat,
                "--system": system is not None,
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
            store = open_store(cache_dir, allow_shared_root, remote, remote_read_only,
                               **store_opts)  # fmt: skip
            _run_module(recipe, mspec, backend, choices, store, json_out)
            return
        choices.check_scope("recipe")

        base = load_recipe(recipe)
        rec = base.with_shapes(max_seq_len=choices.max_seq_len)
        folder = checkpoint_folder(choices.weights if choices.weights is not None else rec.weights)
        ckpt = Checkpoint(folder) if folder is not None else None
        req = resolve_request(
            rec, ckpt, prompt=prompt, tokens=tokens, max_new_tokens=max_new_tokens,
            eos_ids=eos_id, no_eos=no_eos, temperature=temperature, top_k=top_k, top_p=top_p,
            seed=sample_seed, chat=chat, system=system,
        )  # fmt: skip
        rows = rows_for(rec, len(req.prompts), choices.max_batch)
        grown = rows > rec.shapes.max_batch and choices.max_batch is None
        # The shapes from the recipe as written, in one step, as `build` and `key` take
        # them: with_shapes derives prefill_len from both, so two steps could differ.
        rec = base.with_shapes(
            max_seq_len=choices.max_seq_len, max_batch=rows if grown else choices.max_batch
        )
        # The recipe above carries the shapes; the rest of the choices go whole.
        common = choices.replace(max_seq_len=None, max_batch=None)
        # Every argument is checked before the store is opened: a bad one leaves it as it was.
        for ids in req.prompts:
            api.check_generation(rec, ids, req.max_new_tokens)
        api.make_context(rec, backend, common, check_checkpoint=True)
        store = open_store(cache_dir, allow_shared_root, remote, remote_read_only, **store_opts)
        if grown:  # a key factor the user did not give: say which artifact this is
            err_console.print(
                f"{len(req.prompts)} prompts: the artifact for --max-batch {rows}",
                highlight=False,
            )
        _generate(backend, common, rec, store, req, ckpt, json_out)


def _generate(
    backend: str,
    common: BuildChoices,
    rec: Any,
    store: Store,
    req: GenerationRequest,
    ckpt: Any,
    json_out: bool,
) -> None:
    """Load (one lookup: a hit is counted once, the key computed once), generate, report."""
    from .. import api

    t0 = time.perf_counter()
    with progress(f"loading {rec.name} with {backend} (building on a miss)"):
        res, runner = api.load_with_result(rec, backend, common, store=store)
    t1 = time.perf_counter()
    tok = ckpt.tokenizer if ckpt is not None else None
    kwargs = req.generate_kwargs()
    show = not json_out
    if len(req.prompts) == 1:
        one = generate_and_print(runner, req.prompt_ids, req.max_new_tokens, kwargs, tok,
                                 sys.stdout, show=show)  # fmt: skip
        rows = [one]
    else:
        rows = generate_batch_and_print(
            runner, req.prompts, req.max_new_tokens, kwargs, tok, sys.stdout, show=show
        )
    t2 = time.perf_counter()
    eos_used = runner.eos_token_ids if req.eos_token_ids is None else req.eos_token_ids
    stops = ["eos" if new and new[-1] in eos_used else "length" for new, _ in rows]
    timings = {
        # key + hit/pull/build (a lookup on a hit), then the backend's load
        "entry_seconds": round(res.seconds, 3),
        "build_seconds": round(res.seconds, 3),  # its old name, for one release
        "load_seconds": round(t1 - t0 - res.seconds, 3),
        "generate_seconds": round(t2 - t1, 3),
    }
    if json_out:
        results = [
            {"prompt_ids": ids, "new_ids": new, "text": text, "stop": stop}
            for ids, (new, text), stop in zip(req.prompts, rows, stops, strict=True)
        ]
        # One prompt: its fields at the top level; a batch: one object per prompt.
        body = results[0] if len(results) == 1 else {"rows": results}
        emit_json({"key": res.key, "status": status_of(res), **body, **timings})
        return
    tokens = sum(len(new) for new, _ in rows)
    stop = stops[0] if len(set(stops)) == 1 else ", ".join(stops)
    status = status_of(res)
    if status != "hit":  # a build or a pull took time worth seeing; a hit's lookup did not
        status += f" in {res.seconds:.1f} s"
    err_console.print(
        f"{res.key[:16]}  {status}  load {timings['load_seconds']:.2f} s  "
        f"{tokens} token{'' if tokens == 1 else 's'} in {t2 - t1:.2f} s ({stop})",
        highlight=False,
        soft_wrap=True,  # one line for scripts that read it, a batch's stops and all
    )


def _run_module(
    spec: str, mspec: Any, backend: str, choices: BuildChoices, store: Store, json_out: bool
) -> None:
    """`acache run SPEC`: load (building on a miss), one call, each output's shape/checksum."""
    from .module import compile_spec, output_summary

    t0 = time.perf_counter()
    with progress(f"loading {spec} with {backend} (building on a miss)"):
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
                "status": status_of(res),
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
        f"{res.key[:16]}  {status_of(res)}  load {t1 - t0 - res.seconds:.2f} s  "
        f"first call {t2 - t1:.3f} s",
        highlight=False,
    )
    for r in rows:
        shape = "x".join(map(str, r["shape"])) or "scalar"
        print(f"{r['output']}  {shape}  {r['dtype']}  checksum {r['checksum']:.6g}")
