# Each closure below is timed before its loop moves on, so late binding is harmless.
# ruff: noqa: B023
"""acache's int8 weight-only GEMV kernel (models/gemv.py) against the alternatives, one GPU.

Per seed-model Linear shape (llama-7b's and phi-3-mini's fused qkv, o, fused gate/up,
down; phi-2's fused qkv, dense, fc1, fc2) at decode rows (``--rows``, default 1 and 4):

- ``bf16``: ``F.linear`` on bf16 weights (cuBLAS, what the bytes are compared with);
- ``bf16_compiled`` / ``int8_compiled``: ``F.linear(x, w)`` and acache's old int8wo
  ``F.linear(x, w8.to(bf16)) * s`` under ``torch.compile`` with coordinate-descent
  tuning (Inductor's GEMV, what a CUDA decode step ran before), with ``--compiled``;
- ``int8_gemv``: models/gemv.py's int8 kernel at its own tile, and ``int8_gemv_cvt`` the
  same with the plain int-to-float conversion instead of the magic-number cast;
- ``int8_gemv@BNxBKwW``: the sweep of tiles (``--sweep``), to check int8_launch's choice;
- ``int4_tinygemm``: ``aten._weight_int4pack_mm`` (group 128), what int4wo decodes with.

(A Triton int4 kernel of the same design was measured here too, at 6ff0eb0; it lost to
tinygemm and is gone, docs/perf-notes.md attempt 30.)

Timing: ``triton.testing.do_bench_cudagraph`` median (replays of a CUDA graph, as
acache's decode runs; host launch costs would otherwise dominate), each call on the next
of enough weight copies to overflow the L2 cache. TB/s counts the bytes the kernel must
read (weights, scales, zeros, bias, activations) and write; the copy bandwidth measured
in the same run (``timing.copy_bandwidth``, read + write) is the ceiling, and each row
gives its % of it. Each kernel's output is checked against the bf16 GEMM on the
dequantized weights (max abs error, in the JSON). Writes OUT/quant_gemv.json.

    python benchmarks/quant_gemv.py --out OUT [--sweep] [--compiled]
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.nn import functional as F

from artifactcache.measure.child.timing import copy_bandwidth
from artifactcache.models import gemv
from artifactcache.models.quant import quantize_int4, quantize_int8, unpack_nibbles

SHAPES = {
    "llama_qkv": (12288, 4096), "llama_o": (4096, 4096),
    "llama_gate_up": (22016, 4096), "llama_down": (4096, 11008),
    "phi3_qkv": (9216, 3072), "phi3_o": (3072, 3072),
    "phi3_gate_up": (16384, 3072), "phi3_down": (3072, 8192),
    "phi2_qkv": (7680, 2560), "phi2_dense": (2560, 2560),
    "phi2_fc1": (10240, 2560), "phi2_fc2": (2560, 10240),
}  # fmt: skip
GROUP = 128
ROTATE_BYTES = 256 << 20  # an H200's L2 is 50 MB


def bench(fn: Callable[[], Any]) -> float:
    from triton.testing import do_bench_cudagraph

    return float(do_bench_cudagraph(fn, rep=50, return_mode="median"))


def rotating(fn: Callable[..., Any], x: torch.Tensor, *weights: torch.Tensor) -> Callable[[], Any]:
    """A call of ``fn(x, *weights)`` on the next of enough copies to overflow L2."""
    size = sum(w.numel() * w.element_size() for w in weights)
    copies = max(1, -(-ROTATE_BYTES // size))
    sets = [weights] + [tuple(w.clone() for w in weights) for _ in range(copies - 1)]
    turn = [0]

    def call() -> Any:
        i = turn[0] % copies
        turn[0] += 1
        return fn(x, *sets[i])

    return call


def sweep_tiles(rows: int) -> list[gemv.GemvLaunch]:
    """Tiles of 2k-16k weights a loop step over the rows' accumulators, 4 and 8 warps."""
    out = []
    for bk in (256, 512, 1024, 2048):
        for bn in (1, 2, 4, 8, 16, 32, 64):
            if 2048 <= bn * bk * gemv._pow2(rows) <= 16384:
                out += [gemv.GemvLaunch(bn, bk, w) for w in (4, 8)]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--rows", default="1,4")
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--sweep", action="store_true", help="time every tile of sweep_tiles too")
    ap.add_argument("--compiled", action="store_true", help="Inductor's GEMVs too (slow)")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    import torch._inductor.config as icfg

    icfg.coordinate_descent_tuning = True
    torch.manual_seed(0)
    dev = torch.device("cuda")
    copy = copy_bandwidth(dev)
    env = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
        "python": platform.python_version(), "copy_tb_s": round(copy["gbps"] / 1e3, 3),
    }  # fmt: skip
    print(env, flush=True)
    results: list[dict[str, Any]] = []

    def record(shape, rows, kernel, fn, ref, nbytes, *weights, x):
        t0 = time.perf_counter()
        try:
            err = (fn(x, *weights).float() - ref).abs().max().item()
            first_s = time.perf_counter() - t0
            ms = bench(rotating(fn, x, *weights))
        except Exception as exc:  # noqa: BLE001 - a kernel that fails is a result too
            msg = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
            results.append({"shape": shape, "rows": rows, "kernel": kernel, "error": msg})
            print(f"{shape:14s} {rows} {kernel:24s} failed: {msg}", flush=True)
            return
        tb_s = nbytes / ms / 1e9
        row = {"shape": shape, "rows": rows, "kernel": kernel, "us": round(ms * 1e3, 2),
               "tb_s": round(tb_s, 3), "pct_copy": round(100 * tb_s / env["copy_tb_s"], 1),
               "max_abs_err": round(err, 5), "first_call_s": round(first_s, 2)}  # fmt: skip
        results.append(row)
        print(f"{shape:14s} {rows} {kernel:24s} {row['us']:8.1f} us {tb_s:5.2f} TB/s "
              f"({row['pct_copy']:5.1f}%) err {err:.4f}", flush=True)  # fmt: skip

    def linear(x, w):
        return F.linear(x, w)

    def int8_cast(x, w, s):
        return F.linear(x, w.to(x.dtype)) * s

    compiled_linear = torch.compile(linear, dynamic=False)
    compiled_int8 = torch.compile(int8_cast, dynamic=False)

    def tinygemm(x, packed, sz):
        return torch.ops.aten._weight_int4pack_mm(x, packed, GROUP, sz)

    for rows in (int(r) for r in args.rows.split(",")):
        for shape in args.shapes.split(","):
            n, k = SHAPES[shape]
            w = torch.randn(n, k, device=dev, dtype=torch.bfloat16) / k**0.5
            x = torch.randn(rows, k, device=dev, dtype=torch.bfloat16)
            io = rows * (n + k) * 2
            record(shape, rows, "bf16", linear, linear(x, w).float(), n * k * 2 + io, w, x=x)
            if args.compiled:
                ref = linear(x, w).float()
                record(shape, rows, "bf16_compiled", compiled_linear, ref, n * k * 2 + io, w, x=x)
            w8, s8 = quantize_int8(w)
            ref8 = (F.linear(x.float(), w8.float()) * s8.float()).float()
            b8 = n * k + n * 2 + io
            if args.compiled:
                record(shape, rows, "int8_compiled", compiled_int8, ref8, b8, w8, s8, x=x)
            own = gemv.int8_launch(rows, n, k)
            for label, magic in (("int8_gemv", True), ("int8_gemv_cvt", False)):
                fn = lambda x, w8, s8: gemv.launch_int8(x, w8, s8, None, own, magic)  # noqa: E731
                record(shape, rows, label, fn, ref8, b8, w8, s8, x=x)
            if args.sweep:
                for cut in sweep_tiles(rows):
                    fn = lambda x, w8, s8: gemv.launch_int8(x, w8, s8, None, cut)  # noqa: E731
                    label = f"int8_gemv@{cut.block_n}x{cut.block_k}w{cut.num_warps}"
                    record(shape, rows, label, fn, ref8, b8, w8, s8, x=x)
            del w8, s8
            nib, sz = quantize_int4(w, GROUP)
            q = unpack_nibbles(nib).float().reshape(n, -1, GROUP)
            szt = sz.transpose(0, 1).float()
            w4 = ((q - 8) * szt[..., :1] + szt[..., 1:]).reshape(n, k)
            ref4 = F.linear(x.float(), w4)
            b4 = n * k // 2 + sz.numel() * 2 + io
            del q, szt, w4
            packed = torch.ops.aten._convert_weight_to_int4pack(nib, 8)
            record(shape, rows, "int4_tinygemm", tinygemm, ref4, b4, packed, sz, x=x)
            del packed
            del w, nib, sz
            torch.cuda.empty_cache()
            (args.out / "quant_gemv.json").write_text(
                json.dumps(
                    {"env": env, "args": vars(args) | {"out": str(args.out)}, "results": results},
                    indent=1,
                )  # fmt: skip
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
