"""aoti's own ``--extra`` option: how hard g++ optimizes each step's C++ wrapper.

``--extra wrapper_opt=O0|O1`` sets Inductor's ``aot_inductor.compile_wrapper_opt_level``
for every step. g++ on that wrapper took 6-11 s of each llama-7b step's compile on the
H100 hosts (docs/perf-notes.md, attempt 52). The wrapper is host code that launches the
step's kernels; on llama-7b, O0 left prefill, decode and the warm load as they were,
and its effect on the build time was not measured, so torch's O1 stays the default. O0
is for a wrapper g++ will not optimize (Inductor's "too big to optimize" error names
it). Left out, the key is as before; given, it is a key factor through the codegen
config. Torch-free but for the check a build makes that torch has the setting.
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


def check_wrapper_opt_supported(opts: BuildChoices) -> None:
    """A torch whose Inductor has no such setting is one line, at the start of a build.

    Not in check_options: that runs on every load too, and importing Inductor's config
    costs a warm load ~1.4 s (it imports ``torch._inductor``), which a load never needs.
    """
    if wrapper_opt(opts) is None:
        return
    import torch
    import torch._inductor.config as inductor_config

    if not hasattr(inductor_config.aot_inductor, CONFIG_NAME.rsplit(".", 1)[1]):
        raise BackendError(
            f"torch {torch.__version__} has no {CONFIG_NAME}; leave out --extra {WRAPPER_OPT_EXTRA}"
        )
