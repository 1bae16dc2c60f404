"""The cases of tests/test_models_gemv.py, run in a process of their own.

TRITON_INTERPRET must be set before Triton is first imported, which pytest's process
cannot promise; so the test runs this file in a fresh interpreter. Each passing case
prints a line starting with ``ok:``.
"""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"  # before the first import of Triton

import torch  # noqa: E402

from artifactcache.models import gemv  # noqa: E402
from artifactcache.models.quant import quantize_int4, quantize_int8, unpack_nibbles  # noqa: E402


def int8_reference(x, weight, scales, bias):
    y = (x.double() @ weight.double().T) * scales.double()
    return y if bias is None else y + bias.double()


def int4_reference(x, nibbles, sz, group, bias):
    n = nibbles.shape[0]
    q = unpack_nibbles(nibbles).double().reshape(n, -1, group)
    s = sz.transpose(0, 1).double()  # [n, groups, 2]
    w = ((q - 8) * s[..., :1] + s[..., 1:]).reshape(n, -1)
    y = x.double() @ w.T
    return y if bias is None else y + bias.double()


# (rows, N, K, bias, tile (block_n, block_k) or None for the op's own)
INT8_CASES = {
    "one row, the op's tile": (1, 96, 256, False, None),
    "three rows, a bias": (3, 40, 128, True, None),
    "K not a multiple of the tile, N of the block": (2, 37, 200, False, (16, 128)),
    "four rows, one output channel a program": (4, 5, 64, True, (1, 32)),
    "the magic cast's extremes -127 and 127": (1, 8, 64, False, None),
}
INT4_CASES = {
    "one row, group 128": (1, 64, 256, 128, False, None),
    "four rows, group 32, a bias": (4, 24, 96, 32, True, None),
    "N not a multiple of the block": (2, 19, 128, 64, False, (8, 64)),
}


def int8_matches(name, rows, n, k, with_bias, tile, dtype):
    torch.manual_seed(0)
    w = torch.randn(n, k)
    if "extremes" in name:
        w[:, ::2] = w.abs().amax(1, keepdim=True)
        w[:, 1::2] = -w[:, ::2]
    weight, scales = quantize_int8(w.to(dtype))
    if "extremes" in name:
        assert weight.max() == 127 and weight.min() == -127
    x = torch.randn(rows, k, dtype=dtype)
    bias = torch.randn(n, dtype=dtype) if with_bias else None
    if tile is None:
        got = gemv.int8_gemv(x, weight, scales, bias)
    else:
        got = gemv.launch_int8(x, weight, scales, bias, gemv.GemvLaunch(*tile))
    plain = gemv.launch_int8(x, weight, scales, bias, gemv.int8_launch(rows, n, k), False)
    want = int8_reference(x, weight, scales, bias)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got.double(), want, rtol=tol, atol=tol * 10)
    torch.testing.assert_close(plain, got, rtol=tol, atol=tol)
    assert got.dtype == dtype and got.shape == (rows, n)


def int4_matches(rows, n, k, group, with_bias, tile, dtype):
    torch.manual_seed(1)
    nibbles, sz = quantize_int4(torch.randn(n, k).to(dtype), group)
    x = torch.randn(rows, k, dtype=dtype)
    bias = torch.randn(n, dtype=dtype) if with_bias else None
    if tile is None:
        got = gemv.int4_gemv(x, nibbles, sz, group, bias)
    else:
        got = gemv.launch_int4(x, nibbles, sz, group, bias, gemv.GemvLaunch(*tile))
    want = int4_reference(x, nibbles, sz, group, bias)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got.double(), want, rtol=tol, atol=tol * 10)
    assert got.dtype == dtype and got.shape == (rows, n)


def too_many_rows_is_refused():
    x = torch.randn(gemv.MAX_ROWS + 1, 64)
    weight, scales = quantize_int8(torch.randn(8, 64))
    try:
        gemv.int8_gemv(x, weight, scales, None)
    except ValueError as e:
        assert "rows" in str(e)
    else:
        raise AssertionError("a prompt's rows went through the GEMV")


def main() -> None:
    for dtype in (torch.float32, torch.bfloat16):
        for name, case in INT8_CASES.items():
            int8_matches(name, *case, dtype)
            print(f"ok: int8 {name} ({dtype})")
        for name, case in INT4_CASES.items():
            int4_matches(*case, dtype)
            print(f"ok: int4 {name} ({dtype})")
    too_many_rows_is_refused()
    print("ok: too many rows")


if __name__ == "__main__":
    main()
