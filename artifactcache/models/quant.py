"""Weight-only quantization: ``--quant int8wo`` and ``--quant int4wo``.

**int8wo**: int8 weights with one scale per output channel.

gpt-fast's scheme: each row ``w`` of a Linear's weight is stored as
``round(w / s)`` in int8 with ``s = max|w| / 127``, and the layer computes
``F.linear(x, w_int8.to(x.dtype)) * s (+ bias)``. Activations stay in the model's
dtype. A decode step reads the weights once, so reading one byte per weight instead
of two speeds it up where the cast happens inside the matmul: on CUDA a one-row decode
runs models/gemv.py's GEMV (a Triton op, in every backend that runs the model
code), which reads the int8 weights at up to 3.3 TB/s on an H200. Inductor's own fused
cast was no faster than bf16 in a model (0.97x, docs/perf-notes.md attempts 9 and 30).
Elsewhere (CPU, decode batches of several rows, the prefill's real GEMMs) the cast
makes a full-width copy of each weight first, so int8wo is then *slower* than bf16.

**int4wo**: 4-bit weights, asymmetric per group of ``group`` input channels (128 where
the layer's width allows, else 64 or 32; a scale and a zero per group, gpt-fast's and
torchao's tinygemm scheme: ``w = (q - 8) * scale + zero``, q in 0..15). A decode row
(one token per sequence, at most ``TINYGEMM_MAX_ROWS`` sequences) runs PyTorch's own
int4 kernel, ``aten._weight_int4pack_mm`` (tinygemm, the kernel torchao's tile-packed
int4 layout calls too), which reads half a byte per weight: on an H200 it ran llama-7b's
GEMVs 1.8-2x faster than bf16 (benchmarks/quant_kernels.py). The same kernel is 3x
*slower* than a bf16 GEMM at 32 rows and 24x at 512 (it is built for few rows), so a
prompt pass dequantizes the weight into the model's dtype and runs the regular GEMM.
tinygemm's layout cannot be read back by anything but tinygemm, so on CUDA the layer
also keeps the plain nibbles (two weights a byte) for that dequantization: an int4wo
model holds as many bytes as an int8wo one (half of bf16), and decode reads half of
them. On CPU the layer keeps the nibbles only and always dequantizes: int4 on CPU is
for building and checking artifacts, not for speed (and AOTInductor's CPU lowering of
the CPU kernel adds a constant of its own, which acache's shared constants cannot
hold). CUDA's tinygemm takes bf16 activations only (check_quant refuses other dtypes) and a
GPU of compute capability 8.0 or newer. int4wo is for small batches: an artifact built
for more than TINYGEMM_MAX_ROWS rows (``--max-batch``) decodes through the dequantized
GEMM, reading ~4.5 bytes a weight against bf16's 2, so it decodes slower than bf16.

Every Linear of the blocks is quantized (q/k/v or qkv, o, gate/up, down; phi-2's
q/k/v, dense, fc1, fc2, or in_proj, dense, fc2 when fused); the LM head is not. Its
error would go straight into the logits the greedy pick reads, a tied head shares its
matrix with the input embedding (which must stay full width for the lookup), and it is
a small part of the bytes a step reads (llama-7b: 0.26 of 6.7 GB once the blocks are
int8).

Quantizing runs on the device after the weights are in, one Linear at a time (row
chunks in fp32), and drops each float weight as soon as its quantized copy exists. On
the meta device (sizing.weight_bytes, the bytes a decode step reads for the roofline)
it makes empty tensors of the shapes a build stores, less int4wo's second CUDA copy
(tinygemm's and the nibbles hold the same bytes; a step reads one of them).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from ..errors import BackendError
from . import rows

INT8_MAX = 127
# Rows quantized per fp32 chunk: bounds the temporary to ROW_CHUNK x in_features x 4 bytes.
ROW_CHUNK = 2048
INT4_GROUPS = (128, 64, 32)  # the widest that divides in_features
# tinygemm's CUDA layout tiles K by 16 x inner_k_tiles and N by 8.
INNER_K_TILES = (8, 4, 2)
# Decode sequences up to which tinygemm runs (beyond, the dequantized GEMM): on an H200
# it beat bf16 1.9x at 1 row and lost 3x at 32 (benchmarks/quant_kernels.py); the
# crossover between them was not measured.
TINYGEMM_MAX_ROWS = 4


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
        one_row = x.dim() == 3 and x.shape[0] == 1 and x.shape[1] == 1
        # The op is registered by a backend before it traces the model (rows.register_ops),
        # or by row_linear on an eager call. Dynamo and torch.export refuse to register an
        # op inside what they trace, so there the flag decides: the op where it is
        # registered, else the cast below (the same product, slower) rather than a crash.
        if x.is_cuda and one_row and (rows.gemv_registered() or not torch.compiler.is_compiling()):
            return rows.row_linear(self, x)
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


def int4_layout(
    in_features: int, out_features: int, device: torch.device
) -> tuple[int, int] | None:
    """(group size, inner_k_tiles) for a layer, or None where no int4 layout fits.
    Off CUDA there is no tinygemm layout: inner_k_tiles is 0."""
    group = next((g for g in INT4_GROUPS if in_features % g == 0), None)
    if group is None or out_features % 8:
        return None
    if device.type != "cuda":
        return group, 0
    tiles = next((t for t in INNER_K_TILES if in_features % (16 * t) == 0), None)
    return None if tiles is None else (group, tiles)


@torch.no_grad()
def quantize_int4(weight: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(nibbles uint8 [out, in/2] (:func:`pack_nibbles`), [in/group, out, 2] scales and
    zeros in weight's dtype). Temporaries are bounded by ROW_CHUNK rows.

    Asymmetric per group: scale = (max - min) / 15, zero = min + 8 * scale, so in fp32
    ``(q - 8) * scale + zero`` is within scale / 2 of the weight. In bf16 the rounding of
    zero (2^-8 of its size) can push a group far from 0 past that bound: q is rounded
    against the stored zero but clamped to 0..15.
    """
    n, k = weight.shape
    nibbles = torch.empty(n, k // 2, dtype=torch.uint8, device=weight.device)
    sz = torch.empty(n, k // group, 2, dtype=weight.dtype, device=weight.device)
    for start in range(0, n, ROW_CHUNK):
        rows = slice(start, start + ROW_CHUNK)
        wg = weight[rows].float().reshape(-1, k // group, group)
        lo, hi = wg.amin(-1, keepdim=True), wg.amax(-1, keepdim=True)
        scale = ((hi - lo) / 15).to(weight.dtype)
        zero = (lo + 8 * scale.float()).to(weight.dtype)
        # Round against scale and zero as stored, so dequantization sees the same ones.
        s32 = scale.float().clamp(min=torch.finfo(torch.float32).tiny)
        qg = ((wg - zero.float()) / s32 + 8).round_().clamp_(0, 15)
        nibbles[rows] = pack_nibbles(qg.reshape(-1, k).to(torch.uint8))
        sz[rows] = torch.cat([scale, zero], dim=-1)
    return nibbles, sz.transpose(0, 1).contiguous()


def pack_nibbles(q: torch.Tensor) -> torch.Tensor:
    """uint8 [out, in/2] from integers [out, in] in 0..15: input channel 2j high, 2j+1 low."""
    return (q[:, ::2] << 4 | q[:, 1::2]).to(torch.uint8)


def unpack_nibbles(packed: torch.Tensor) -> torch.Tensor:
    """The inverse of :func:`pack_nibbles`, as uint8 [out, in]."""
    return torch.stack([packed >> 4, packed & 15], dim=-1).reshape(packed.shape[0], -1)


def dequantize_int4(
    nibbles: torch.Tensor, scales_zeros: torch.Tensor, dtype: torch.dtype
) -> torch.Tensor:
    """The [out, in] weight ``(q - 8) * scale + zero`` in ``dtype`` from int4wo's nibbles
    [out, in/2] and scales and zeros [in/group, out, 2]."""
    out = nibbles.shape[0]
    q = unpack_nibbles(nibbles).reshape(out, scales_zeros.shape[0], -1)
    sz = scales_zeros.transpose(0, 1)  # [out, groups, 2]
    return ((q.to(dtype) - 8) * sz[..., :1] + sz[..., 1:]).reshape(out, -1)


class Int4WeightOnlyLinear(nn.Module):
    """4-bit group-wise weights; tinygemm for decode rows, a dequantized GEMM otherwise.

    Buffers (exported as constants like every other): ``nibbles`` uint8 [out, in/2], the
    plain layout a prompt pass dequantizes; ``scales_zeros`` [in/group, out, 2]; on CUDA
    also ``packed``, tinygemm's layout of the same weights (module docstring).
    """

    def __init__(
        self,
        packed: torch.Tensor | None,
        scales_zeros: torch.Tensor,
        nibbles: torch.Tensor,
        bias: torch.Tensor | None,
        in_features: int,
        group: int,
    ):
        super().__init__()
        self.in_features, self.out_features = in_features, scales_zeros.shape[1]
        self.group = group
        self.register_buffer("packed", packed)
        self.register_buffer("scales_zeros", scales_zeros)
        self.register_buffer("nibbles", nibbles)
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)

    def dequantized(self, dtype: torch.dtype) -> torch.Tensor:
        """The [out, in] weight in ``dtype``, as a prompt pass computes with it."""
        return dequantize_int4(self.nibbles, self.scales_zeros, dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        decode_rows = x.dim() == 3 and x.shape[1] == 1 and x.shape[0] <= TINYGEMM_MAX_ROWS
        if decode_rows and self.packed is not None:
            rows = x.reshape(-1, self.in_features).contiguous()
            y = torch.ops.aten._weight_int4pack_mm(rows, self.packed, self.group, self.scales_zeros)
            y = y.reshape(*x.shape[:-1], -1)
        else:
            y = F.linear(x, self.dequantized(x.dtype))
        return y if self.bias is None else y + self.bias

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"int4 weights, group={self.group}"
        )


def int4_linear(linear: nn.Linear) -> Int4WeightOnlyLinear | None:
    """``linear`` as an Int4WeightOnlyLinear on its device, or None where no layout fits."""
    weight = linear.weight
    n, k = weight.shape
    layout = int4_layout(k, n, weight.device)
    if layout is None:
        return None
    group, tiles = layout
    if weight.is_meta:  # what a CUDA decode step reads: sizing's roofline bytes
        nibbles = torch.empty(n, k // 2, dtype=torch.uint8, device="meta")
        sz = torch.empty(k // group, n, 2, dtype=weight.dtype, device="meta")
        packed = None
    else:
        nibbles, sz = quantize_int4(weight, group)
        packed = None
        if tiles:
            packed = torch.ops.aten._convert_weight_to_int4pack(nibbles, tiles)
    return Int4WeightOnlyLinear(packed, sz, nibbles, linear.bias, k, group)


def check_int4_device(device: torch.device) -> None:
    """tinygemm's CUDA kernel needs compute capability 8.0: an older GPU is one line."""
    if device.type == "cuda" and torch.cuda.get_device_capability(device) < (8, 0):
        raise BackendError(
            f"--quant int4wo runs PyTorch's tinygemm kernel, which needs an NVIDIA GPU of "
            f"compute capability 8.0 or newer ({torch.cuda.get_device_name(device)} is "
            "older); use --quant int8wo"
        )


def int8_linear(linear: nn.Linear) -> Int8WeightOnlyLinear:
    weight, scales = quantize_int8(linear.weight)
    return Int8WeightOnlyLinear(weight, scales, linear.bias)


# --quant's modes (model_options.QUANT_MODES, torch-free, names the same): how each
# turns one Linear into its quantized form, or None where the mode leaves it as it is.
QUANTIZERS = {"int8wo": int8_linear, "int4wo": int4_linear}


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
    """Replace every Linear of the blocks by its quantized form, in place; how many.

    int4wo leaves a layer no int4 layout fits (its in_features not a multiple of 32,
    or out_features of 8) in the model's dtype.
    """
    make = QUANTIZERS.get(mode)
    if make is None:  # model_options.check_quant refuses any other name first
        raise ValueError(f"unknown quantization {mode!r}")
    if mode == "int4wo":
        check_int4_device(model.lm_head.weight.device)
    done = 0
    for parent, name in block_linears(model):
        new = make(getattr(parent, name))
        if new is not None:
            setattr(parent, name, new)  # the float weight goes with the old module
            done += 1
    return done
