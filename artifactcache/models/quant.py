"""Weight-only int8 (``--quant int8wo``): int8 weights with one scale per output channel.

gpt-fast's scheme: each row ``w`` of a Linear's weight is stored as
``round(w / s)`` in int8 with ``s = max|w| / 127``, and the layer computes
``F.linear(x, w_int8.to(x.dtype)) * s (+ bias)``. Activations stay in the model's
dtype. A decode step reads the weights once, so reading one byte per weight instead
of two is what speeds it up; that only happens where the cast is fused into the
matmul: Inductor's M=1 rewrite (``coordinate_descent_tuning``, on by default on CUDA
for inductor and aoti) turns the decode matmul into one Triton reduction that loads
the int8 weights. Elsewhere (eager, CPU, the prefill's real GEMMs) the cast makes a
full-width copy of each weight first, so int8wo is then *slower*, not faster.

Every Linear of the blocks is quantized (q/k/v or qkv, o, gate/up, down; phi-2's
dense, fc1, fc2); the LM head is not. Its error would go straight into the logits the
greedy pick reads, a tied head shares its matrix with the input embedding (which
must stay full width for the lookup), and it is a small part of the bytes a step
reads (llama-7b: 0.26 of 6.7 GB once the blocks are int8).

Quantizing runs on the device after the weights are in, one Linear at a time (row
chunks in fp32), and drops each float weight as soon as its int8 copy exists.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

INT8_MAX = 127
# Rows quantized per fp32 chunk: bounds the temporary to ROW_CHUNK x in_features x 4 bytes.
ROW_CHUNK = 2048


class Int8WeightOnlyLinear(nn.Module):
    """``y = F.linear(x, weight.to(x.dtype)) * scales + bias``; weight int8 [out, in].

    ``weight`` and ``scales`` are buffers (an int8 tensor cannot be a trainable
    Parameter), so torch.export lifts them as constants: AOTInductor's runners are
    handed these very tensors at load, as every other parameter and buffer.
    """

    def __init__(self, weight: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None):
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.register_buffer("weight", weight)
        self.register_buffer("scales", scales)
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(x, self.weight.to(x.dtype)) * self.scales
        return y if self.bias is None else y + self.bias

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 weights"


@torch.no_grad()
def quantize_int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(int8 [out, in], scales [out] in ``weight``'s dtype), symmetric per output row.

    Rows are rounded against the scale as stored (in the weight's dtype), so the
    dequantized row ``q * s`` is within ``s / 2`` of the original everywhere.
    """
    out = torch.empty(weight.shape, dtype=torch.int8, device=weight.device)
    scales = (weight.abs().amax(dim=1).float() / INT8_MAX).to(weight.dtype)
    # An all-zero row (or a scale below the dtype's range) still divides by something.
    divisor = scales.float().clamp(min=torch.finfo(torch.float32).tiny)
    for start in range(0, weight.shape[0], ROW_CHUNK):
        rows = slice(start, start + ROW_CHUNK)
        q = (weight[rows].float() / divisor[rows, None]).round_()
        out[rows] = q.clamp_(-INT8_MAX, INT8_MAX).to(torch.int8)
    return out, scales


def block_linears(model: nn.Module) -> list[tuple[nn.Module, str]]:
    """(parent, attribute) of every nn.Linear inside ``model.model`` (the LM head is not)."""
    return [
        (parent, name)
        for parent in model.model.modules()
        for name, child in parent.named_children()
        if isinstance(child, nn.Linear)
    ]


@torch.no_grad()
def quantize(model: nn.Module, mode: str) -> int:
    """Replace every Linear of the blocks by its int8 form, in place; how many."""
    if mode != "int8wo":  # model_options.check_quant refuses any other name first
        raise ValueError(f"unknown quantization {mode!r}")
    targets = block_linears(model)
    for parent, name in targets:
        linear = getattr(parent, name)
        weight, scales = quantize_int8(linear.weight)
        bias = linear.bias
        del linear  # the float weight goes with the module, below
        setattr(parent, name, Int8WeightOnlyLinear(weight, scales, bias))
    return len(targets)
