"""The build-choice options of every command that builds or measures, from BuildChoices.

``@with_choices`` adds one typer option per field of :class:`BuildChoices` (its flag and
help come from the field) to a command, and hands the command ``choices``, a
BuildChoices, in their place. So a new choice is declared once, in choices.py, and
every such command takes it.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from ..choices import BuildChoices
from ..defaults import DEVICE_DEFAULT_HELP, DTYPE_DEFAULT_HELP
from ..errors import BackendUnavailable
from .app import ArgumentError, parse_extra

# How each kind of field reads from the command line: (annotation, to the field's value).
_PARSERS: dict[str, tuple[Any, Callable[[Any], Any]]] = {
    "path": (Path | None, lambda v: None if v is None else str(v)),
    "key=value": (list[str] | None, parse_extra),
    "list": (list[str] | None, lambda v: tuple(v or ())),
}


_TYPES = {"str": str, "int": int, "str | None": str | None, "int | None": int | None}


# Choices whose default depends on the machine or the model (artifactcache/defaults.py):
# None on the command line, resolved in choices_from_cli.
_MACHINE_DEFAULTS = {"device": DEVICE_DEFAULT_HELP, "dtype": DTYPE_DEFAULT_HELP}


def _annotation(f: dataclasses.Field) -> Any:
    kind = f.metadata["cli"]
    if f.name in _MACHINE_DEFAULTS:
        return str | None
    return _PARSERS[kind][0] if kind in _PARSERS else _TYPES[str(f.type)]


def _parameter(f: dataclasses.Field) -> inspect.Parameter:
    repeatable = f.metadata["cli"] in ("key=value", "list")
    default = None if repeatable or f.metadata["cli"] == "path" else f.default
    help_text = f.metadata["help"]
    if f.name in _MACHINE_DEFAULTS:
        default = None
        help_text = f"{help_text.rstrip('.')} ({_MACHINE_DEFAULTS[f.name]})."
    option = typer.Option(f.metadata["flag"], help=help_text,
                          show_default=default is not None)  # fmt: skip
    return inspect.Parameter(
        f.name, inspect.Parameter.KEYWORD_ONLY, default=default,
        annotation=Annotated[_annotation(f), option],
    )  # fmt: skip


def choices_from_cli(
    values: dict[str, Any], recipes: tuple[str, ...] = (), backends: tuple[str, ...] = ()
) -> BuildChoices:
    """BuildChoices from the parsed options, the machine's defaults filled in for those not
    given (``recipes``: the command's models, whose checkpoints may name a dtype: one
    default for all of them, or a one-line ArgumentError where they differ; ``backends``:
    those the command was given, whose dtypes bound the default); bad values are one-line
    ArgumentErrors."""
    from ..defaults import default_device, default_dtype, model_folder
    from ..limits import check_seed

    given = {}
    for f in dataclasses.fields(BuildChoices):
        if f.name not in values:
            continue
        value = values[f.name]
        kind = f.metadata["cli"]
        given[f.name] = _PARSERS[kind][1](value) if kind in _PARSERS else value
    if "device" in values and given["device"] is None:
        given["device"] = default_device(backends)
    if "dtype" in values and given["dtype"] is None:
        device = given.get("device") or "cpu"
        dtypes = {
            r: default_dtype(device, model_folder(r, given.get("weights")), backends)
            for r in recipes or (None,)
        }
        if len(set(dtypes.values())) > 1:
            each = ", ".join(f"{r}: {d}" for r, d in dtypes.items())
            raise ArgumentError(
                f"the models' own dtypes differ ({each}): pass --dtype to run them all at one"
            )
        given["dtype"] = next(iter(dtypes.values()))
    try:
        check_seed(given.get("seed", 0), "--seed")
    except Exception as e:
        raise ArgumentError(str(e)) from None
    if given.get("tag") is not None and not given["tag"].strip():
        # An empty tag is no tag a user means, yet it would key apart from untagged entries.
        raise ArgumentError("--tag is empty: give a word, or leave --tag out")
    return BuildChoices(**given)


def _resolved(annotation: Any, command: Callable[..., Any]) -> Any:
    """A postponed (string) annotation evaluated as typing would, in the command's module."""
    if not isinstance(annotation, str):
        return annotation
    return eval(annotation, vars(sys.modules[command.__module__]))  # noqa: S307


def with_choices(
    command: Callable[..., Any] | None = None, *, exclude: tuple[str, ...] = ()
) -> Any:
    """Give ``command`` (which takes ``choices: BuildChoices``) one option per choice.

    ``exclude`` names choices the command declares its own way (compare's per-backend
    ``--modes`` and ``--extra BACKEND:KEY=VALUE``); they keep their defaults.
    """
    if command is None:
        return functools.partial(with_choices, exclude=exclude)
    sig = inspect.signature(command)
    # Real annotations (the command's module may use postponed, string annotations):
    # typer reads its Annotated options from the signature it is given.
    own = [
        p.replace(annotation=_resolved(p.annotation, command))
        for name, p in sig.parameters.items()
        if name != "choices"
    ]
    added = [_parameter(f) for f in dataclasses.fields(BuildChoices) if f.name not in exclude]
    names = [p.name for p in added]

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from ..defaults import default_backend

        values = {n: kwargs.pop(n) for n in names}
        if kwargs.get("recipe"):
            recipes: tuple[str, ...] = (kwargs["recipe"],)
        else:  # compare's --recipes a,b
            listed = (kwargs.get("recipes") or "").split(",")
            recipes = tuple(r.strip() for r in listed if r.strip())
        given = kwargs.get("backend") or kwargs.get("backends") or ""
        backends = tuple(b.strip() for b in given.split(",") if b.strip())
        choices = choices_from_cli(values, recipes=recipes, backends=backends)
        defaulted = "backend" in kwargs and kwargs["backend"] is None
        if defaulted:
            kwargs["backend"] = default_backend(choices.device)
        try:
            return command(*args, choices=choices, **kwargs)
        except BackendUnavailable as e:
            if not defaulted:
                raise
            raise BackendUnavailable(  # the user never named it: say where it came from
                f"{e} (the default backend on {choices.device}: pick another with -b)"
            ) from None

    wrapper.__signature__ = sig.replace(parameters=own + added)  # type: ignore[attr-defined]
    wrapper.__annotations__ = {p.name: p.annotation for p in own + added}
    return wrapper
