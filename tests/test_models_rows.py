"""models/rows.py: which layers the row GEMV reads, and the plain modules where it cannot
run (the kernel itself: tests/test_models_gemv.py)."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from artifactcache.models import rows
from artifactcache.models.common import RMSNorm
from artifactcache.models.quant import int4_linear, int8_linear


def test_the_gemv_reads_float_int8_and_int4_layers_only():
    torch.manual_seed(0)
    plain = nn.Linear(64, 16)
    assert rows.row_weights(plain) == (plain.weight, None)
    int8 = int8_linear(nn.Linear(64, 16))
    weight, scales = rows.row_weights(int8)
    assert weight is int8.weight and scales is int8.scales
    int4 = int4_linear(nn.Linear(64, 16, dtype=torch.bfloat16))
    nibbles, scales_zeros = rows.row_weights(int4)  # the plain nibbles, not tinygemm's
    assert nibbles is int4.nibbles and scales_zeros is int4.scales_zeros

    class Lora(nn.Linear):  # a subclass may compute more than x @ W.T
        pass

    assert rows.row_weights(Lora(64, 16)) is None
    assert rows.row_weights(nn.Identity()) is None


@pytest.mark.parametrize("prologue", ["norm", "silu_mul", "none"])
def test_without_the_op_a_row_runs_the_plain_modules(monkeypatch, prologue: str):
    """Unregistered (a CPU model, or a trace that could not register it): the same
    product through the modules, skip included."""
    monkeypatch.setattr(rows, "_gemv_registered", False)
    torch.manual_seed(0)
    linear, norm = nn.Linear(32, 8), RMSNorm(32, 1e-5)
    x = torch.randn(1, 1, 64 if prologue == "silu_mul" else 32)
    residual = torch.randn(1, 1, 8)
    if prologue == "norm":
        got, want = rows.row_linear(linear, x, norm=norm), linear(norm(x))
    elif prologue == "silu_mul":
        gate, up = x.chunk(2, dim=-1)
        got = rows.row_linear(linear, x, silu_mul=True, residual=residual)
        want = residual + linear(F.silu(gate) * up)
    else:
        got, want = rows.row_linear(linear, x, residual=residual), residual + linear(x)
    torch.testing.assert_close(got, want)


def test_only_int8_layers_or_a_row_gemv_model_register_the_op(monkeypatch):
    """An int4wo layer runs tinygemm in its own forward: without ``row_gemv`` a CUDA
    int4wo model must not import Triton and Dynamo for the op (a warm aoti start)."""
    calls = []
    monkeypatch.setattr(rows, "_on_cuda", lambda module: True)
    monkeypatch.setattr(rows, "register_gemv", lambda: calls.append(1))
    int4 = nn.Sequential(int4_linear(nn.Linear(64, 16)))
    rows.register_ops(int4)
    assert calls == []
    int4.row_gemv = True  # a row_gemv model: its steps call the op
    rows.register_ops(int4)
    assert calls == [1]
    rows.register_ops(nn.Sequential(int8_linear(nn.Linear(64, 16))))
    assert calls == [1, 1]
