"""models/rope.py: the rotation and its table."""

from __future__ import annotations

import torch

from artifactcache.models.rope import apply_rope, rope_cache
from artifactcache.recipes import load_recipe


def test_the_rotation_turns_each_pair_and_leaves_the_unrotated_dims():
    """rotate_half pairs dim i with i + rot/2; each pair turns by its angle (its norm
    kept), and the dims past rotary_dim come out as they went in (phi-2's 32 of 80)."""
    torch.manual_seed(0)
    x = torch.randn(1, 2, 3, 80)
    angles = torch.rand(3, 16)
    cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)
    y = apply_rope(x, cos, sin, 32)
    assert torch.equal(y[..., 32:], x[..., 32:])
    a, b = x[..., :16], x[..., 16:32]
    torch.testing.assert_close(y[..., :16], a * angles.cos() - b * angles.sin())
    torch.testing.assert_close(y[..., 16:32], b * angles.cos() + a * angles.sin())
    torch.testing.assert_close(y[..., :16] ** 2 + y[..., 16:32] ** 2, a**2 + b**2)


def test_the_table_is_cos_and_sin_of_position_times_frequency():
    cfg = load_recipe("tiny-llama").model
    table = rope_cache(cfg, 10)
    assert table.shape == (2, 10, cfg.rotary_dim) and table.dtype == torch.float32
    torch.testing.assert_close(table[0, 0], torch.ones(cfg.rotary_dim))  # position 0
    torch.testing.assert_close(table[0] ** 2 + table[1] ** 2, torch.ones(10, cfg.rotary_dim))
