"""The cases of tests/test_models_gemv.py, run in a process of their own.

TRITON_INTERPRET must be set before Triton is first imported, which pytest's process
cannot promise; so the test runs this file in a fresh interpreter. Each passing case
prints a line starting with ``ok:``.
"""

from __future__ import annotations

import contextlib
import os

os.environ["TRITON_INTERPRET"] = "1"  # before the first import of Triton

import torch  # noqa: E402
from _gemv_reference import reference  # noqa: E402
from torch.nn import functional as F  # noqa: E402

from artifactcache.models import gemv, gemv_tiles  # noqa: E402
from artifactcache.models.quant import (  # noqa: E402
    INT4_GROUPS,
    dequantize_int4,
    quantize_int4,
    quantize_int8,
    unpack_nibbles,
)

# name: (N, K, quant, bias, norm, silu_mul, residual, tile (block_n, block_k) or None)
CASES = {
    "plain, the op's tile": (96, 256, None, False, False, False, False, None),
    "a bias": (40, 128, None, True, False, False, False, None),
    "RMSNorm prologue": (64, 192, None, False, True, False, False, None),
    "SiLU-and-mul prologue and a skip": (48, 128, None, False, False, True, True, None),
    "RMSNorm, a bias and a skip": (33, 96, None, True, True, False, True, None),
    "K not a multiple of the tile, N of the block":
        (37, 200, None, False, True, False, False, (16, 128)),
    "one output channel a program": (5, 64, None, True, False, False, True, (1, 32)),
    "int8": (96, 256, "int8", False, False, False, False, None),
    "int8, RMSNorm and a bias": (40, 200, "int8", True, True, False, False, (8, 64)),
    "int8, SiLU-and-mul and a skip": (24, 64, "int8", False, False, True, True, None),
    "int8, the magic cast's extremes -127 and 127":
        (8, 64, "int8", False, False, False, False, None),
    "int4, groups of 128, the op's tile": (96, 256, "int4", False, False, False, False, None),
    "int4, groups of 32, RMSNorm and a bias": (40, 96, "int4", True, True, False, False, (8, 32)),
    "int4, groups of 64, SiLU-and-mul and a skip":
        (24, 64, "int4", False, False, True, True, None),
    "int4, half a group a tile, N not a multiple of the block":
        (37, 256, "int4", False, True, False, False, (16, 64)),
    "int4, two groups a tile, K not a multiple of it, a bias and a skip":
        (37, 320, "int4", True, False, False, True, (8, 128)),
    "int4, two groups a tile, RMSNorm, K not a multiple of it":
        (16, 192, "int4", False, True, False, False, (4, 128)),
}  # fmt: skip


def int4_weight(w):
    """(nibbles, scales and zeros) of w as int4wo stores it, and its dequantized value in
    float64: what the kernel must multiply by."""
    group = next(g for g in INT4_GROUPS if w.shape[1] % g == 0)  # as int4_layout picks
    nibbles, sz = quantize_int4(w, group)
    q = unpack_nibbles(nibbles)
    assert q.min() == 0 and q.max() == 15  # the magic cast's extremes
    return nibbles, sz, dequantize_int4(nibbles, sz, torch.float64)


def case_matches(name, n, k, quant, with_bias, norm, silu_mul, with_residual, tile, dtype):
    torch.manual_seed(0)
    w = torch.randn(n, k, dtype=dtype) / k**0.5
    scales = None
    dense = None  # the weight the product is checked against, where not w itself
    if quant == "int8":
        if "extremes" in name:
            w[:, ::2] = w.abs().amax(1, keepdim=True)
            w[:, 1::2] = -w[:, ::2]
        w, scales = quantize_int8(w)
        if "extremes" in name:
            assert w.max() == 127 and w.min() == -127
    elif quant == "int4":
        w, scales, dense = int4_weight(w)
    x = torch.randn(1, 2 * k if silu_mul else k, dtype=dtype)
    bias = torch.randn(n, dtype=dtype) if with_bias else None
    g = (1 + torch.rand(k)).to(dtype) if norm else None
    residual = torch.randn(n, dtype=dtype) if with_residual else None
    matches_the_product((x, w, scales, bias, g, 1e-5, silu_mul, residual), dense, tile, dtype)


def matches_the_product(args, dense, tile, dtype, **prologue):
    """The op (or launch_gemv at ``tile``) on ``args`` against the float64 product, of
    ``dense`` where the weight is int4's nibbles; ``prologue``: phi-2's keywords."""
    if tile is None:
        got = gemv.row_gemv(*args, **prologue)
    else:
        got = gemv.launch_gemv(*args, cut=gemv.GemvLaunch(*tile), **prologue)
    if dense is not None:
        x, _, _, bias, g, eps, silu_mul, residual = args
        want = reference(x, dense, None, bias, g, eps, silu_mul, residual, **prologue)
    else:
        want = reference(*args, **prologue)
    # bf16: the output's rounding (and a skip's second rounding), a few ulps of 2**-8
    tol, atol = (1e-5, 1e-4) if dtype == torch.float32 else (2e-2, 2e-2)
    torch.testing.assert_close(got.double(), want, rtol=tol, atol=atol)
    assert got.dtype == dtype and got.shape == (1, args[1].shape[0])


# name: (N, K, quant, LayerNorm (with its bias?) or None, gelu_from, residual, tile)
PHI_CASES = {
    "LayerNorm with its bias, a bias": (40, 192, None, "bias", -1, False, None),
    "LayerNorm without a bias, K not a multiple of the tile":
        (24, 200, None, "", -1, False, (8, 64)),
    "LayerNorm, int8": (32, 128, "int8", "bias", -1, False, None),
    "LayerNorm, int4, two groups a tile, K a multiple of it":
        (16, 256, "int4", "bias", -1, False, (4, 256)),
    "GELU on every channel and a skip": (32, 160, None, None, 0, True, None),
    "GELU from channel 96 (a fused [dense | fc2]), a skip":
        (24, 224, None, None, 96, True, (4, 64)),
    "GELU from channel 64, int4": (16, 256, "int4", None, 64, False, None),
}  # fmt: skip


def random_weight(n, k, quant, dtype):
    """(weight as the kernel reads it, its scales or None, its float64 value where the
    weight is int4's nibbles, else None) for a random [n, k] matrix."""
    w = torch.randn(n, k, dtype=dtype) / k**0.5
    if quant == "int8":
        return (*quantize_int8(w), None)
    if quant == "int4":
        return int4_weight(w)
    return w, None, None


def phi_case_matches(name, n, k, quant, layer_norm, gelu_from, with_residual, tile, dtype):
    """phi-2's prologues (LayerNorm, GELU) against the float64 product."""
    torch.manual_seed(2)
    w, scales, dense = random_weight(n, k, quant, dtype)
    # The LayerNorm's x is far from 0 (it must centre it); GELU's is centred at 0, where
    # GELU is far from the identity.
    x = ((3.0 if layer_norm is not None else 0.0) + torch.randn(1, k) * 2).to(dtype)
    bias = torch.randn(n, dtype=dtype)
    g = (1 + torch.rand(k)).to(dtype) if layer_norm is not None else None
    nb = torch.randn(k, dtype=dtype) if layer_norm == "bias" else None
    residual = torch.randn(n, dtype=dtype) if with_residual else None
    kw = dict(norm_bias=nb, layer_norm=layer_norm is not None, gelu_from=gelu_from)
    matches_the_product((x, w, scales, bias, g, 1e-5, False, residual), dense, tile, dtype, **kw)


def a_layernorm_with_its_first_tile_early_or_late_matches(dtype):
    """The LayerNorm's first weight tile loaded before its statistics
    (gemv_tiles.LN_EARLY_TILE, float and int8 weights) and after them (the default),
    against the float64 product: one tile (K within it) and several, K a multiple of the
    tile and not, a tile wider than K, float and int8 weights. Float weights end where
    NaNs begin, so a tile read past K turns the last row's output to NaN."""
    torch.manual_seed(5)
    for k, quant, tile in [(200, None, None), (200, None, (8, 64)), (256, None, (8, 64)),
                           (56, None, (4, 64)), (200, "int8", None),
                           (200, "int8", (8, 64))]:  # fmt: skip
        w, scales, dense = random_weight(24, k, quant, dtype)
        if quant is None:
            padded = torch.full((w.numel() + 256,), float("nan"), dtype=dtype)
            padded[: w.numel()] = w.reshape(-1)
            w = padded[: w.numel()].view(24, k)
        x = (3.0 + torch.randn(1, k) * 2).to(dtype)
        bias, g, nb = (torch.randn(24, dtype=dtype), (1 + torch.rand(k)).to(dtype),
                       torch.randn(k, dtype=dtype))  # fmt: skip
        args = (x, w, scales, bias, g, 1e-5, False, None)
        kw = dict(norm_bias=nb, layer_norm=True)
        default = gemv_tiles.LN_EARLY_TILE
        for early in (True, False):
            gemv_tiles.LN_EARLY_TILE = early
            try:
                matches_the_product(args, dense, tile, dtype, **kw)
            finally:
                gemv_tiles.LN_EARLY_TILE = default


def gelu_on_the_outputs_matches(dtype):
    """``gelu_out_from``: GELU on the outputs from that channel on (phi-2's fc1 part of
    the in-projection), after the bias and before a skip, against GELU on the float64
    product's channels rounded to the dtype (as eager rounds fc1's output); float, int8
    and int4 weights, the split inside a block of outputs and at its edge."""
    torch.manual_seed(6)
    for quant, n, k, start, tile, skip in [
        (None, 40, 192, 21, (8, 64), False),  # inside the third block of 8 outputs
        (None, 48, 128, 16, None, True),
        ("int8", 24, 96, 8, None, False),
        ("int4", 16, 256, 5, (4, 128), True),
    ]:
        w, scales, dense = random_weight(n, k, quant, dtype)
        x, bias = torch.randn(1, k, dtype=dtype), torch.randn(n, dtype=dtype)
        g, nb = (1 + torch.rand(k)).to(dtype), torch.randn(k, dtype=dtype)
        residual = torch.randn(n, dtype=dtype) if skip else None
        args = (x, w, scales, bias, g, 1e-5, False, residual)
        kw = dict(norm_bias=nb, layer_norm=True)
        cut = None if tile is None else gemv.GemvLaunch(*tile)
        got = gemv.launch_gemv(*args, cut=cut, gelu_out_from=start, **kw)
        want = reference(x, w if dense is None else dense, None if dense is not None
                         else scales, bias, g, 1e-5, False, None, **kw)  # fmt: skip
        fc1 = want[:, start:].to(dtype).double()
        want[:, start:] = F.gelu(fc1, approximate="tanh")
        if skip:
            want = want.to(dtype).double() + residual.double()
        tol, atol = (1e-5, 1e-4) if dtype == torch.float32 else (2e-2, 2e-2)
        torch.testing.assert_close(got.double(), want, rtol=tol, atol=atol)
    try:
        gemv.row_gemv(x, w, scales, bias, None, 0.0, False, None, gelu_out_from=n)
    except ValueError as e:
        assert "outputs starts within N" in str(e), e
    else:
        raise AssertionError("a GELU past the last output was taken")


def x_in_two_parts_matches(dtype):
    """x read from two tensors (``x_tail``: phi-2's [attention | fc1], the tail a view
    into a wider row as its split gives it) with GELU from the tail on, against the
    product of the two concatenated: float, int8 and int4 weights, tails that start
    inside a tile and at its edge, and one shorter than a tile."""
    torch.manual_seed(4)
    for quant, n, k, head, tile in [
        (None, 24, 224, 96, (4, 64)),  # the tail starts inside the second tile
        (None, 40, 192, 128, (8, 64)),  # at a tile's edge
        (None, 16, 100, 80, (4, 64)),  # a tail shorter than a tile
        ("int8", 16, 200, 72, None),
        ("int4", 16, 256, 64, (4, 128)),
    ]:
        w, scales, dense = random_weight(n, k, quant, dtype)
        row = torch.randn(1, head + 3 * (k - head), dtype=dtype)
        x, tail = row[:, :head], row[:, head + 2 * (k - head) :]  # a view with an offset
        bias, residual = torch.randn(n, dtype=dtype), torch.randn(n, dtype=dtype)
        args = (x, w, scales, bias, None, 0.0, False, residual)
        if tile is None:
            got = gemv.row_gemv(*args, gelu_from=head, x_tail=tail)
        else:
            got = gemv.launch_gemv(*args, cut=gemv.GemvLaunch(*tile), gelu_from=head,
                                   x_tail=tail)  # fmt: skip
        whole = torch.cat([x, tail], dim=-1)
        want = reference(whole, w if dense is None else dense, None if dense is not None
                         else scales, bias, None, 0.0, False, residual, gelu_from=head)  # fmt: skip
        tol, atol = (1e-5, 1e-4) if dtype == torch.float32 else (2e-2, 2e-2)
        torch.testing.assert_close(got.double(), want, rtol=tol, atol=atol)


def a_layernorm_wider_than_one_load_takes_two_passes(dtype):
    """x wider than LN_ONE_LOAD_MAX: the statistics in two passes of the tile's width."""
    widest = gemv_tiles.LN_ONE_LOAD_MAX
    gemv_tiles.LN_ONE_LOAD_MAX = 128
    try:
        assert gemv.ln_block(200, True) == 0  # the launch takes the two passes
        phi_case_matches("two passes", 24, 200, None, "bias", -1, True, (8, 64), dtype)
    finally:
        gemv_tiles.LN_ONE_LOAD_MAX = widest


def strided_inputs_match(dtype):
    """x's columns apart in memory (copied), scales, bias and norm weight every other
    element (made contiguous): the op reads them as the plain product does."""
    torch.manual_seed(1)
    n, k = 24, 96
    weight, scales = quantize_int8(torch.randn(n, k, dtype=dtype))
    x = torch.randn(1, 2 * k, dtype=dtype)[:, ::2]
    bias = torch.randn(2 * n, dtype=dtype)[::2]
    g = torch.rand(2 * k, dtype=dtype)[::2] + 1
    strided_scales = torch.stack([scales, scales], 1).reshape(-1)[::2]
    got = gemv.row_gemv(x, weight, strided_scales, bias, g, 1e-6, False, None)
    want = reference(x, weight, scales, bias, g, 1e-6, False, None)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got.double(), want, rtol=tol, atol=tol * 10)


@contextlib.contextmanager
def counted_launches():
    """The kernel's launches while the block runs: a list whose one item counts them."""
    launches = [0]
    launch = gemv._launch

    def counted(*args):
        launches[0] += 1
        return launch(*args)

    gemv._launch = counted
    try:
        yield launches
    finally:
        gemv._launch = launch


def a_layernorm_without_its_weight_runs_the_plain_modules():
    """An nn.LayerNorm(elementwise_affine=False) has no weight for the kernel to read:
    row_linear runs the plain modules (no launch), with their result."""
    from artifactcache.models import rows

    rows.register_gemv()
    torch.manual_seed(3)
    lin, norm = torch.nn.Linear(64, 16), torch.nn.LayerNorm(64, elementwise_affine=False)
    x = torch.randn(1, 1, 64)
    with counted_launches() as launches:
        got = rows.row_linear(lin, x, norm=norm)
    assert launches[0] == 0
    torch.testing.assert_close(got, lin(norm(x)))


def several_rows_are_refused():
    w = torch.randn(8, 64)
    try:
        gemv.row_gemv(torch.randn(2, 64), w, None, None, None, 0.0, False, None)
    except ValueError as e:
        assert "one row" in str(e)
    else:
        raise AssertionError("a prompt's rows went through the GEMV")


def a_tiny_model_decodes_as_without_the_row_gemv(name: str, quant: str | None = None) -> None:
    """A fused tiny model (fp32) built with ``row_gemv``: its first pass's last row and
    its decode steps run through the op (counted) and give the plain model's logits.
    (A 256-token vocabulary: the interpreter runs the LM head's programs one by one.)"""
    from dataclasses import replace

    from artifactcache.models import build_model
    from artifactcache.recipes import load_recipe

    rec = load_recipe(name)
    rec = replace(rec, model=replace(rec.model, vocab_size=256))
    fuse = rec.family != "phi-3"  # fused in the checkpoint
    plain = build_model(rec, fuse_projections=fuse, quant=quant)
    rows = build_model(rec, fuse_projections=fuse, quant=quant, row_gemv=True)
    ids = torch.tensor([[(31 * i + 7) % 256 for i in range(12)]])
    steps = [5, 17, 99]  # the decode steps' tokens, the same for both models
    got, want = [], []
    with counted_launches() as launches, torch.no_grad():
        for model, out in ((rows, got), (plain, want)):
            model.first_pass_last_logits = True
            out.append(model(ids, torch.arange(ids.shape[1])))
            for i, tok in enumerate(steps):
                pos = torch.tensor([ids.shape[1] + i])
                out.append(model(torch.tensor([[tok]]), pos, torch.zeros(1, dtype=torch.long)))
    # the first pass's LM head, then the block's GEMVs (llama's 4; phi-2's 2 fused, 3
    # with its outputs apart) and the LM head a decode step
    per_block = 4 if rec.family != "phi-2" else 3 if quant else 2
    assert launches[0] == 1 + len(steps) * (per_block * rec.model.n_layers + 1), launches[0]
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4)


def main() -> None:
    for dtype in (torch.float32, torch.bfloat16):
        for name, case in CASES.items():
            case_matches(name, *case, dtype)
            print(f"ok: {name} ({dtype})")
        for name, case in PHI_CASES.items():
            phi_case_matches(name, *case, dtype)
            print(f"ok: {name} ({dtype})")
        a_layernorm_wider_than_one_load_takes_two_passes(dtype)
        print(f"ok: a LayerNorm wider than one load, two passes ({dtype})")
        a_layernorm_with_its_first_tile_early_or_late_matches(dtype)
        print(f"ok: a LayerNorm with its first tile early or late ({dtype})")
        gelu_on_the_outputs_matches(dtype)
        print(f"ok: GELU on the outputs ({dtype})")
        x_in_two_parts_matches(dtype)
        print(f"ok: x in two parts ({dtype})")
        strided_inputs_match(dtype)
        print(f"ok: strided inputs ({dtype})")
    several_rows_are_refused()
    print("ok: several rows")
    a_layernorm_without_its_weight_runs_the_plain_modules()
    print("ok: a LayerNorm without its weight runs the plain modules")
    for name in ("tiny-llama", "tiny-qwen2", "tiny-qwen3", "tiny-phi-3"):
        a_tiny_model_decodes_as_without_the_row_gemv(name)
        print(f"ok: {name} decodes as without the row GEMV")
    a_tiny_model_decodes_as_without_the_row_gemv("tiny-qwen2", quant="int8wo")
    print("ok: tiny-qwen2 int8wo decodes as without the row GEMV")
    a_tiny_model_decodes_as_without_the_row_gemv("tiny-llama", quant="int4wo")
    print("ok: tiny-llama int4wo decodes as without the row GEMV")
    a_tiny_model_decodes_as_without_the_row_gemv("tiny-phi-2")
    print("ok: tiny-phi-2 decodes as without the row GEMV")
    a_tiny_model_decodes_as_without_the_row_gemv("tiny-phi-2", quant="int8wo")
    print("ok: tiny-phi-2 int8wo decodes as without the row GEMV")
    a_tiny_model_decodes_as_without_the_row_gemv("tiny-phi-2", quant="int4wo")
    print("ok: tiny-phi-2 int4wo decodes as without the row GEMV")


if __name__ == "__main__":
    main()
