"""models/gemv_tiles.py: the row GEMV's tile by the weights and the prologue, and how a
LayerNorm prologue reads x (plain Python: no Triton needed)."""

from __future__ import annotations

import pytest
import torch

from artifactcache.models import llama
from artifactcache.models.gemv_tiles import (
    LN_ONE_LOAD_MAX,
    SWEPT_FLOAT_TILES,
    GemvLaunch,
    gemv_launch,
    ln_block,
    prologue_kind,
)
from artifactcache.recipes import load_recipe


def test_the_tile_follows_the_weights_width_and_the_prologue():
    one = gemv_launch(4096, 4096, int8=True)
    assert (one.block_n, one.block_k) == (4, 1024)
    assert gemv_launch(4096, 11008, int8=True).block_n == 8  # a long k: fewer, longer programs
    assert gemv_launch(4096, 4096, int8=False).block_k < one.block_k  # 2 bytes a weight
    # A prologue's reads of x spread over more output channels a program.
    for int8 in (True, False):
        assert gemv_launch(4096, 4096, int8, "norm").block_n > gemv_launch(4096, 4096, int8).block_n
    assert gemv_launch(12288, 4096, True, "norm") == GemvLaunch(32, 256, 8)  # attempt 64
    # phi-2's: swept apart in bf16; int8 keeps the RMSNorm's and the plain tiles.
    assert gemv_launch(17920, 2560, False, "layer_norm") == GemvLaunch(16, 256, 8)
    assert gemv_launch(2560, 12800, False, "gelu") == GemvLaunch(8, 1024, 8)
    assert gemv_launch(17920, 2560, True, "layer_norm") == gemv_launch(17920, 2560, True, "norm")
    assert gemv_launch(2560, 12800, True, "gelu") == gemv_launch(2560, 12800, True)


def test_a_swept_shape_takes_its_own_tile_and_other_shapes_the_rules():
    """phi-3-mini's four float shapes and llama-3-8b's qkv take SWEPT_FLOAT_TILES' tiles
    (attempts 74 and 75's sweeps); the same shapes in int8, another prologue, or a
    neighbouring shape take the rules."""
    assert gemv_launch(16384, 3072, False, "norm") == GemvLaunch(8, 1024)
    assert gemv_launch(6144, 4096, False, "norm") == GemvLaunch(8, 512)
    assert gemv_launch(12288, 4096, False, "norm") == GemvLaunch(16, 256)  # llama-7b's qkv
    assert gemv_launch(9216, 3072, False, "norm") == GemvLaunch(16, 256, 8)
    assert gemv_launch(3072, 3072, False) == GemvLaunch(2, 1024)
    assert gemv_launch(3072, 8192, False, "silu_mul") == GemvLaunch(8, 1024, 8)
    int8 = {"norm": GemvLaunch(32, 256, 8)}
    for (n, k, prologue), tile in SWEPT_FLOAT_TILES.items():
        assert gemv_launch(n, k, False, prologue) == tile
        # int8 keeps its rules: 32 x 256 with a norm, 4 x 1024 (8 x 1024 past K 8192).
        long_k = GemvLaunch(8 if k > 8192 else 4, 1024)
        assert gemv_launch(n, k, True, prologue) == int8.get(prologue, long_k)
    assert gemv_launch(16384, 4096, False, "norm") == GemvLaunch(16, 256)  # not swept
    assert gemv_launch(3072, 3072, False, "norm") == GemvLaunch(16, 256)
    assert gemv_launch(3072, 8192, False) == GemvLaunch(4, 512)


def test_a_layernorm_reads_x_in_one_load_up_to_the_limit_and_in_two_passes_beyond():
    assert ln_block(2560, True) == 4096  # phi-2: a power of two that holds x
    assert ln_block(4096, True) == 4096
    assert ln_block(LN_ONE_LOAD_MAX, True) == LN_ONE_LOAD_MAX
    assert ln_block(LN_ONE_LOAD_MAX + 1, True) == 0  # the two passes
    assert ln_block(2560, False) == 0  # no LayerNorm
    assert ln_block(200, True, widest=128) == 0


def test_each_prologue_has_its_name():
    assert prologue_kind(True, True, False, -1) == "layer_norm"  # a LayerNorm has a weight too
    assert prologue_kind(True, False, False, -1) == "norm"
    assert prologue_kind(False, False, True, -1) == "silu_mul"
    assert prologue_kind(False, False, False, 0) == "gelu"
    assert prologue_kind(False, False, False, -1) is None


@pytest.mark.parametrize("name", ["llama-3-8b", "mistral-7b"])
def test_llama_3_8b_and_mistral_7b_fused_qkv_is_the_swept_shape(name):
    """The swept (6144, 4096) tile is these recipes' fused qkv projection after the
    RMSNorm, as the model builds it (on the meta device: no weights)."""
    with torch.device("meta"):
        attention = llama.Attention(load_recipe(name).model, fused=True)
    n, k = attention.qkv_proj.weight.shape
    assert (n, k) == (6144, 4096)
    assert gemv_launch(n, k, False, "norm") == SWEPT_FLOAT_TILES[(n, k, "norm")]


@pytest.mark.parametrize(
    ("name", "swept"),
    [("llama-7b", True), ("mistral-7b", True), ("phi-3-mini", True), ("llama-3-8b", False)],
)
def test_the_swept_lm_heads_are_the_recipes_heads(name, swept):
    """The LM head's (vocab, dim) after the final RMSNorm is a swept shape for llama-7b,
    mistral-7b and phi-3-mini, and not for llama-3-8b (within 1% of its best on the
    rules' tile)."""
    cfg = load_recipe(name).model
    assert ((cfg.vocab_size, cfg.dim, "norm") in SWEPT_FLOAT_TILES) is swept


def test_phi_2_out_projection_without_its_gelu_is_the_swept_shape():
    """phi-2's fused [dense | fc2] is (dim, 5 dim) with no prologue since the
    in-projection applies the GELU: the swept (2560, 12800) tile, not the plain rule."""
    cfg = load_recipe("phi-2").model
    n, k = cfg.dim, cfg.dim + cfg.intermediate_size
    assert (n, k) == (2560, 12800)
    assert gemv_launch(n, k, False, None) == GemvLaunch(8, 1024, 8)
