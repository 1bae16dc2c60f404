"""Phi-2: parallel attention + MLP off one LayerNorm, partial rotary, GELU, biases.

Module names mirror transformers' PhiForCausalLM (``self_attn.dense``,
``mlp.fc1``, ``model.final_layernorm``), so its checkpoints load by name.

Because attention and MLP read the same normalized input and their outputs are summed,
a fused block (models/fuse.py, ``PhiBlock.fused``) runs two matmuls instead of six:
``in_proj`` = [q; k; v; fc1] on the LayerNorm's output, and ``out_proj`` = [dense | fc2]
on the attention output and the GELU side by side, with one bias (dense's + fc2's).
A block fused for quantization keeps dense and fc2 apart (``outputs_fused`` False):
int8wo has one scale per output row, and a row of ``out_proj`` would share it across
both matrices, the smaller one's weights rounded by the larger one's range.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from ..config import ModelConfig
from .common import CausalLM, KVCache, Reads, embedding, rope_and_attend
from .rows import row_linear


class PhiAttention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        hd, bias = cfg.head_dim, cfg.attention_bias
        self.q_proj = nn.Linear(cfg.dim, cfg.n_heads * hd, bias=bias)
        self.k_proj = nn.Linear(cfg.dim, cfg.n_kv_heads * hd, bias=bias)
        self.v_proj = nn.Linear(cfg.dim, cfg.n_kv_heads * hd, bias=bias)
        self.dense = nn.Linear(cfg.n_heads * hd, cfg.dim, bias=bias)
        self.kv_cache: KVCache | None = None

    def forward(self, x, cos, sin, reads: Reads, input_pos):
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        y = self.attend(q, k, v, cos, sin, reads, input_pos, self.dense)
        return self.dense(y)

    def attend(self, q, k, v, cos, sin, reads: Reads, input_pos, after=None):
        """q [B, T, H * D], k/v [B, T, Hkv * D] -> attention output [B, T, H * D]
        (``after``: the next projection, whose weight a decode step may prefetch into L2)."""
        B, T, _ = q.shape
        cfg = self.cfg
        q = q.view(B, T, cfg.n_heads, cfg.head_dim).transpose(1, 2)
        k = k.view(B, T, cfg.n_kv_heads, cfg.head_dim).transpose(1, 2)
        v = v.view(B, T, cfg.n_kv_heads, cfg.head_dim).transpose(1, 2)
        y = rope_and_attend(
            self.kv_cache, q, k, v, cos, sin, cfg.rotary_dim, input_pos, reads, after
        )
        return y.transpose(1, 2).reshape(B, T, cfg.n_heads * cfg.head_dim)


class PhiMLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.fc1 = nn.Linear(cfg.dim, cfg.intermediate_size, bias=cfg.mlp_bias)
        self.fc2 = nn.Linear(cfg.intermediate_size, cfg.dim, bias=cfg.mlp_bias)

    def forward(self, x):
        return self.fc2(gelu(self.fc1(x)))


def gelu(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x, approximate="tanh")  # HF "gelu_new"


class PhiBlock(nn.Module):
    # Set by models/fuse.py: ``in_proj`` replaces q/k/v/fc1, and ``out_proj`` dense/fc2
    # where ``outputs_fused``.
    fused = False
    outputs_fused = False
    in_proj: nn.Linear
    out_proj: nn.Linear

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.input_layernorm = nn.LayerNorm(cfg.dim, eps=cfg.norm_eps)
        self.self_attn = PhiAttention(cfg)
        self.mlp = PhiMLP(cfg)
        kv = cfg.n_kv_heads * cfg.head_dim
        self.in_sizes = [cfg.n_heads * cfg.head_dim, kv, kv, cfg.intermediate_size]
        # One decode row through acache's GEMV (models/rows.py): set by
        # CausalLM.use_row_gemv on a fused model.
        self.row_gemv = False

    def forward(self, x, cos, sin, reads: Reads, input_pos):
        if self.row_gemv and x.shape[0] == 1 and x.shape[1] == 1:
            return self.one_row(x, cos, sin, reads, input_pos)
        h = self.input_layernorm(x)
        if not self.fused:
            return x + self.self_attn(h, cos, sin, reads, input_pos) + self.mlp(h)
        q, k, v, up = self.in_proj(h).split(self.in_sizes, dim=-1)
        y = self.self_attn.attend(q, k, v, cos, sin, reads, input_pos, self.after_attention())
        if self.outputs_fused:
            return x + self.out_proj(torch.cat([y, gelu(up)], dim=-1))
        return x + self.self_attn.dense(y) + self.mlp.fc2(gelu(up))

    def after_attention(self) -> nn.Module:
        """The projection the fused block runs after attention: out_proj, or dense where
        the outputs stay apart."""
        return self.out_proj if self.outputs_fused else self.self_attn.dense

    def one_row(self, x, cos, sin, reads: Reads, input_pos):
        """The fused block for x [1, 1, dim] as GEMVs with the LayerNorm, GELU and skips
        folded in: LayerNorm + [q; k; v; fc1] with GELU on fc1's outputs (each computed
        once there, not by every program of the GEMV that reads it), then [dense | fc2]
        on [y | GELU(up)] + x (one GEMV reading y and up where they are: no
        concatenation kernel), or dense + x and fc2 + that where the outputs stay apart
        (quantized)."""
        qkvu = row_linear(
            self.in_proj, x, norm=self.input_layernorm, gelu_out_from=sum(self.in_sizes[:3])
        )
        q, k, v, up = qkvu.split(self.in_sizes, dim=-1)
        y = self.self_attn.attend(q, k, v, cos, sin, reads, input_pos, self.after_attention())
        if self.outputs_fused:
            return row_linear(self.out_proj, y, residual=x, x_tail=up)
        h = row_linear(self.self_attn.dense, y, residual=x)
        return row_linear(self.mlp.fc2, up, residual=h)


class PhiBackbone(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.embed_tokens = embedding(cfg.vocab_size, cfg.dim)
        self.layers = nn.ModuleList(PhiBlock(cfg) for _ in range(cfg.n_layers))
        self.final_layernorm = nn.LayerNorm(cfg.dim, eps=cfg.norm_eps)


class Phi2Model(CausalLM):
    """forward(idx [B, T], input_pos [T], row_start [B] | None, kv_pos [L] | None)
    -> logits [B, T, vocab] (fp32); neither row_start nor kv_pos: a prompt's first pass
    ([B, 1, vocab] when served: CausalLM.forward)."""

    FINAL_NORM = "final_layernorm"

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.model = PhiBackbone(cfg)
        self.lm_head = nn.Linear(cfg.dim, cfg.vocab_size, bias=True)
        self.max_seq_len = 0
