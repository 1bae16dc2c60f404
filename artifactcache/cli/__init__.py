"""The `acache` command line: parse, call the library, render.

Commands live in small modules, one concern each, registered on one Typer app:

    cli/cache.py    ls, show, verify, rm, gc, prune, stats, export, import
    cli/keys.py     key (--explain, --diff KEY), diff
    cli/build.py    recipes, recipe, build
    cli/run.py      run (one prompt, a batch, or a model spec once)
    cli/remote.py   push, pull, prewarm, remote keygen
    cli/doctor.py   doctor (its report: artifactcache/doctor.py)
    cli/measure.py  coldstart, bench, compare

`acache --help` groups them in panels (HELP_PANELS in app.py). Every module
imports the heavy parts of the library (torch, backends) inside its command
functions, so `acache ls` never pays for importing torch.
"""

from __future__ import annotations

from .app import app, main

__all__ = ["app", "main"]
