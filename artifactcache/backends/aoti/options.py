"""aoti's own ``--extra`` option: how hard g++ optimizes each step's C++ wrapper.

``--extra wrapper_opt=O0|O1`` sets Inductor's ``aot_inductor.compile_wrapper_opt_level``
for every step. About half of a step's compile is g++ on that wrapper (the build records
each step's ``<step>_compile_children_cpu``). The wrapper is host code: it launches the
step's kernels, so its optimization level bears on a pass's launch time outside a CUDA
graph (prefill, extend) and not on captured decode. Left out, the build keeps torch's
own default (O1) and the key is as before; given, it is a key factor through the
codegen config. Torch-free until a value is given.
"""

from __future__ import annotations

from typing import Any

from ...choices import BuildChoices
from ...errors import BackendError

WRAPPER_OPT_EXTRA = "wrapper_opt"
WRAPPER_OPT_LEVELS = ("O0", "O1")
CONFIG_NAME = "aot_inductor.compile_wrapper_opt_level"
AOTI_EXTRA_KEYS = (WRAPPER_OPT_EXTRA,)


def wrapper_opt(opts: BuildChoices) -> str | None:
    """The wrapper's -O level this build asks for; None leaves torch's default."""
    value = opts.extra.get(WRAPPER_OPT_EXTRA)
    if value is None:
        return None
    level = str(value).strip().upper()
    if level not in WRAPPER_OPT_LEVELS:
        raise BackendError(
            f"--extra {WRAPPER_OPT_EXTRA} must be one of {', '.join(WRAPPER_OPT_LEVELS)}, "
            f"got {value!r}"
        )
    return level


def wrapper_configs(opts: BuildChoices) -> dict[str, Any]:
    """The Inductor config entry for the wrapper's level (empty when not given)."""
    level = wrapper_opt(opts)
    return {} if level is None else {CONFIG_NAME: level}


def check_wrapper_opt(opts: BuildChoices) -> None:
    """A bad level, or a torch whose Inductor has no such setting, is one line."""
    if wrapper_opt(opts) is None:
        return
    import torch
    import torch._inductor.config as inductor_config

    if not hasattr(inductor_config.aot_inductor, CONFIG_NAME.rsplit(".", 1)[1]):
        raise BackendError(
            f"torch {torch.__version__} has no {CONFIG_NAME}; leave out --extra {WRAPPER_OPT_EXTRA}"
        )
