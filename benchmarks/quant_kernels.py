# Each closure below is timed before its loop moves on, so late binding is harmless.
# ruff: noqa: B023
"""Matmul kernels for quantized weights on llama-7b's shapes (issues 30 and 32), one GPU.

Before wiring a quantized path into the model: how fast is each candidate kernel on the
four Linear shapes of a llama-7b block (fused qkv, o, fused gate/up, down), at the row
counts of decode (1, 8, 32) and of a prompt (512, 2000)? Per shape and rows:

- ``bf16``: ``F.linear`` on bf16 weights (the roofline reference);
- ``int8_cast``: acache's int8wo as eager runs it: ``F.linear(x, w8.to(bf16)) * s``;
- ``int8_compiled``: the same under ``torch.compile`` (coordinate-descent tuning, as
  acache's CUDA builds use for decode), rows <= 32 only;
- ``w8a8``: per-row dynamic int8 activations and ``torch._int_mm`` (int8 tensor cores),
  scaled in bf16; rows > 16 (``_int_mm``'s CUDA minimum), eager and compiled;
- ``int4_tinygemm_gG``: ``aten._weight_int4pack_mm`` (the tinygemm kernel torchao's
  tile-packed int4 layout also calls), group size G;
- ``int4_dequant``: the int4 weights dequantized to bf16, then ``F.linear`` (what a
  prompt pass would do without an int4 GEMM);
- ``torchao_int4`` / ``torchao_int8``: torchao's own configs, if torchao imports.

Timing: ``triton.testing.do_bench`` (L2 flushed before each run), median ms. Bandwidth
= bytes of weights (+ scales) + activations in and out, over the time; FLOP rate =
2 x rows x N x K over the time. Writes OUT/quant_kernels.json and prints a table.

    python benchmarks/quant_kernels.py --out OUT
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.nn import functional as F

SHAPES = {"qkv": (12288, 4096), "o": (4096, 4096), "gate_up": (22016, 4096), "down": (4096, 11008)}


def int4_pack(w: torch.Tensor, group: int, inner_k_tiles: int = 8):
    """tinygemm's layout: (packed weight, [K/G, N, 2] scales and zeros, plain parts).

    The plain parts (uint8 [N, K/2] two nibbles a byte, scale and zero [N, K/G, 1]) are
    what a dequantizing kernel of our own would read."""
    n, k = w.shape
    wg = w.float().reshape(n, k // group, group)
    lo, hi = wg.amin(-1, keepdim=True), wg.amax(-1, keepdim=True)
    scale = ((hi - lo) / 15).clamp(min=1e-6)
    zero = lo + scale * 8
    q = ((wg - lo) / scale).round().clamp(0, 15).to(torch.int32)
    q = q.reshape(n, k)
    packed_u8 = (q[:, ::2] << 4 | q[:, 1::2]).to(torch.uint8)
    packed = torch.ops.aten._convert_weight_to_int4pack(packed_u8, inner_k_tiles)
    sz = torch.cat([scale.reshape(n, -1, 1), zero.reshape(n, -1, 1)], 2)
    plain = (packed_u8, scale.to(w.dtype), zero.to(w.dtype))
    return packed, sz.transpose(0, 1).contiguous().to(w.dtype), plain


def int4_dequant(u8: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor) -> torch.Tensor:
    """The bf16 [N, K] weight from the plain int4 parts (one fused kernel once compiled)."""
    q = torch.stack([u8 >> 4, u8 & 15], dim=-1).reshape(u8.shape[0], scale.shape[1], -1)
    return ((q.to(scale.dtype) - 8) * scale + zero).reshape(u8.shape[0], -1)


def int8_rows(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    s = (w.abs().amax(1).float() / 127).clamp(min=1e-8)
    return (w.float() / s[:, None]).round().clamp(-127, 127).to(torch.int8), s.to(w.dtype)


def w8a8(x: torch.Tensor, w8t: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    xs = (x.abs().amax(-1, keepdim=True).float() / 127).clamp(min=1e-8)
    xq = (x.float() / xs).round().clamp(-127, 127).to(torch.int8)
    return (torch._int_mm(xq, w8t).float() * xs * s.float()).to(x.dtype)


def bench(fn: Callable[[], Any]) -> float:
    from triton.testing import do_bench

    return float(do_bench(fn, warmup=25, rep=100, return_mode="median"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--rows", default="1,8,32,512,2000")
    ap.add_argument("--groups", default="32,64,128")
    ap.add_argument("--no-compile", action="store_true")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rows_list = [int(r) for r in args.rows.split(",")]
    groups = [int(g) for g in args.groups.split(",")]
    torch.manual_seed(0)
    dev, dt = "cuda", torch.bfloat16
    import torch._inductor.config as icfg

    icfg.coordinate_descent_tuning = True
    torchao: Any = None
    try:
        from torchao.quantization import quantize_

        torchao = quantize_
    except Exception as exc:  # noqa: BLE001 - any import failure is a recorded fact
        print(f"torchao unavailable: {type(exc).__name__}: {exc}")
    results: list[dict[str, Any]] = []
    env = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "torchao": getattr(sys.modules.get("torchao"), "__version__", None),
    }
    print(env, flush=True)

    def record(shape: str, rows: int, kind: str, ms: float, wbytes: float, n: int, k: int):
        io = rows * (n + k) * 2
        row = {
            "shape": shape, "rows": rows, "kernel": kind, "ms": round(ms, 5),
            "tb_s": round((wbytes + io) / ms / 1e9, 3),
            "tflop_s": round(2 * rows * n * k / ms / 1e9, 1),
        }  # fmt: skip
        results.append(row)
        print(f"{shape:8s} {rows:5d} {kind:22s} {ms * 1e3:9.1f} us {row['tb_s']:6.2f} TB/s "
              f"{row['tflop_s']:7.1f} TFLOP/s", flush=True)  # fmt: skip

    def attempt(shape: str, rows: int, kind: str, fn: Callable[[], Any], wbytes, n, k):
        try:
            fn()
            torch.cuda.synchronize()
            record(shape, rows, kind, bench(fn), wbytes, n, k)
        except Exception as exc:  # noqa: BLE001 - a kernel that fails is a result too
            msg = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
            results.append({"shape": shape, "rows": rows, "kernel": kind, "error": msg})
            print(f"{shape:8s} {rows:5d} {kind:22s} failed: {msg}", flush=True)

    for shape, (n, k) in SHAPES.items():
        w = torch.randn(n, k, device=dev, dtype=dt) / k**0.5
        w8, s8 = int8_rows(w)
        w8t = w8.t()
        packs = {g: int4_pack(w, g) for g in groups if k % g == 0}
        compiled_int8 = torch.compile(lambda x: F.linear(x, w8.to(x.dtype)) * s8)
        compiled_w8a8 = torch.compile(lambda x: w8a8(x, w8t, s8))
        dequant = torch.compile(int4_dequant)
        for rows in rows_list:
            x = torch.randn(rows, k, device=dev, dtype=dt)
            attempt(shape, rows, "bf16", lambda: F.linear(x, w), n * k * 2, n, k)
            attempt(shape, rows, "int8_cast", lambda: F.linear(x, w8.to(dt)) * s8, n * k, n, k)
            if rows <= 32 and not args.no_compile:
                attempt(shape, rows, "int8_compiled", lambda: compiled_int8(x), n * k, n, k)
            if rows > 16:
                attempt(shape, rows, "w8a8", lambda: w8a8(x, w8t, s8), n * k, n, k)
                if not args.no_compile:
                    attempt(shape, rows, "w8a8_compiled", lambda: compiled_w8a8(x), n * k, n, k)
            for g, (packed, sz, _plain) in packs.items():
                fn = lambda: torch.ops.aten._weight_int4pack_mm(x, packed, g, sz)  # noqa: E731
                attempt(shape, rows, f"int4_tinygemm_g{g}", fn, n * k / 2 + sz.numel() * 2, n, k)
            if rows >= 512 and 128 in packs and not args.no_compile:
                plain = packs[128][2]
                fn = lambda: F.linear(x, dequant(*plain))  # noqa: E731
                attempt(shape, rows, "int4_dequant_g128", fn, n * k / 2, n, k)
        if torchao is not None:
            from torchao.quantization import Int4WeightOnlyConfig, Int8WeightOnlyConfig

            for name, cfg in (
                ("torchao_int4_g128", lambda: Int4WeightOnlyConfig(
                    group_size=128, int4_packing_format="tile_packed_to_4d")),
                ("torchao_int8", lambda: Int8WeightOnlyConfig()),
            ):  # fmt: skip
                try:
                    lin = torch.nn.Linear(k, n, bias=False, device=dev, dtype=dt)
                    lin.weight.data.copy_(w)
                    torchao(lin, cfg())
                    clin = torch.compile(lin)
                except Exception as exc:  # noqa: BLE001
                    msg = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
                    results.append({"shape": shape, "kernel": name, "error": msg})
                    print(f"{shape:8s} {name} failed: {msg}", flush=True)
                    continue
                wb = n * k / (2 if "int4" in name else 1)
                for rows in rows_list:
                    x = torch.randn(rows, k, device=dev, dtype=dt)
                    attempt(shape, rows, name, lambda: lin(x), wb, n, k)
                    if rows <= 32 and not args.no_compile:
                        attempt(shape, rows, name + "_compiled", lambda: clin(x), wb, n, k)
        torch.cuda.empty_cache()
        (args.out / "quant_kernels.json").write_text(
            json.dumps({"env": env, "results": results}, indent=1)
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
