"""Fused projections: q/k/v into one ``qkv_proj``, gate/up into one ``gate_up_proj``.

A decode step multiplies one token by every weight matrix, so it is bound by how fast
the weights are read, and one wide matrix reads faster than three narrow ones
(docs/perf-notes.md has the H200 GEMV probe). The surgery runs on a built model whose
weights are in, so checkpoints keep Hugging Face's names on disk, and the weights
digest stays the checkpoint's. It is layer-wise and in place: each layer's new
matrix is made, then the old ones are dropped, so the model's memory grows by at
most one layer's projections, never doubles.

The rows are concatenated in the order Phi-3 stores them (q, then k, then v; gate,
then up), which is the order ``Attention`` and ``MLP`` in models/llama.py split them
back in when ``fused`` is set.
"""

from __future__ import annotations

import torch
from torch import nn

from .llama import MLP, Attention


def _concat(parts: list[nn.Linear]) -> nn.Linear:
    """``parts[0]`` made to hold every part's rows, in order (biases alike).

    The first Linear is reused rather than a new one made: constructing an nn.Linear
    runs its random init, work thrown away here.
    """
    fused = parts[0]
    fused.weight = nn.Parameter(torch.cat([p.weight for p in parts]), requires_grad=False)
    if fused.bias is not None:
        biases = [p.bias for p in parts]
        fused.bias = nn.Parameter(torch.cat(biases), requires_grad=False)  # type: ignore[arg-type]
    fused.out_features = fused.weight.shape[0]
    return fused


@torch.no_grad()
def fuse_projections(model: nn.Module) -> int:
    """Fuse every unfused Attention and MLP of ``model`` in place; how many were fused."""
    # Only the blocks are listed: a list holding the old Linears would keep them alive.
    targets = [m for m in model.modules() if isinstance(m, (Attention, MLP)) and not m.fused]
    for module in targets:
        if isinstance(module, Attention):
            module.qkv_proj = _concat([module.q_proj, module.k_proj, module.v_proj])
            del module.q_proj, module.k_proj, module.v_proj
        else:
            module.gate_up_proj = _concat([module.gate_proj, module.up_proj])
            del module.gate_proj, module.up_proj
        module.fused = True
    return len(targets)
