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
from artifactcache.models.quant import quantize_int8  # noqa: E402


def int8_reference(x, weight, scales, bias):
    y = (x.double() @ weight.double().T) * scales.double()
    return y if bias is None else y + bias.double()


# (rows, N, K, bias, tile (block_n, block_k) or None for the op's own)
INT8_CASES = {
    "one row, the op's tile": (1, 96, 256, False, None),
    "three rows, a bias": (3, 40, 128, True, None),
    "K not a multiple of the tile, N of the block": (2, 37, 200, False, (16, 128)),
    "four rows, one output channel a program": (4, 5, 64, True, (1, 32)),
    "the magic cast's extremes -127 and 127": (1, 8, 64, False, None),
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


def strided_inputs_match(dtype):
    """x's rows apart in memory, its columns too (copied), scales and bias every other
    element (made contiguous): the op reads them as the plain product does."""
    torch.manual_seed(1)
    n, k = 24, 96
    weight, scales = quantize_int8(torch.randn(n, k, dtype=dtype))
    x = torch.randn(2, 2 * k, dtype=dtype)
    bias = torch.randn(2 * n, dtype=dtype)[::2]
    strided_scales = torch.stack([scales, scales], 1).reshape(-1)[::2]
    for rows in (x[:, :k], x[:, ::2]):
        got = gemv.int8_gemv(rows, weight, strided_scales, bias)
        want = int8_reference(rows, weight, scales, bias)
        tol = 1e-5 if dtype == torch.float32 else 2e-2
        torch.testing.assert_close(got.double(), want, rtol=tol, atol=tol * 10)


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
        strided_inputs_match(dtype)
        print(f"ok: int8 strided inputs ({dtype})")
    too_many_rows_is_refused()
    print("ok: too many rows")


if __name__ == "__main__":
    main()
