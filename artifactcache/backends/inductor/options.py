"""inductor's own ``--extra`` option: each transformer block compiled once.

``--extra layer_regions=0|1`` calls the model's layers through torch.compile's nested
compile region (``torch.compiler.nested_compile_region``; models/common.py,
``layer_call``): Dynamo traces the block once and Inductor lowers, schedules and
generates its kernels once, and every layer calls that compiled block. Without it
Inductor handles one copy of the block's graph per layer, which is most of a step's
compile (docs/perf-notes.md, attempt 53). Left out, the key is as before; given, it
is a key factor. Torch-free but for the check a build makes that torch has the region.
"""

from __future__ import annotations

from ...choices import BuildChoices
from ...errors import BackendError
from ..shared.model_options import parse_flag

LAYER_REGIONS_EXTRA = "layer_regions"
INDUCTOR_EXTRA_KEYS = (LAYER_REGIONS_EXTRA,)


def layer_regions(opts: BuildChoices) -> bool:
    """Whether the steps compile each block once (off unless asked)."""
    return parse_flag(LAYER_REGIONS_EXTRA, opts.extra.get(LAYER_REGIONS_EXTRA, False))


def option_factors(opts: BuildChoices) -> dict[str, bool]:
    """The key factor, only when the option is given (so older keys stay as they were)."""
    if LAYER_REGIONS_EXTRA not in opts.extra:
        return {}
    return {LAYER_REGIONS_EXTRA: layer_regions(opts)}


def check_layer_regions_supported(opts: BuildChoices) -> None:
    """A torch without nested compile regions is one line, at the start of a build."""
    if not layer_regions(opts):
        return
    import torch

    if not hasattr(torch.compiler, "nested_compile_region"):
        raise BackendError(
            f"torch {torch.__version__} has no torch.compiler.nested_compile_region; "
            f"leave out --extra {LAYER_REGIONS_EXTRA}"
        )
