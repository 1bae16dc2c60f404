"""The Typer app, shared options, and the one place errors become messages."""

from __future__ import annotations

import builtins
import importlib
import os
import re
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from rich.markup import escape
from typer.core import TyperGroup

from ..defaults import BACKEND_DEFAULT_HELP
from ..errors import AcacheError, ArgumentError
from .render import visible

# click's UsageError: a missing option, a value that does not parse, an unknown command.
# Typer 0.2x vendors its own click (typer._click), older ones use click's: found
# through typer's public BadParameter, a subclass of it in both.
UsageError: type[Exception] = next(
    (c for c in typer.BadParameter.__mro__ if c.__name__ == "UsageError"), typer.BadParameter
)  # BadParameter alone, should a typer ever lack the base: the commonest usage error
# One table mapping exception types to exit codes. AcacheError subclasses are user
# errors, and so are usage errors: one line on stderr, exit 1.
ERROR_EXIT_CODES: dict[type[BaseException], int] = {AcacheError: 1, UsageError: 1}


class AcacheGroup(TyperGroup):
    """Turns AcacheError into `error: <message>` + exit 1, for every command.

    Help texts are plain text: Typer renders them as rich markup, where a bracketed
    word such as ``[shapes]`` is a style tag and vanishes, so every command's and
    option's help is escaped once here, when Typer builds the command tree.
    """

    def __init__(self, **attrs: Any) -> None:
        super().__init__(**attrs)
        _escape_help(self)
        _plain_metavars(self)

    def make_context(self, info_name: str | None, args: list[str], **extra: Any) -> Any:
        try:  # the group's own options (`acache --bogus`)
            return super().make_context(info_name, args, **extra)
        except UsageError as e:
            _exit_with(e)

    def invoke(self, ctx: typer.Context) -> Any:
        try:  # a subcommand's arguments are parsed in here too
            return super().invoke(ctx)
        except tuple(ERROR_EXIT_CODES) as e:
            _exit_with(e)
        except KeyboardInterrupt:
            typer.echo("error: interrupted", err=True)
            raise typer.Exit(130) from None


def _exit_with(e: BaseException) -> NoReturn:
    """``error: <one line>`` on stderr and the exit code of ``e``'s type."""
    if type(e).__name__ == "NoArgsIsHelpError":  # bare `acache`, `acache remote`: the help
        raise e
    code = next(c for t, c in ERROR_EXIT_CODES.items() if isinstance(e, t))
    if isinstance(e, UsageError):
        ctx = getattr(e, "ctx", None)
        where = ctx.command_path if ctx is not None else "acache"
        message = " ".join(e.format_message().split()).rstrip(".")  # type: ignore[attr-defined]
        typer.echo(f"error: {message} (see `{where} --help`)", err=True)
    else:
        typer.echo(f"error: {visible(e)}", err=True)
    raise typer.Exit(code) from None


_KINDS = {"int": "INTEGER", "integer": "INTEGER", "float": "FLOAT", "str": "TEXT",
          "text": "TEXT", "path": "PATH", "Path": "PATH"}  # fmt: skip


def _value_kind(param: Any) -> str | None:
    """INTEGER, FLOAT, TEXT or PATH for an option's value (a list's items); None for
    anything else (a choice keeps its list). Typer before 0.20 hands click its types;
    later ones describe the annotation."""
    click_type = getattr(param, "type", None)
    if click_type is not None:
        return _KINDS.get(getattr(click_type, "name", ""))
    desc = getattr(param, "type_descriptor", None)
    if desc is None or getattr(desc, "is_choice", False):
        return None
    if getattr(desc, "is_path", False):
        return "PATH"
    name = param.bare_type() if hasattr(param, "bare_type") else ""
    return _KINDS.get(name.removeprefix("list[").removesuffix("]"))


def _plain_metavars(command: Any) -> None:  # a click.Command
    """Help shows RECIPE, TEXT, INTEGER, PATH as click does, and nothing after a flag,
    instead of Typer's ``{recipe}`` and ``<bool>``; an explicit metavar stays."""
    for param in command.params:
        if param.metavar is not None:
            continue
        if param.param_type_name == "argument":
            param.metavar = param.name.upper()
        elif getattr(param, "is_flag", False):
            param.metavar = ""
        elif kind := _value_kind(param):
            param.metavar = kind
    for sub in getattr(command, "commands", {}).values():
        _plain_metavars(sub)


def _escape_help(command: Any) -> None:  # a click.Command
    """Escape rich markup in the help of ``command``, its parameters and its subcommands."""
    for name in ("help", "short_help", "epilog"):
        text = getattr(command, name, None)
        if text:
            setattr(command, name, escape(text))
    for param in command.params:
        text = getattr(param, "help", None)
        if text:
            param.help = escape(text)
    for sub in getattr(command, "commands", {}).values():
        _escape_help(sub)


app = typer.Typer(
    cls=AcacheGroup,
    name="acache",
    help="Build compiled PyTorch artifacts once, cache them by content, measure what it buys.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def old_spelling(value: Any, old_value: Any, flag: str, old_flag: str) -> Any:
    """A flag renamed for one vocabulary across commands keeps its old spelling, hidden,
    for one release: either may be given, not both with different values."""
    if old_value is None:
        return value
    if value is not None and value != old_value:
        raise ArgumentError(f"{flag} and its old spelling {old_flag} disagree: give {flag} only")
    return old_value


# ------------------------------------------------------------ shared options --

CacheDir = Annotated[
    Path | None,
    typer.Option(
        "--cache-dir",
        envvar="ACACHE_DIR",
        help="Cache root (default: the platform's user cache dir, e.g. ~/.cache/acache).",
        show_default=False,
    ),
]
# The boolean variables (ACACHE_ALLOW_SHARED_ROOT, ACACHE_REMOTE_READ_ONLY,
# ACACHE_REMOTE_TRUST_UNSIGNED) are read by settings.get in open_store/LocalStore, not
# by click: a value such as "maybe" is then one `error:` line naming the variable.
AllowSharedRoot = Annotated[
    bool,
    typer.Option(
        "--allow-shared-root",
        help="Accept a cache root that is a symlink, another user's, or group/world-writable "
        "(or set ACACHE_ALLOW_SHARED_ROOT=1).",
    ),
]
JsonOut = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON on stdout.")]
Remote = Annotated[
    str | None,
    typer.Option(
        "--remote",
        envvar="ACACHE_REMOTE",
        help="Shared remote tier, e.g. s3://bucket/prefix (endpoint, credentials: the AWS_* env).",
        show_default=False,
    ),
]
RemoteReadOnly = Annotated[
    bool,
    typer.Option(
        "--remote-read-only",
        help="Pull from the remote, never push (or set ACACHE_REMOTE_READ_ONLY=1).",
    ),
]
SigningKeyOpt = Annotated[
    Path | None,
    typer.Option(
        "--signing-key",
        envvar="ACACHE_SIGNING_KEY",
        help="Builder's Ed25519 private key: signs what this host pushes (`acache remote keygen`).",
        show_default=False,
    ),
]
TrustedKeysOpt = Annotated[
    str | None,
    typer.Option(
        "--trusted-keys",
        envvar="ACACHE_TRUSTED_KEYS",
        help="Files of ssh-ed25519 public keys (comma-separated): pulled entries must be signed "
        "by one.",
        show_default=False,
    ),
]
RemoteTrustUnsigned = Annotated[
    bool,
    typer.Option(
        "--remote-trust-unsigned",
        help="Use remote entries that no trusted key signed (turns off the authenticity check; "
        "or set ACACHE_REMOTE_TRUST_UNSIGNED=1).",
    ),
]
RebuildUntrusted = Annotated[
    bool,
    typer.Option(
        "--rebuild-untrusted",
        help="Rebuild here an entry pulled earlier whose signer is no longer trusted "
        "(default: refuse it with an error).",
    ),
]

# What every command that builds or measures takes besides its build choices
# (those are declared with BuildChoices and added by cli/choices.py).
RecipeArg = Annotated[
    str,
    typer.Argument(
        help="A built-in recipe name (see `acache recipes`), a .toml path, or a Hugging Face "
        "checkpoint folder (config.json + safetensors)."
    ),
]
BackendOpt = Annotated[
    str, typer.Option("--backend", "-b", help="eager | inductor | aoti | ort | trt.")
]
# A build or measure command's backend: one default for all, by device (defaults.py).
DefaultBackendOpt = Annotated[
    str | None,
    typer.Option(
        "--backend",
        "-b",
        help=f"eager | inductor | aoti | ort | trt ({BACKEND_DEFAULT_HELP}).",
        show_default=False,
    ),
]


def check_seed_option(
    ctx: typer.Context, param: typer.CallbackParam, value: int | None
) -> int | None:
    """--seed and --sample-seed: torch takes 64 bits; checked as parsed, before any build."""
    from ..limits import check_seed

    return value if value is None else check_seed(value, f"--{param.name.replace('_', '-')}")


# compare runs several backends (and always eager): each extra option names its backend.
BackendExtraOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--extra",
        help="BACKEND:KEY=VALUE, repeatable, e.g. ort:opset=18 (see --extra of `acache build`).",
        show_default=False,
    ),
]


def _typed(raw: str) -> object:
    if re.fullmatch(r"-?[0-9]+", raw):
        return int(raw)
    if raw.lower() in ("true", "false"):
        return raw.lower() == "true"
    return raw


def parse_extra(items: list[str] | None) -> dict[str, object]:
    """KEY=VALUE pairs -> dict; ints and true/false are typed, the rest stay strings."""
    out: dict[str, object] = {}
    for item in items or []:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ArgumentError(f"--extra {item!r}: expected KEY=VALUE, e.g. --extra opset=18")
        out[key.strip()] = _typed(raw)
    return out


def parse_backend_extras(items: list[str] | None) -> dict[str, dict[str, object]]:
    """BACKEND:KEY=VALUE pairs -> {backend: {key: value}}."""
    out: dict[str, dict[str, object]] = {}
    for item in items or []:
        backend, sep, option = item.partition(":")
        if not sep or not backend.strip():
            raise ArgumentError(f"--extra {item!r}: expected BACKEND:KEY=VALUE, e.g. ort:opset=18")
        out.setdefault(backend.strip(), {}).update(parse_extra([option]))
    return out


def check_prefixes(keys: list[str], hint: str = "see `acache ls`") -> None:
    """Every key's syntax, before a store is opened: a bad one leaves the cache as it was."""
    from ..store.keyformat import normalize_prefix

    for k in keys:
        normalize_prefix(k, hint=hint)


def open_store(
    cache_dir: Path | None,
    allow_shared_root: bool = False,
    remote: str | None = None,
    remote_read_only: bool = False,
    *,
    signing_key: Path | None = None,
    trusted_keys: str | None = None,
    trust_unsigned: bool = False,
    rebuild_untrusted: bool = False,
):
    """The local store, wrapped in the remote tier when --remote / ACACHE_REMOTE is set.

    Without a remote, the key options still say which pulled entries are served
    (revocation, store/provenance.py); they are read at the first pulled entry.
    """
    from .. import settings
    from ..store.local import LocalStore

    remote_read_only = remote_read_only or settings.get("ACACHE_REMOTE_READ_ONLY")
    trust_unsigned = trust_unsigned or settings.get("ACACHE_REMOTE_TRUST_UNSIGNED")

    def trust() -> Any:
        from ..store.signing import trust_from

        return trust_from(signing_key, trusted_keys, trust_unsigned or None)

    local = LocalStore(
        cache_dir,
        allow_shared_root=allow_shared_root,
        trust=trust,
        rebuild_untrusted=rebuild_untrusted,
    )
    if not remote:
        return local
    from ..store.tiered import open_tiered

    return open_tiered(
        local,
        remote,
        read_only=remote_read_only,
        signing_key=signing_key,
        trusted_keys=trusted_keys,
        trust_unsigned=trust_unsigned,
    )


# `acache --help` groups the commands in these panels, in this order: what a
# newcomer needs first comes first.
HELP_PANELS: dict[str, tuple[str, ...]] = {
    "Build and run": ("recipes", "build", "run", "key", "recipe"),
    "Measure": ("coldstart", "bench", "compare"),
    "Cache": ("ls", "show", "stats", "verify", "rm", "gc", "prune", "export", "import"),
    "Remote": ("push", "pull", "prewarm"),
    "Diagnose": ("doctor", "diff"),
}
_COMMAND_PANEL = {cmd: panel for panel, cmds in HELP_PANELS.items() for cmd in cmds}
_COMMAND_RANK = {cmd: i for i, cmd in enumerate(_COMMAND_PANEL)}


def _arrange_help() -> None:
    """Put every registered command in its panel, in HELP_PANELS order."""
    for info in app.registered_commands:
        info.rich_help_panel = _COMMAND_PANEL.get(info.name or "")
    app.registered_commands.sort(key=lambda c: _COMMAND_RANK.get(c.name or "", len(_COMMAND_RANK)))


# Command modules, each with register(app). A module that is not there yet
# (or whose optional dependency is missing at import) must not break the rest.
_COMMAND_MODULES = ("cache", "keys", "build", "run", "remote", "doctor", "measure")


def _register_all() -> None:
    for name in _COMMAND_MODULES:
        try:
            module = importlib.import_module(f"{__package__}.{name}")
        except ModuleNotFoundError as e:
            if e.name == f"{__package__}.{name}":
                continue
            raise
        module.register(app)


_register_all()
_arrange_help()


# Notices meant for torch's and onnx's own developers: a user can act on none of them.
QUIET_CATEGORIES = ("FutureWarning", "DeprecationWarning")


def quiet_third_party_warnings(verbose: bool = False) -> None:
    """Hide QUIET_CATEGORIES here and, through PYTHONWARNINGS, in every process acache
    starts (build workers, probes), unless ``verbose`` (acache --verbose) or
    ACACHE_VERBOSE is set."""
    import warnings

    from .. import settings

    try:
        if verbose or settings.get("ACACHE_VERBOSE"):
            return
    except AcacheError:
        pass  # a bad value: quiet, and `acache doctor` names it; no command fails on it
    for name in QUIET_CATEGORIES:
        # Appended: the user's own -W and PYTHONWARNINGS filters come first and win.
        warnings.filterwarnings("ignore", category=getattr(builtins, name), append=True)
    given = [f for f in os.environ.get("PYTHONWARNINGS", "").split(",") if f.strip()]
    ours = [f"ignore::{name}" for name in QUIET_CATEGORIES if f"ignore::{name}" not in given]
    os.environ["PYTHONWARNINGS"] = ",".join(ours + given)  # the user's own, later, win


def _print_version(given: bool) -> None:
    if given:
        from ..version import __version__

        print(f"acache {__version__}")
        raise typer.Exit()


@app.callback()
def _global_options(
    verbose: Annotated[
        bool,
        typer.Option(
            "--verbose",
            help="Show third-party warnings (FutureWarning, DeprecationWarning), hidden by "
            "default (or set ACACHE_VERBOSE=1).",
        ),
    ] = False,
    version: Annotated[
        bool,
        typer.Option(
            "--version",
            help="Print acache's version and exit.",
            callback=_print_version,
            is_eager=True,
        ),
    ] = False,
) -> None:
    quiet_third_party_warnings(verbose)


def main() -> None:
    app()
