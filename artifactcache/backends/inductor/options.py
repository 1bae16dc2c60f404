"""inductor's own ``--extra`` option: the decode step's blocks compiled once.

``--extra layer_regions=0|1``: in a one-token step (decode), the model calls each layer
through torch.compile's nested compile region (``torch.compiler.nested_compile_region``;
models/common.py, ``layer_call``): Dynamo traces the block once, Inductor lowers,
schedules, tunes and generates its kernels once, and every layer calls that compiled
block. Without it Inductor handles one copy of the block's graph per layer. Measured
(docs/perf-notes.md, attempt 53; llama-7b, bf16), the decode step's compile took 23.7 s
against 49.6 s on an H200 and 32.8-39.7 s against 57.6-68.3 s on H100s, and its entry
decoded as fast or faster (242.9 against 238.2 tok/s on the H200).

The prompt passes (prefill, extend) always call their blocks plainly: with regions
their first pass took 1.06x (H200) to 1.44x (H100) as long, since a pass runs without
a CUDA graph and every region call costs host time in every layer.

On by default for the RMSNorm (llama) families, unquantized or int8wo: on an H100
(attempt 54) llama-7b's build took 45.5 s against 55.8, llama-3-8b's 49.6 against
69.6 and int8wo's 53.2 against 64.2, decoding 1.07x, 1.01x and 1.00x as fast. Off by
default for phi-2, whose build it cut only 7% (its prompt passes bound the build) while
decode ran 1.8% slower, and for int4wo, not measured. Asked for, either is tried. Off
with ``split_kv_rope`` (``layer_regions`` says why), the default of phi-2's one-row
builds and of phi-3's unquantized one-row ones (backends/shared/model_options.py):
asking for regions there is one line that says to add ``split_kv_rope=0``.
Torch-free.

The decode step with regions is compiled without Inductor's size and alignment asserts
(``region_configs``): a region's call would check its inputs again in every layer, on
the host, which a step run outside a CUDA graph (decode on CPU) pays per token. The
flag drops the step's own input asserts too. Its inputs' shapes are still checked by
the saved function's tensor guards (``torch_private.step_guards_kept``); the weights'
(whose guards that drops) are fixed by the key, as without regions.

A recipe whose passes are one token (``prefill_len`` 1) runs them through regions too:
the model tells decode by its one token (models/common.py, ``_one_token``).
"""

from __future__ import annotations

from typing import Any

from ...choices import BuildChoices
from ...errors import BackendError
from ..shared.model_options import (
    LLAMA_FAMILIES,
    SPLIT_KV_ROPE_EXTRA,
    parse_flag,
    split_kv_rope,
)

LAYER_REGIONS_EXTRA = "layer_regions"
INDUCTOR_EXTRA_KEYS = (LAYER_REGIONS_EXTRA,)
# Where decode's blocks are compiled once unless asked otherwise: the families of the
# llama block (measured on llama-7b and phi-3-mini, attempt 53).
LAYER_REGION_FAMILIES = LLAMA_FAMILIES
# The weights regions are the default for: bf16/fp16/fp32 and int8wo (measured, attempt 54).
LAYER_REGION_QUANT = (None, "int8wo")


def asked_layer_regions(opts: BuildChoices) -> bool | None:
    """The flag as given (a bad value is one line), None when left out: what the options
    alone can tell, before the recipe is known."""
    raw = opts.extra.get(LAYER_REGIONS_EXTRA)
    return None if raw is None else parse_flag(LAYER_REGIONS_EXTRA, raw)


def check_layer_regions(opts: BuildChoices) -> None:
    """What the options alone tell: a bad value, or regions asked for with
    ``split_kv_rope`` (``layer_regions`` says why), is one line."""
    if asked_layer_regions(opts) and split_kv_rope("inductor", opts):
        raise BackendError(_REGIONS_WITH_ROPE)


_REGIONS_WITH_ROPE = (
    f"--extra {LAYER_REGIONS_EXTRA}=1 cannot take --extra {SPLIT_KV_ROPE_EXTRA}=1: "
    "torch cannot compile a region around the kernel's cache writes; drop one"
)


def layer_regions(recipe: Any, opts: BuildChoices) -> bool:
    """Whether the decode step compiles each block once; a bad value is one line, and so
    is asking for regions with ``split_kv_rope``: a region's body is functionalized by
    torch.func.functionalize, which refuses a custom op that writes its inputs (the
    kernel's cache writes; torch 2.11 and 2.13), so such a build runs without them."""
    asked = asked_layer_regions(opts)
    if split_kv_rope("inductor", opts, recipe):
        if asked:
            if SPLIT_KV_ROPE_EXTRA in opts.extra:
                raise BackendError(_REGIONS_WITH_ROPE)
            # The rope is this build's default (model_options.split_kv_rope).
            raise BackendError(
                f"--extra {LAYER_REGIONS_EXTRA}=1: {recipe.family} decodes with the rope "
                "inside the split-KV kernel by default, and torch cannot compile a region "
                f"around its cache writes; add --extra {SPLIT_KV_ROPE_EXTRA}=0"
            )
        return False
    if asked is not None:
        return asked
    return recipe.family in LAYER_REGION_FAMILIES and opts.quant in LAYER_REGION_QUANT


def region_configs(regions: bool) -> dict[str, bool]:
    """Inductor config for the decode step with regions: no size, stride or alignment
    asserts (the module docstring says what still checks the inputs)."""
    return {"size_asserts": False, "alignment_asserts": False} if regions else {}
