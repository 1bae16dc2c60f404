"""The row GEMV's launch choices (models/gemv.py's kernel): each program's tile by the
weights' width and the prologue, the prologue's name, and how a LayerNorm prologue reads
x for its statistics. Plain Python: choosing a tile needs neither torch nor Triton.
"""

from __future__ import annotations

from dataclasses import dataclass

# The widest x a LayerNorm prologue reads in one load (its statistics; fp32 registers,
# 8192 values: 64 a thread at 4 warps); wider x takes two passes of the tile's width.
LN_ONE_LOAD_MAX = 8192
# Whether a LayerNorm prologue over float or int8 weights issues its first weight tile's
# load before it reads x for the statistics (models/gemv.py). Off until a GPU has timed
# a gain (docs/perf-notes.md attempt 76: in the sm_90 SASS the load goes out after x's
# round trip, ahead of the reductions only). Read at each launch, so that
# benchmarks/row_gemv.py times the kernel both ways.
LN_EARLY_TILE = False


def ln_block(k: int, layer_norm: bool, widest: int | None = None) -> int:
    """The kernel's LN_BLOCK: the power of two that holds x's K values for a LayerNorm's
    one-load statistics, or 0 (no LayerNorm, or x wider than ``widest``, by default
    LN_ONE_LOAD_MAX read at the call: the two passes)."""
    widest = LN_ONE_LOAD_MAX if widest is None else widest
    return 1 << (k - 1).bit_length() if layer_norm and k <= widest else 0


@dataclass(frozen=True)
class GemvLaunch:
    """A program's tile: ``block_n`` output channels by ``block_k`` input channels, and
    the loop steps whose weights are in flight at once (``stages``; 1: the step's own)."""

    block_n: int
    block_k: int
    num_warps: int = 4
    stages: int = 1


# Float weights' tiles that a sweep chose for one shape, (n, k, prologue) -> tile, ahead
# of gemv_launch's rules (benchmarks/row_gemv.py --sweep, 30 tiles a shape in bf16 on an
# H100, 2026-12-07):
# - phi-3-mini's four projections (docs/perf-notes.md attempt 74): gate/up 1.142x the
#   rules' 16 x 256, down 1.075x their 4 x 1024, o 1.064x their 4 x 512, qkv 1.024x their
#   16 x 256; the model with them and attempt 73's rope and prefetch decoded 1.095x the
#   model with neither (attempt 75);
# - llama-3-8b's and mistral-7b's qkv (attempt 75): 1.084x the rules' 16 x 256 alone, not
#   measured in a model. llama's other six shapes ran within 3% of their best on the rules'
#   tiles, and keep them;
# - the LM heads after the final norm (attempt 76): llama-7b's and mistral-7b's 1.055x
#   the rules' 16 x 256, phi-3-mini's 1.059x; llama-3-8b's (1.009x) and phi-2's (1.000x)
#   keep the rules;
# - phi-2's [dense | fc2] where the in-projection applies the GELU (attempt 76): not
#   swept in this form; the tile it had with the GELU prologue (8 x 1024, 8 warps, within
#   1.4% of that sweep's best), at which c76a timed it without the prologue, where the
#   rules' plain tile would be 4 x 512.
# Shapes no sweep has timed take the rules; fp16 and fp32 weights of these shapes take
# these tiles too (not swept).
SWEPT_FLOAT_TILES = {
    (9216, 3072, "norm"): GemvLaunch(block_n=16, block_k=256, num_warps=8),
    (3072, 3072, None): GemvLaunch(block_n=2, block_k=1024),
    (16384, 3072, "norm"): GemvLaunch(block_n=8, block_k=1024),
    (3072, 8192, "silu_mul"): GemvLaunch(block_n=8, block_k=1024, num_warps=8),
    (6144, 4096, "norm"): GemvLaunch(block_n=8, block_k=512),
    (32000, 4096, "norm"): GemvLaunch(block_n=2, block_k=1024),
    (32064, 3072, "norm"): GemvLaunch(block_n=8, block_k=1024),
    (2560, 12800, None): GemvLaunch(block_n=8, block_k=1024, num_warps=8),
}


def gemv_launch(
    n: int, k: int, int8: bool, prologue: str | None = None, int4_group: int = 0
) -> GemvLaunch:
    """The tile for one row times [n, k], by the weights' width and the prologue
    (``"norm"``, ``"layer_norm"``, ``"silu_mul"``, ``"gelu"`` or None). Every program reads
    the x tile (and the norm's weights) beside its weight tile, so a prologue wants more
    output channels a program to spread those reads over; the SiLU-and-mul GEMVs have a
    long K.

    phi-2's (float weights, swept in bf16 on its fused shapes, H100, docs/perf-notes.md
    attempt 62): the LayerNorm 16 x 256 with 8 warps (5% under 4 warps, level with the
    kernel without its prologue), GELU 8 x 1024 with 8 warps (6% under the plain tile).
    int8 weights take the RMSNorm's and the plain tiles there (not swept).
    bf16 (benchmarks/row_gemv.py's sweep of 30 tiles on phi-3-mini's and llama-7b's
    shapes, docs/perf-notes.md attempt 36): 16 x 256 with the norm (tied with 32 x 256
    for the best sum over the four norm shapes, 3% under 4 x 512's), 4 x 1024 for
    SiLU-and-mul (8% under 4 x 512 on phi-3-mini's down projection), 4 x 512 otherwise
    (within 6% of the best).
    int8: 4 x 1024 alone, 8 x 1024 for a long K (the best or within 4% of the best of
    32 tiles without a prologue, attempt 30; still the best or within 2% of 52 on
    llama-7b's o and down projections, H100, attempt 64); with the norm, 32 x 256 with 8
    warps (attempt 64's sweep: the best of 52 on llama-7b's qkv, 13% under the 16 x 512
    it had, and within 1.5% of the best on gate/up).
    int4 (``int4_group`` > 0): 8 x 1024, 8 warps, the best sum over llama-7b's four
    shapes of 32 tiles (H100, docs/perf-notes.md attempt 58), 2% under 4 warps.
    Float weights of a shape in SWEPT_FLOAT_TILES take the tile swept for it.
    """
    if int4_group:
        return GemvLaunch(block_n=8, block_k=max(1024, int4_group), num_warps=8)
    if int8:
        if prologue in ("norm", "layer_norm"):
            return GemvLaunch(block_n=32, block_k=256, num_warps=8)
        return GemvLaunch(block_n=8 if k > 8192 else 4, block_k=1024)
    swept = SWEPT_FLOAT_TILES.get((n, k, prologue))
    if swept is not None:
        return swept
    if prologue == "layer_norm":
        return GemvLaunch(block_n=16, block_k=256, num_warps=8)
    if prologue == "gelu":
        return GemvLaunch(block_n=8, block_k=1024, num_warps=8)
    if prologue == "norm":
        return GemvLaunch(block_n=16, block_k=256)
    if prologue == "silu_mul":
        return GemvLaunch(block_n=4, block_k=1024)
    return GemvLaunch(block_n=4, block_k=512)


def prologue_kind(norm: bool, layer_norm: bool, silu_mul: bool, gelu_from: int) -> str | None:
    """gemv_launch's name for the kernel's prologue (a norm's weight given: ``norm``)."""
    if layer_norm:
        return "layer_norm"
    if norm:
        return "norm"
    if silu_mul:
        return "silu_mul"
    return "gelu" if gelu_from >= 0 else None
