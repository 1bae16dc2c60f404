"""Rotary position embedding: the inverse frequencies with a config's scaling, the
cos/sin table a model keeps, and the rotation (Hugging Face's rotate_half layout).

The split-KV decode kernel rotates q and k itself with the same arithmetic
(models/decode_attention.py, ``_rotated``): apply_rope is its reference.
"""

from __future__ import annotations

import math

import torch

from ..config import ModelConfig


def llama3_inv_freq(inv: torch.Tensor, rs: dict) -> torch.Tensor:
    """Llama-3.1 scaling: low frequencies slowed by ``factor``, high ones kept, the band
    between interpolated (the arithmetic of transformers' _compute_llama3_parameters)."""
    factor, low, high = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"]
    old_ctx = rs["original_max_position_embeddings"]
    low_wl, high_wl = old_ctx / low, old_ctx / high
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > low_wl, inv / factor, inv)
    smooth = (old_ctx / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= high_wl) & (wavelen <= low_wl)
    return torch.where(medium, smoothed, scaled)


def rope_inv_freq(cfg: ModelConfig) -> torch.Tensor:
    """Inverse frequencies over the rotary dims, with the config's rope scaling."""
    dim = cfg.rotary_dim
    exponents = torch.arange(0, dim, 2, dtype=torch.float64) / dim
    inv = 1.0 / (cfg.rope_theta**exponents)
    rs = cfg.rope_scaling or {}
    kind = rs.get("type")
    if kind == "llama3":
        inv = llama3_inv_freq(inv, rs)
    elif kind == "linear":
        inv = inv / rs["factor"]
    elif kind == "longrope":
        # Positions never pass original_max_position_embeddings (parse_recipe
        # refuses such shapes), so transformers uses the short factors throughout.
        inv = inv / torch.tensor(rs["short_factor"], dtype=torch.float64)
    # "dynamic" (NTK) equals plain RoPE up to max_position_embeddings, and
    # max_seq_len never exceeds it.
    return inv.to(torch.float32)


def rope_attention_factor(cfg: ModelConfig) -> float:
    """The scale transformers puts on cos and sin (longrope's; 1 otherwise)."""
    rs = cfg.rope_scaling or {}
    return float(rs["attention_factor"]) if rs.get("type") == "longrope" else 1.0


def rope_cache(cfg: ModelConfig, max_seq_len: int) -> torch.Tensor:
    """[max_seq_len, rotary_dim] cos and sin, stacked as [2, S, rotary_dim] in fp32."""
    inv = rope_inv_freq(cfg)
    t = torch.arange(max_seq_len, dtype=torch.float32)
    freqs = torch.outer(t, inv)
    emb = torch.cat([freqs, freqs], dim=-1)  # HF's rotate_half layout
    scale = rope_attention_factor(cfg)
    return torch.stack([emb.cos() * scale, emb.sin() * scale])


def apply_rope(
    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rotary_dim: int
) -> torch.Tensor:
    """x: [B, H, T, D]; cos/sin: [T, rotary_dim]. Rotates the first rotary_dim dims."""
    xr, xp = x[..., :rotary_dim], x[..., rotary_dim:]
    half = rotary_dim // 2
    rot = torch.cat([-xr[..., half:], xr[..., :half]], dim=-1)
    out = (xr.float() * cos + rot.float() * sin).to(x.dtype)
    return torch.cat([out, xp], dim=-1) if xp.shape[-1] else out
