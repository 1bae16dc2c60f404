"""Llama / Mistral / Phi-3 / Qwen2 / Qwen3: RMSNorm, RoPE, GQA, SwiGLU, static KV cache.

Module names mirror Hugging Face's (``model.layers.0.self_attn.q_proj`` ...),
so a transformers checkpoint loads by name with no renaming. The families differ
only in flags of one block:

- Phi-3 fuses q/k/v into ``qkv_proj`` and gate/up into ``gate_up_proj`` (``fused``);
- Qwen2 has biases on q/k/v but not on o (``cfg.qkv_bias``);
- Qwen3 RMS-normalizes each head of q and k before RoPE (``cfg.qk_norm``: ``q_norm``,
  ``k_norm``), and its ``head_dim`` is free of ``dim / n_heads`` (``cfg.head_dim``).
"""

from __future__ import annotations

from torch import nn
from torch.nn import functional as F

from ..config import ModelConfig
from .common import CausalLM, KVCache, Reads, RMSNorm, embedding, rope_and_attend
from .rows import row_linear


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, fused: bool):
        super().__init__()
        self.cfg, self.fused = cfg, fused
        hd = cfg.head_dim
        self.q_size, self.kv_size = cfg.n_heads * hd, cfg.n_kv_heads * hd
        bias = cfg.attention_bias or cfg.qkv_bias
        if fused:
            self.qkv_proj = nn.Linear(cfg.dim, self.q_size + 2 * self.kv_size, bias=bias)
        else:
            self.q_proj = nn.Linear(cfg.dim, self.q_size, bias=bias)
            self.k_proj = nn.Linear(cfg.dim, self.kv_size, bias=bias)
            self.v_proj = nn.Linear(cfg.dim, self.kv_size, bias=bias)
        self.o_proj = nn.Linear(self.q_size, cfg.dim, bias=cfg.attention_bias)
        if cfg.qk_norm:
            self.q_norm = RMSNorm(hd, cfg.norm_eps)
            self.k_norm = RMSNorm(hd, cfg.norm_eps)
        self.kv_cache: KVCache | None = None

    def forward(self, x, cos, sin, reads: Reads, input_pos):
        if self.fused:
            q, k, v = self.split(self.qkv_proj(x))
        else:
            q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        y = self.attend(q, k, v, cos, sin, reads, input_pos, self.o_proj)
        return self.o_proj(y)

    def split(self, qkv):
        return qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)

    def attend(self, q, k, v, cos, sin, reads: Reads, input_pos, after=None):
        """q [B, T, H D], k/v [B, T, Hkv D] -> the attention output [B, T, H D], before
        o_proj (``after``: o_proj, whose weight a decode step may prefetch into L2)."""
        B, T, _ = q.shape
        cfg = self.cfg
        q = q.view(B, T, cfg.n_heads, cfg.head_dim)
        k = k.view(B, T, cfg.n_kv_heads, cfg.head_dim)
        if cfg.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        v = v.view(B, T, cfg.n_kv_heads, cfg.head_dim).transpose(1, 2)
        y = rope_and_attend(
            self.kv_cache, q, k, v, cos, sin, cfg.rotary_dim, input_pos, reads, after
        )
        return y.transpose(1, 2).reshape(B, T, self.q_size)


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig, fused: bool):
        super().__init__()
        self.fused = fused
        bias = cfg.mlp_bias
        if fused:
            self.gate_up_proj = nn.Linear(cfg.dim, 2 * cfg.intermediate_size, bias=bias)
        else:
            self.gate_proj = nn.Linear(cfg.dim, cfg.intermediate_size, bias=bias)
            self.up_proj = nn.Linear(cfg.dim, cfg.intermediate_size, bias=bias)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.dim, bias=bias)

    def forward(self, x):
        if self.fused:
            gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        else:
            gate, up = self.gate_proj(x), self.up_proj(x)
        return self.down_proj(F.silu(gate) * up)


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, fused: bool):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.self_attn = Attention(cfg, fused)
        self.post_attention_layernorm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.mlp = MLP(cfg, fused)

        # One decode row through acache's GEMV, norms and skips folded in (models/rows.py):
        # set by CausalLM.use_row_gemv on a fused model.
        self.row_gemv = False

    @property
    def fused(self) -> bool:
        """Whether q/k/v and gate/up are one projection each (what one_row reads)."""
        return self.self_attn.fused and self.mlp.fused

    def forward(self, x, cos, sin, reads: Reads, input_pos):
        if self.row_gemv and x.shape[0] == 1 and x.shape[1] == 1:
            return self.one_row(x, cos, sin, reads, input_pos)
        h = x + self.self_attn(self.input_layernorm(x), cos, sin, reads, input_pos)
        return h + self.mlp(self.post_attention_layernorm(h))

    def one_row(self, x, cos, sin, reads: Reads, input_pos):
        """The block for x [1, 1, dim] as four GEMVs: RMSNorm + qkv, o + skip,
        RMSNorm + gate/up, SiLU-and-mul + down + skip."""
        attn, mlp = self.self_attn, self.mlp
        qkv = row_linear(attn.qkv_proj, x, norm=self.input_layernorm)
        y = attn.attend(*attn.split(qkv), cos, sin, reads, input_pos, attn.o_proj)
        h = row_linear(attn.o_proj, y, residual=x)
        gate_up = row_linear(mlp.gate_up_proj, h, norm=self.post_attention_layernorm)
        return row_linear(mlp.down_proj, gate_up, silu_mul=True, residual=h)


class Backbone(nn.Module):
    def __init__(self, cfg: ModelConfig, fused: bool):
        super().__init__()
        self.embed_tokens = embedding(cfg.vocab_size, cfg.dim)
        self.layers = nn.ModuleList(Block(cfg, fused) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)


class LlamaModel(CausalLM):
    """forward(idx [B, T], input_pos [T], row_start [B] | None, kv_pos [L] | None)
    -> logits [B, T, vocab] (fp32); neither row_start nor kv_pos: a prompt's first pass
    ([B, 1, vocab] when served: CausalLM.forward)."""

    def __init__(self, cfg: ModelConfig, fused: bool = False):
        super().__init__()
        self.cfg = cfg
        self.model = Backbone(cfg, fused)
        self.lm_head = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        self.max_seq_len = 0
