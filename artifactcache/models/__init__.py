"""Decoder-only transformer families and their weights.

``build_model(recipe, device=..., dtype=..., weights=...)`` returns a model in
eval mode with its static KV cache set up for the recipe's shapes:

    logits = model(idx [B, T] int64, input_pos [T] int64, row_start [B] int64)  # [B, T, vocab] fp32

B is the recipe's ``max_batch`` (the KV cache's rows); ``row_start`` is each row's first
real slot when prompts of different lengths are left-padded (all 0 otherwise).
``kv_pos`` [L] int64 (optional, default the whole cache) makes attention read only the
first L cache positions (its length buckets: models/common.py):

    logits = model(idx, input_pos, row_start, kv_pos)

Without ``row_start`` and ``kv_pos`` the call is a prompt's first pass: input_pos must
be 0 .. T-1 (eager refuses another start), every row starts at slot 0, and attention
sees the pass's own keys causally, through SDPA's flash kernel. A model set up for
serving (``model.first_pass_last_logits = True``, as the backends build it) returns the
last position's logits only, [B, 1, vocab]:

    logits = model(idx, arange(T))

Families: ``llama``, ``mistral``, ``qwen2`` and ``qwen3`` (models/llama.py, the
last two through the recipe's ``qkv_bias`` / ``qk_norm`` flags), ``phi-3``
(llama.py with fused qkv and gate/up), ``phi-2`` (models/phi2.py). After the weights are
in, ``fuse_projections`` (models/fuse.py) and ``quant`` (models/quant.py) rework the model
in place.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from ..config import Recipe
from ..dtypes import torch_dtype
from .weights import check_checkpoint, init_random, load_checkpoint


def architecture(recipe: Recipe) -> nn.Module:
    """The recipe's model with its family's layers, weights uninitialized (build under meta)."""
    if recipe.family == "phi-2":
        from .phi2 import Phi2Model

        return Phi2Model(recipe.model)
    from .llama import LlamaModel

    return LlamaModel(recipe.model, fused=recipe.family == "phi-3")


def _on_meta(recipe: Recipe, dtype: torch.dtype) -> nn.Module:
    """The recipe's model on the meta device, its LM head tied where the recipe says."""
    with torch.device("meta"):
        model = architecture(recipe).to(dtype)
    if recipe.model.tie_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    return model


def check_weights(recipe: Recipe, path: Path, dtype: str) -> None:
    """A checkpoint's tensors against the recipe's model, from their headers alone (a
    one-line WeightsError for the first misfit): what a build would refuse, before it."""
    check_checkpoint(_on_meta(recipe, torch_dtype(dtype)), path)


@dataclass(frozen=True)
class WeightsSpec:
    """Where weights come from: a checkpoint path, or a random seed."""

    path: Path | None = None
    seed: int = 0

    def describe(self) -> str:
        return str(self.path) if self.path else f"random:{self.seed}"


def build_model(
    recipe: Recipe,
    *,
    device: str | torch.device = "cpu",
    dtype: str = "fp32",
    weights: WeightsSpec | None = None,
    max_seq_len: int | None = None,
    stamps: dict[str, float] | None = None,
    fuse_projections: bool = False,
    quant: str | None = None,
    split_kv_decode: bool = False,
    split_kv_rope: bool = False,
    row_gemv: bool = False,
    cudnn_prefill: bool = True,
    attention_prefetch: int = 0,
) -> nn.Module:
    """``stamps``, if given, receives perf_counter stamps of a checkpoint load's steps.

    ``split_kv_decode``: decode attends through the split-KV kernel (CUDA only;
    models/decode_attention.py), and the steps are given the whole cache;
    ``split_kv_rope`` with it: that kernel also rotates q and k and writes the cache.
    ``row_gemv``: one-row steps run acache's GEMV with the norms folded in (a fused
    llama-family model on CUDA; models/rows.py).
    ``cudnn_prefill``: whether a pass's attention may run cuDNN's SDPA kernel
    (models/common.py, ``sdpa``). ``attention_prefetch``: bytes of the projection after
    attention that a split-KV decode step prefetches into L2 (models/decode_attention.py).
    """
    weights = weights or WeightsSpec()
    dev = torch.device(device)
    tdtype = torch_dtype(dtype)
    model = _on_meta(recipe, tdtype)
    if weights.path is not None:
        load_checkpoint(model, Path(weights.path), dev, stamps=stamps)
    else:
        init_random(model, weights.seed, dev, tdtype)
    if fuse_projections:
        from .fuse import fuse_projections as fuse

        fuse(model, for_quant=quant is not None)
    if quant is not None:
        from .quant import quantize

        quantize(model, quant)
    if row_gemv:
        model.use_row_gemv()
    model.cudnn_prefill = cudnn_prefill
    model.attention_prefetch = attention_prefetch
    model.setup_caches(
        recipe.shapes.max_batch,
        max_seq_len or recipe.shapes.max_seq_len,
        split_kv_decode,
        split_kv_rope,
    )
    return model.eval().requires_grad_(False)
