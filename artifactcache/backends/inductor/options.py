"""inductor's own ``--extra`` option: each transformer block compiled once.

``--extra layer_regions=0|1`` calls the model's layers through torch.compile's nested
compile region (``torch.compiler.nested_compile_region``; models/common.py,
``layer_call``): Dynamo traces the block once, Inductor lowers, schedules and generates
its kernels once, and every layer calls that compiled block. Without it Inductor
handles one copy of the block's graph per layer, most of a step's compile: on one H200,
llama-7b's build took 29.0 s with it against 56.0 s without, decode 242.9 against 238.2
tok/s (docs/perf-notes.md, attempt 53).

On by default for unquantized builds of the RMSNorm (llama) families. Off by default
for phi-2: its prefill step's token count was specialized to one length inside the
region on torch 2.11 (CUDA), a failed build, which the same torch does not do to the
llama blocks. Off by default for --quant builds: an int8wo llama-7b entry built with
regions ran its first pass in 240 ms on an H100, with no baseline measured beside it.
Asked for, either is tried. Torch-free but for the check a build makes that torch has
the region.

With regions, each step is compiled without Inductor's size and alignment asserts
(``region_configs``): a region's call checks its inputs again, in every layer, on the
host, which a pass step (run without a CUDA graph) pays per request.
"""

from __future__ import annotations

from typing import Any

from ...choices import BuildChoices
from ...errors import BackendError
from ..shared.model_options import ROW_GEMV_FAMILIES, parse_flag

LAYER_REGIONS_EXTRA = "layer_regions"
INDUCTOR_EXTRA_KEYS = (LAYER_REGIONS_EXTRA,)
# Where each block is compiled once unless asked otherwise: the families whose steps
# built and served with it (attempt 53).
LAYER_REGION_FAMILIES = ROW_GEMV_FAMILIES


def layer_regions(recipe: Any, opts: BuildChoices) -> bool:
    """Whether the steps compile each block once; a bad value is one line."""
    raw = opts.extra.get(LAYER_REGIONS_EXTRA)
    if raw is not None:
        return parse_flag(LAYER_REGIONS_EXTRA, raw)
    return recipe.family in LAYER_REGION_FAMILIES and opts.quant is None


def region_configs(regions: bool) -> dict[str, bool]:
    """Inductor config for a step compiled with regions: no re-checks of each region's
    inputs (sizes, strides, alignment), which the step's own inputs were checked for."""
    return {"size_asserts": False, "alignment_asserts": False} if regions else {}


def check_layer_regions_supported(recipe: Any, opts: BuildChoices) -> None:
    """A torch without nested compile regions is one line when they were asked for, at
    the start of a build; by default such a torch compiles every layer as before."""
    if not layer_regions(recipe, opts) or LAYER_REGIONS_EXTRA not in opts.extra:
        return
    import torch

    if not hasattr(torch.compiler, "nested_compile_region"):
        raise BackendError(
            f"torch {torch.__version__} has no torch.compiler.nested_compile_region; "
            f"leave out --extra {LAYER_REGIONS_EXTRA}"
        )
