"""models/gemv_inputs.py: what the row GEMV refuses on the host, before any launch."""

from __future__ import annotations

import pytest

pytest.importorskip("triton", reason="models/gemv.py's op is Triton's")


def test_the_op_refuses_what_the_kernel_cannot_read_before_any_launch():
    """Checked on the host first, so a CPU tensor reaches no Triton launch here."""
    import torch

    from artifactcache.models import gemv
    from artifactcache.models.quant import quantize_int4, quantize_int8

    weight, scales = quantize_int8(torch.randn(8, 64))
    nibbles, sz = quantize_int4(torch.randn(8, 64), 32)  # [8, 32] bytes, [2, 8, 2]
    nibbles96, sz96 = quantize_int4(torch.randn(8, 96), 32)  # 2 groups of 96 are 48 wide
    x = torch.randn(1, 64)
    ones = torch.ones(64)
    refused = {
        "no rows": ((torch.randn(0, 64), weight, scales), {}),
        "two rows": ((torch.randn(2, 64), weight, scales), {}),
        "one-dimensional x": ((torch.randn(64), weight, scales), {}),
        "a strided weight": ((x, torch.cat([weight, weight], 1)[:, ::2], scales), {}),
        "a transposed weight": ((x, weight.T.contiguous().T, scales), {}),
        "an integer weight": ((x, weight.int(), None), {}),
        "int8 without scales": ((x, weight, None), {}),
        "scales with a float weight": ((x, weight.float(), scales), {}),
        "another K": ((torch.randn(1, 32), weight, scales), {}),
        "x not [gate | up]": ((x, weight, scales), {"silu_mul": True}),
        "two prologues": ((torch.randn(1, 128), weight, scales),
                          {"silu_mul": True, "norm_weight": torch.ones(64)}),
        "scales of another N": ((x, weight, scales[:4]), {}),
        "bias of another N": ((x, weight, scales), {"bias": torch.zeros(9)}),
        "residual of another N": ((x, weight, scales), {"residual": torch.zeros(7)}),
        "norm weight of another K": ((x, weight, scales), {"norm_weight": torch.ones(63)}),
        "int4 without its scales and zeros": ((x, nibbles, None), {}),
        "int4 scales and zeros of another N": ((x, nibbles, sz[:, :4]), {}),
        "int4 groups not a power of two": ((torch.randn(1, 96), nibbles96, sz96[:2]), {}),
        "GELU beside a norm": ((x, weight, scales), {"gelu_from": 0, "norm_weight": ones}),
        "GELU past K": ((x, weight, scales), {"gelu_from": 64}),
        "GELU before channel 0": ((x, weight, scales), {"gelu_from": -2}),
        "a weight of no rows": ((x, weight[:0], scales[:0]), {}),
        "a weight of no columns": ((torch.randn(1, 0), weight.float()[:, :0], None), {}),
        "int4 with no groups": ((x, nibbles, sz[:0]), {}),
        "a LayerNorm without its weight": ((x, weight, scales), {"layer_norm": True}),
        "a norm bias without a LayerNorm": ((x, weight, scales),
                                            {"norm_weight": ones, "norm_bias": ones}),
        "a LayerNorm bias of another K": ((x, weight, scales), {
            "norm_weight": ones, "norm_bias": ones[:63], "layer_norm": True}),
        "x and its tail wider than K": ((x, weight, scales), {"x_tail": torch.randn(1, 8)}),
        "x and its tail narrower than K": ((x[:, :40], weight, scales),
                                           {"x_tail": torch.randn(1, 8)}),
        "a tail of two rows": ((x[:, :48], weight, scales), {"x_tail": torch.randn(2, 16)}),
        "a tail beside a norm": ((x[:, :48], weight, scales),
                                 {"x_tail": torch.randn(1, 16), "norm_weight": ones}),
        "a tail beside SiLU-and-mul": ((x, weight, scales),
                                       {"x_tail": torch.randn(1, 64), "silu_mul": True}),
    }  # fmt: skip
    messages = {
        "no rows": "one row", "two rows": "one row", "one-dimensional x": "one row",
        "a strided weight": "contiguous weight", "a transposed weight": "contiguous weight",
        "an integer weight": "float, int8 or int4", "int8 without scales": "scales",
        "scales with a float weight": "scales", "x not [gate | up]": "gate and up",
        "two prologues": "one prologue", "int4 without its scales and zeros": "scales",
        "int4 scales and zeros of another N": r"\[K/group, 8, 2\]",
        "int4 groups not a power of two": "power of two", "GELU beside a norm": "one prologue",
        "GELU past K": "GELU starts within K=64", "a LayerNorm without its weight": "its weight",
        "GELU before channel 0": "or -1: none", "a weight of no rows": "at least one row",
        "a weight of no columns": "at least one row", "int4 with no groups": "K/group",
        "a norm bias without a LayerNorm": "LayerNorm only", "a LayerNorm bias of another K":
        "norm_bias of 64", "x and its tail wider than K": "x_tail",
        "x and its tail narrower than K": "x_tail", "a tail of two rows": "x_tail",
        "a tail beside a norm": "without a norm or SiLU-and-mul",
        "a tail beside SiLU-and-mul": "without a norm or SiLU-and-mul",
    }  # fmt: skip
    for case, (args, kwargs) in refused.items():
        full = {"bias": None, "norm_weight": None, "eps": 0.0, "silu_mul": False,
                "residual": None} | kwargs  # fmt: skip
        for call in (gemv.row_gemv, gemv.launch_gemv):
            with pytest.raises(ValueError, match=messages.get(case, "row GEMV")) as e:
                call(*args, **full)
            assert "\n" not in str(e.value), case
