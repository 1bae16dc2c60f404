"""Remote tier commands: push, pull, prewarm, remote keygen (and the rows behind `ls --remote`).

Explicit commands fail loudly: a wrong bucket, rejected credentials, a down
server, a read-only push, a push without a signing key or a pull of an entry no
trusted key signed is one `error:` line and exit 1. Implicit pushes and pulls
during a build only warn (see store/tiered.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from ..choices import BuildChoices
from ..errors import RemoteError
from .app import (
    AllowSharedRoot,
    BackendOpt,
    CacheDir,
    JsonOut,
    RecipeArg,
    Remote,
    RemoteReadOnly,
    RemoteTrustUnsigned,
    SigningKeyOpt,
    TrustedKeysOpt,
    check_prefixes,
    open_store,
)
from .choices import with_choices
from .render import console, emit_json, err_console, human_bytes, n_entries, print_table

Keys = Annotated[list[str], typer.Argument(help="Keys or unique prefixes (>= 8 hex chars).")]


def _tiered(
    cache_dir: Path | None,
    allow_shared_root: bool,
    remote: str | None,
    read_only: bool,
    key_opts: tuple[Path | None, str | None, bool],
) -> Any:
    if not remote:
        raise RemoteError(
            "no remote configured: pass --remote s3://bucket/prefix or set ACACHE_REMOTE"
        )
    signing_key, trusted_keys, trust_unsigned = key_opts
    return open_store(
        cache_dir,
        allow_shared_root,
        remote,
        read_only,
        signing_key=signing_key,
        trusted_keys=trusted_keys,
        trust_unsigned=trust_unsigned,
    )


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
    cols = ["key", "recipe", "backend", "size", "build", "signed by", "state"]
    table = []
    for r in rows:
        label = r.get("label", {})  # the remote's text: print_table shows it as data
        table.append([
            r["key"][:12],
            label.get("recipe", "-"),
            label.get("backend", "-"),
            human_bytes(r["size"]) if r["complete"] else "-",
            f"{r['build_seconds']:.1f}s" if r["complete"] else "-",
            r["signature"] if r["complete"] else "-",
            "ok" if r["complete"] else r["problem"],
        ])  # fmt: skip
    print_table(f"{n_entries(len(rows))} in {url}", cols, table)


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
        signing_key: SigningKeyOpt = None,
        trusted_keys: TrustedKeysOpt = None,
        remote_trust_unsigned: RemoteTrustUnsigned = False,
        json: JsonOut = False,
    ):
        """Upload local entries to the remote: files first, then the signed manifest."""
        check_prefixes(keys)
        key_opts = (signing_key, trusted_keys, remote_trust_unsigned)
        store = _tiered(cache_dir, allow_shared_root, remote, remote_read_only, key_opts)
        _render([store.push(k, replace=replace) for k in keys], json)

    @app.command("pull")
    def pull(
        keys: Keys,
        cache_dir: CacheDir = None,
        allow_shared_root: AllowSharedRoot = False,
        remote: Remote = None,
        remote_read_only: RemoteReadOnly = False,
        signing_key: SigningKeyOpt = None,
        trusted_keys: TrustedKeysOpt = None,
        remote_trust_unsigned: RemoteTrustUnsigned = False,
        json: JsonOut = False,
    ):
        """Download entries, check the signature and every digest, publish them locally."""
        check_prefixes(keys, hint="see `acache ls --remote`")
        key_opts = (signing_key, trusted_keys, remote_trust_unsigned)
        store = _tiered(cache_dir, allow_shared_root, remote, remote_read_only, key_opts)
        _render([store.pull(k) for k in keys], json)

    @app.command("prewarm")
    @with_choices(exclude=("inputs",))  # a recipe's artifact only
    def prewarm(
        recipe: RecipeArg,
        backend: BackendOpt,
        choices: BuildChoices,
        cache_dir: CacheDir = None,
        allow_shared_root: AllowSharedRoot = False,
        remote: Remote = None,
        remote_read_only: RemoteReadOnly = False,
        signing_key: SigningKeyOpt = None,
        trusted_keys: TrustedKeysOpt = None,
        remote_trust_unsigned: RemoteTrustUnsigned = False,
        json: JsonOut = False,
    ):
        """Pull and verify the artifact a recipe + backend needs (for a deploy hook); no build."""
        from ..api import key_for, make_context

        b, ctx = make_context(recipe, backend, choices, check_checkpoint=True)
        key_opts = (signing_key, trusted_keys, remote_trust_unsigned)
        store = _tiered(cache_dir, allow_shared_root, remote, remote_read_only, key_opts)
        info = key_for(b, ctx, memo_dir=store.base)
        row = store.pull(info.key)  # KeyLookupError (one line) if the remote lacks it
        row.update(recipe=ctx.recipe.name, backend=b.name)
        _render([row], json)

    remote_app = typer.Typer(
        name="remote",
        help="Remote tier keys: make the Ed25519 key a builder signs with.",
        no_args_is_help=True,
    )
    app.add_typer(remote_app, rich_help_panel="Remote")

    @remote_app.command("keygen")
    def keygen(
        path: Annotated[
            Path,
            typer.Argument(help="Where to write the private key; the public key goes to PATH.pub."),
        ],
        comment: Annotated[
            str, typer.Option("--comment", help="Comment at the end of the public key line.")
        ] = "acache",
        json: JsonOut = False,
    ):
        """Write a new signing key (0600) and print its public key line.

        Builders set ACACHE_SIGNING_KEY=PATH; deployment hosts add the public line
        to a file named in ACACHE_TRUSTED_KEYS. Never overwrites a key.
        """
        from ..store.signing import fingerprint, generate_key

        public = generate_key(path, comment)
        pub_path = path.with_name(path.name + ".pub")
        if json:
            emit_json(
                {
                    "private_key": str(path),
                    "public_key_file": str(pub_path),
                    "public_key": public,
                    "fingerprint": fingerprint(public),
                }
            )
            return
        print(public)
        err_console.print(
            f"wrote {path} (0600) and {pub_path} ({fingerprint(public)}); builders: "
            f"ACACHE_SIGNING_KEY={path}; hosts: add the line above to an ACACHE_TRUSTED_KEYS file",
            highlight=False,
            soft_wrap=True,
        )
