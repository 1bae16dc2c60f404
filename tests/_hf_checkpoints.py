"""Tiny transformers-saved checkpoints, one per family and variant (not a test module).

Each config differs from every built-in recipe in dims, heads, kv heads, head_dim,
rope scaling, tying or biases. ``save_hf`` gives the norms and biases non-trivial
values, so a loader that dropped one would change the logits.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import transformers as T

SEQ = 48  # >= 40 tokens, and past every sliding window below

LLAMA3_ROPE = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    # Small, so that the 16 frequencies fall in all three bands (kept, interpolated, scaled).
    "original_max_position_embeddings": 256,
}


def _longrope(rotary_half: int) -> dict[str, Any]:
    return {
        "rope_type": "longrope",
        "short_factor": [1.0 + 0.25 * i for i in range(rotary_half)],
        "long_factor": [2.0 + 0.5 * i for i in range(rotary_half)],
    }


COMMON = dict(vocab_size=300, num_hidden_layers=2, max_position_embeddings=512)
CASES: dict[str, tuple[type, type, dict[str, Any]]] = {
    "llama": (
        T.LlamaConfig,
        T.LlamaForCausalLM,
        dict(hidden_size=96, intermediate_size=120, num_attention_heads=6, num_key_value_heads=2,
             rope_theta=5e5),
    ),
    "llama-3.1-rope": (
        T.LlamaConfig,
        T.LlamaForCausalLM,
        dict(hidden_size=96, intermediate_size=120, num_attention_heads=3, num_key_value_heads=1,
             rope_theta=5e5, rope_scaling=LLAMA3_ROPE),
    ),
    "llama-3.2-tied": (
        T.LlamaConfig,
        T.LlamaForCausalLM,
        dict(hidden_size=80, intermediate_size=144, num_attention_heads=5, num_key_value_heads=5,
             rope_theta=5e5, rope_scaling=LLAMA3_ROPE, tie_word_embeddings=True),
    ),
    "llama-biases-head-dim": (
        T.LlamaConfig,
        T.LlamaForCausalLM,
        dict(hidden_size=64, intermediate_size=100, num_attention_heads=4, num_key_value_heads=2,
             head_dim=24, attention_bias=True, mlp_bias=True),
    ),
    "llama-linear-rope": (
        T.LlamaConfig,
        T.LlamaForCausalLM,
        dict(hidden_size=48, intermediate_size=64, num_attention_heads=2, num_key_value_heads=1,
             rope_scaling={"rope_type": "linear", "factor": 4.0}),
    ),
    "llama-dynamic-rope": (
        T.LlamaConfig,
        T.LlamaForCausalLM,
        dict(hidden_size=48, intermediate_size=64, num_attention_heads=2, num_key_value_heads=2,
             rope_scaling={"rope_type": "dynamic", "factor": 2.0}),
    ),
    "mistral": (
        T.MistralConfig,
        T.MistralForCausalLM,
        dict(hidden_size=80, intermediate_size=96, num_attention_heads=5, num_key_value_heads=1,
             sliding_window=12, rope_theta=1e6),
    ),
    "phi-2": (
        T.PhiConfig,
        T.PhiForCausalLM,
        dict(hidden_size=96, intermediate_size=200, num_attention_heads=6, num_key_value_heads=6,
             partial_rotary_factor=0.375),
    ),
    "phi-3": (
        T.Phi3Config,
        T.Phi3ForCausalLM,
        dict(hidden_size=96, intermediate_size=160, num_attention_heads=6, num_key_value_heads=3,
             pad_token_id=0, sliding_window=20),
    ),
    "phi-3-longrope": (
        T.Phi3Config,
        T.Phi3ForCausalLM,
        dict(hidden_size=64, intermediate_size=160, num_attention_heads=4, num_key_value_heads=4,
             pad_token_id=0, original_max_position_embeddings=64,
             rope_scaling=_longrope(8)),
    ),
    "qwen2": (
        T.Qwen2Config,
        T.Qwen2ForCausalLM,
        dict(hidden_size=96, intermediate_size=136, num_attention_heads=6, num_key_value_heads=2,
             rope_theta=1e6),
    ),
    "qwen2.5-tied": (
        T.Qwen2Config,
        T.Qwen2ForCausalLM,
        dict(hidden_size=64, intermediate_size=176, num_attention_heads=4, num_key_value_heads=1,
             rope_theta=1e6, tie_word_embeddings=True, rms_norm_eps=1e-5),
    ),
    # Every layer slides (the window starts at layer 0).
    "qwen2-sliding": (
        T.Qwen2Config,
        T.Qwen2ForCausalLM,
        dict(hidden_size=48, intermediate_size=80, num_attention_heads=2, num_key_value_heads=2,
             use_sliding_window=True, sliding_window=12, max_window_layers=0),
    ),
    "qwen2-linear-rope": (
        T.Qwen2Config,
        T.Qwen2ForCausalLM,
        dict(hidden_size=48, intermediate_size=80, num_attention_heads=4, num_key_value_heads=2,
             rope_scaling={"rope_type": "linear", "factor": 2.0}),
    ),
    # head_dim 24 where hidden/heads is 16: qwen3's head_dim is its own.
    "qwen3": (
        T.Qwen3Config,
        T.Qwen3ForCausalLM,
        dict(hidden_size=64, intermediate_size=112, num_attention_heads=4, num_key_value_heads=2,
             head_dim=24, rope_theta=1e6),
    ),
    "qwen3-tied-bias": (
        T.Qwen3Config,
        T.Qwen3ForCausalLM,
        dict(hidden_size=80, intermediate_size=144, num_attention_heads=5, num_key_value_heads=5,
             head_dim=32, tie_word_embeddings=True, attention_bias=True),
    ),
    "qwen3-llama3-rope": (
        T.Qwen3Config,
        T.Qwen3ForCausalLM,
        dict(hidden_size=64, intermediate_size=96, num_attention_heads=2, num_key_value_heads=1,
             head_dim=32, rope_theta=5e5, rope_scaling=LLAMA3_ROPE),
    ),
}  # fmt: skip


def save_hf(cls_config: type, cls_model: type, kw: dict[str, Any], out: Path, seed: int = 0,
            **save_kw: Any) -> Any:  # fmt: skip
    """A transformers model with non-trivial norms and biases, saved by save_pretrained."""
    torch.manual_seed(seed)
    model = cls_model(cls_config(**{**COMMON, **kw})).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1:  # norm scales around 1, biases around 0: both must be loaded
                p.normal_(1.0 if "norm" in name and "bias" not in name else 0.0, 0.1)
    model.save_pretrained(out, **save_kw)
    return model
