"""What a recipe's model needs in memory, and whether that fits the device.

Which shapes a model can be built for at all is config.py's ``shape_problem``.

Weights are counted from the architecture built on the ``meta`` device (exact for
every family, no memory used); the KV cache from the recipe's shapes. A build or a
load whose weights plus allocated KV cache exceed what the device has free is
refused before anything is built (``check_fits_memory``), with one line.

The memory asked of the device is ``weights + kv_cache + prefill_logits`` (the
logits of the longest prefill pass), and it must stay within ``FIT_FRACTION`` of the
free memory: the rest is left for the other activations, the
allocator's rounding and (on CPU) the process itself. So the check refuses what
cannot fit; passing it does not promise a build that needs far more (a compiler
holding a second copy of the weights, say) will fit.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from .devices import is_cuda
from .dtypes import DTYPES, check_dtype, torch_dtype
from .errors import ShapeError
from .host import cgroup_memory_available

if TYPE_CHECKING:
    from .config import Recipe

DTYPE_BYTES = {name: d.bytes for name, d in DTYPES.items()}
FIT_FRACTION = 0.9


def kv_bytes_per_position(recipe: Recipe, dtype: str, batch: int = 1) -> int:
    """Keys plus values of one token position, over every layer and row of the batch."""
    m = recipe.model
    return 2 * m.n_layers * batch * m.n_kv_heads * m.head_dim * DTYPE_BYTES[dtype]


def kv_allocated_bytes(recipe: Recipe, dtype: str) -> int:
    """The static KV cache as built: max_batch x max_seq_len positions."""
    s = recipe.shapes
    return kv_bytes_per_position(recipe, dtype, s.max_batch) * s.max_seq_len


# A meta model of a 7B recipe takes 40-140 ms to build, and one CLI command asks for its
# size more than once (the memory check, the build plan, the roofline). Keyed by what
# models.architecture reads, the family and the model's config, the latter by its repr:
# a checkpoint's rope_scaling is a dict, which lru_cache cannot hash.
_WEIGHT_BYTES: dict[tuple[str, str, str, str | None], tuple[int, int]] = {}


def weight_bytes(recipe: Recipe, dtype: str, quant: str | None = None) -> tuple[int, int]:
    """(every weight but the input embedding table, that table) in bytes.

    A tied LM head shares the table's storage: it is counted once, as the head
    (``lm_head.weight``), and the table then adds nothing. With ``quant``, the layers
    are counted as a decode step reads them (models/quant.py, run on the meta device:
    int8 weights and scales; int4's nibbles, scales and zeros, one of the two copies a
    CUDA build stores).
    """
    key = (recipe.family, repr(recipe.model), dtype, quant)
    if key not in _WEIGHT_BYTES:
        _WEIGHT_BYTES[key] = _weight_bytes(recipe, dtype, quant)
    return _WEIGHT_BYTES[key]


def _weight_bytes(recipe: Recipe, dtype: str, quant: str | None) -> tuple[int, int]:
    import torch

    from .models import architecture

    check_dtype(dtype)  # an unknown name is a one-line error, not a KeyError
    with torch.device("meta"):
        model = architecture(recipe).to(torch_dtype(dtype))
    if quant is not None:
        from .models.quant import quantize

        quantize(model, quant)
    rest = embed = 0
    for name, t in [*model.named_parameters(), *model.named_buffers()]:
        n = t.numel() * t.element_size()
        if name.endswith("embed_tokens.weight"):
            embed += 0 if recipe.model.tie_embeddings else n
        else:
            rest += n
    return rest, embed


def _meminfo_available(meminfo: Path = Path("/proc/meminfo")) -> int | None:
    """MemAvailable: what the kernel can give without swapping (page cache included)."""
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024  # the file says kB, meaning KiB
    except (OSError, ValueError, IndexError):
        return None
    return None


def available_memory(device: str) -> int | None:
    """Free bytes on the device: CUDA's free memory, or the host's available RAM under
    this process's cgroup memory limit (host.py).

    None when it cannot be read (a platform without /proc/meminfo or sysconf, a
    torch that cannot query the GPU): the fit is then not checked, and the build
    reports the device's own error.
    """
    if is_cuda(device):
        import torch

        try:
            free, _total = torch.cuda.mem_get_info(torch.device(device))
        except (RuntimeError, AssertionError):  # no CUDA in this torch, or no driver
            return None
        return int(free)
    avail = _meminfo_available()
    if avail is None:
        try:  # free pages only: without page cache, so it errs towards refusing less often
            avail = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):
            avail = None
    # A container's memory limit caps what the host's counters show.
    capped = cgroup_memory_available()
    if capped is None:
        return avail
    return capped if avail is None else min(avail, capped)


def prefill_logits_bytes(recipe: Recipe, dtype: str) -> int:
    """The logits of the longest prefill pass: every row and position, in the dtype and
    then in fp32 (the steps' output), which a 4096-token pass makes GiB-sized."""
    s = recipe.shapes
    return s.max_batch * s.prefill_len * recipe.model.vocab_size * (DTYPE_BYTES[dtype] + 4)


def memory_needed(recipe: Recipe, dtype: str) -> dict[str, int]:
    rest, embed = weight_bytes(recipe, dtype)
    kv = kv_allocated_bytes(recipe, dtype)
    logits = prefill_logits_bytes(recipe, dtype)
    return {
        "weights": rest + embed, "kv_cache": kv, "prefill_logits": logits,
        "total": rest + embed + kv + logits,
    }  # fmt: skip


def check_fits_memory(
    recipe: Recipe,
    dtype: str,
    device: str,
    *,
    free_bytes: Callable[[str], int | None] | None = None,
) -> None:
    """ShapeError when weights + allocated KV cache exceed FIT_FRACTION of free memory.

    ``free_bytes(device)`` is the memory query (default: available_memory).
    """
    free = (free_bytes or available_memory)(device)
    if free is None:
        return
    need = memory_needed(recipe, dtype)
    if need["total"] <= FIT_FRACTION * free:
        return
    gib = 1 << 30
    raise ShapeError(
        f"recipe {recipe.name} at max_seq_len {recipe.shapes.max_seq_len}, max_batch "
        f"{recipe.shapes.max_batch} needs "
        f"{need['weights'] / gib:.2f} GiB of {dtype} weights + {need['kv_cache'] / gib:.2f} GiB "
        f"of KV cache + {need['prefill_logits'] / gib:.2f} GiB of a prefill pass's logits, "
        f"more than {FIT_FRACTION:.0%} of the {free / gib:.2f} GiB free on "
        f"{device}; pass a smaller --max-seq-len, --max-batch or dtype"
    )
