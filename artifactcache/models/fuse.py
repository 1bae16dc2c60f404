"""Fused projections: q/k/v into one ``qkv_proj``, gate/up into one ``gate_up_proj``;
phi-2's six into ``in_proj`` and ``out_proj`` (models/phi2.py says how).

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
from .phi2 import PhiBlock


def _bias(linear: nn.Linear) -> torch.Tensor:
    if linear.bias is not None:
        return linear.bias
    return torch.zeros(linear.out_features, dtype=linear.weight.dtype, device=linear.weight.device)


def _concat(parts: list[nn.Linear]) -> nn.Linear:
    """``parts[0]`` made to hold every part's rows, in order (biases alike; a part
    without one adds zeros where another has one).

    The first Linear is reused rather than a new one made: constructing an nn.Linear
    runs its random init, work thrown away here.
    """
    fused = parts[0]
    fused.weight = nn.Parameter(torch.cat([p.weight for p in parts]), requires_grad=False)
    if any(p.bias is not None for p in parts):
        biases = torch.cat([_bias(p) for p in parts])
        fused.bias = nn.Parameter(biases, requires_grad=False)
    fused.out_features = fused.weight.shape[0]
    return fused


def _side_by_side(parts: list[nn.Linear]) -> nn.Linear:
    """``parts[0]`` made to take every part's input, concatenated, and return the sum of
    their outputs: the weights side by side (columns), one bias, the sum of theirs."""
    fused = parts[0]
    fused.weight = nn.Parameter(torch.cat([p.weight for p in parts], dim=1), requires_grad=False)
    if any(p.bias is not None for p in parts):
        bias = torch.stack([_bias(p) for p in parts]).sum(0)
        fused.bias = nn.Parameter(bias, requires_grad=False)
    fused.in_features = fused.weight.shape[1]
    return fused


def _fuse_phi_block(block: PhiBlock, outputs: bool) -> None:
    attn, mlp = block.self_attn, block.mlp
    block.in_proj = _concat([attn.q_proj, attn.k_proj, attn.v_proj, mlp.fc1])
    del attn.q_proj, attn.k_proj, attn.v_proj, mlp.fc1
    if outputs:
        block.out_proj = _side_by_side([attn.dense, mlp.fc2])
        del attn.dense, mlp.fc2
        block.outputs_fused = True


@torch.no_grad()
def fuse_projections(model: nn.Module, *, for_quant: bool = False) -> int:
    """Fuse every unfused Attention, MLP and PhiBlock of ``model`` in place; how many were
    fused. ``for_quant``: the model is to be quantized, so a PhiBlock keeps dense and fc2
    apart (models/phi2.py says why)."""
    # Only the blocks are listed: a list holding the old Linears would keep them alive.
    kinds = (Attention, MLP, PhiBlock)
    targets = [m for m in model.modules() if isinstance(m, kinds) and not m.fused]
    for module in targets:
        if isinstance(module, PhiBlock):
            _fuse_phi_block(module, outputs=not for_quant)
        elif isinstance(module, Attention):
            module.qkv_proj = _concat([module.q_proj, module.k_proj, module.v_proj])
            del module.q_proj, module.k_proj, module.v_proj
        else:
            module.gate_up_proj = _concat([module.gate_proj, module.up_proj])
            del module.gate_proj, module.up_proj
        module.fused = True
    return len(targets)
