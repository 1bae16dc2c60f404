# Each closure below is timed before its loop moves on, so late binding is harmless.
# ruff: noqa: B023
"""acache's row GEMV (models/gemv.py) against what a decode step ran before, one GPU.

Per seed-model projection (llama-7b's, llama-3-8b's and phi-3-mini's fused qkv, o, fused
gate/up, down; phi-2's fused in and out), one decode row, each with what the block puts
around it: an RMSNorm before qkv and gate/up, the skip after o, SiLU-and-mul before down
and the skip after it; phi-2's LayerNorm and bias, its GELU, bias and skip.

- ``cublas``: ``F.linear`` alone (the norm or SiLU not counted: the bytes' reference);
- ``inductor``: the projection with its prologue and epilogue under ``torch.compile``
  with coordinate-descent tuning (Inductor's GEMV with the norm fused in: what a CUDA
  decode step ran before ``row_gemv``);
- ``acache``: ``acache::row_gemv`` at gemv_launch's tile, the same work in one kernel;
- ``acache_plain``: the same kernel and tile on x after the prologue, the prologue left
  out (bias and skip kept): ``acache`` less this is what the prologue costs in the kernel;
- ``acache_early_tile`` (LayerNorm shapes): ``acache`` with the first weight tile's load
  before the LayerNorm's statistics (gemv_tiles.LN_EARLY_TILE, off by default);
  ``acache_gelu_out`` (phi2_in): ``acache`` with GELU on the outputs from fc1's first on,
  phi-2's one-row in-projection;
- ``acache@BNxBKwW[sS]``: a sweep of tiles (``--sweep``; ``sS``: S loop stages, from
  ``--stages``), to check gemv_launch's choice;
- ``int8_acache``: the same with int8 weights (per-row scales), ``int8_acache_bytes``
  the same kernel with its int8 cast a byte at a time in Triton (the cast before the
  inline PTX, docs/perf-notes.md attempt 64; ``--sweep int8``: also
  ``int8_acache@BNxBKwW`` over sweep_tiles), ``int4_tinygemm``
  (``aten._weight_int4pack_mm``, group 128, the projection alone) and ``int4_acache``
  (acache's GEMV on the same weights' plain nibbles, prologue and skip included; with
  ``--sweep`` or ``--sweep int4`` also ``int4_acache@BNxBKwW`` over int4_tiles),
  and ``int4_gemlite`` (GemLite's A16W4 GEMV on the
  same values, the projection alone, where ``gemlite`` is installed), with ``--quant``.

Timing: ``triton.testing.do_bench_cudagraph`` median (replays of a CUDA graph, as
acache's decode runs), each call on the next of enough weight copies to overflow the L2
cache. TB/s counts the bytes each kernel must read and write (weights, scales, vectors,
activations); the copy bandwidth measured in the same run (``timing.copy_bandwidth``)
is the ceiling, and each row gives its % of it. Each output is checked against the
float64 product (max abs error in the JSON). Writes OUT/row_gemv.json.

    python benchmarks/row_gemv.py --out OUT [--shapes a,b] [--sweep [int4|int8]]
        [--stages 1,2,3] [--quant [int8]] [--no-inductor]

A sweep ends with each shape's fastest tile against the default tile (``acache``:
gemv_launch's rules, or SWEPT_FLOAT_TILES); the same summary of a saved run, without a
GPU: ``python benchmarks/row_gemv.py --summary JSON``.
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
from artifactcache.models import gemv, gemv_tiles
from artifactcache.models.quant import dequantize_int4, quantize_int4, quantize_int8

# name: (N, K, role); role: "norm" (RMSNorm before), "skip" (residual after),
# "down" (SiLU-and-mul before, residual after)
SHAPES = {
    "llama_qkv": (12288, 4096, "norm"), "llama_o": (4096, 4096, "skip"),
    "llama_gate_up": (22016, 4096, "norm"), "llama_down": (4096, 11008, "down"),
    "llama3_qkv": (6144, 4096, "norm"), "llama3_gate_up": (28672, 4096, "norm"),
    "llama3_down": (4096, 14336, "down"),
    "phi3_qkv": (9216, 3072, "norm"), "phi3_o": (3072, 3072, "skip"),
    "phi3_gate_up": (16384, 3072, "norm"), "phi3_down": (3072, 8192, "down"),
    "phi2_in": (17920, 2560, "layer_norm"), "phi2_out": (2560, 12800, "gelu"),
    "llama_head": (32000, 4096, "norm"), "llama3_head": (128256, 4096, "norm"),
    "phi3_head": (32064, 3072, "norm"), "phi2_head": (51200, 2560, "layer_norm"),
    "phi2_out_plain": (2560, 12800, "bias_skip"),
}  # fmt: skip
# phi-2's fused block (models/phi2.py): "layer_norm": a LayerNorm with its bias before
# [q; k; v; fc1], the bias after; "gelu": [dense | fc2] on [y | up], GELU on up (from
# channel K / 5), the bias and the skip after; "bias_skip": the bias and the skip, no
# prologue (phi-2's [dense | fc2] where the in-projection applied the GELU). "*_head":
# the LM head after the final norm (llama_head is mistral-7b's too; phi-2's has a bias,
# as "layer_norm" times it).
GROUP = 128
ROTATE_BYTES = 256 << 20  # an H200's L2 is 50 MB
EPS = 1e-5


def bench(fn: Callable[[], Any]) -> float:
    from triton.testing import do_bench_cudagraph

    return float(do_bench_cudagraph(fn, rep=50, return_mode="median"))


def rotating(fn: Callable[..., Any], weights: tuple[torch.Tensor, ...]) -> Callable[[], Any]:
    """A call of ``fn(*weights)`` on the next of enough copies to overflow L2."""
    size = sum(w.numel() * w.element_size() for w in weights)
    copies = max(1, -(-ROTATE_BYTES // size))
    sets = [weights] + [tuple(w.clone() for w in weights) for _ in range(copies - 1)]
    turn = [0]

    def call() -> Any:
        i = turn[0] % copies
        turn[0] += 1
        return fn(*sets[i])

    return call


def sweep_tiles(stages: tuple[int, ...] = (1,)) -> list[gemv.GemvLaunch]:
    """Tiles of 2k-16k weights a loop step (up to 32 channels a program), 4 and 8 warps;
    for each of ``stages`` above 1 (loads in flight), the tiles of 4k-16k weights with 4
    warps."""
    out = []
    for bk in (256, 512, 1024, 2048):
        for bn in (1, 2, 4, 8, 16, 32):
            if 2048 <= bn * bk <= 16384:
                out += [gemv.GemvLaunch(bn, bk, w) for w in (4, 8)]
            if 4096 <= bn * bk <= 16384:
                out += [gemv.GemvLaunch(bn, bk, 4, st) for st in stages if st > 1]
    return out


def tile_label(cut: gemv.GemvLaunch) -> str:
    stages = f"s{cut.stages}" if cut.stages > 1 else ""
    return f"{cut.block_n}x{cut.block_k}w{cut.num_warps}{stages}"


def int4_tiles() -> list[gemv.GemvLaunch]:
    """int4 tiles: 1-16 groups (GROUP channels each) a loop step, 4-32 channels a
    program, 1-16 KB of nibbles a step, 4 and 8 warps."""
    return [
        gemv.GemvLaunch(bn, GROUP * g, w)
        for g in (1, 2, 4, 8, 16) for bn in (4, 8, 16, 32) for w in (4, 8)
        if 1024 <= bn * GROUP * g // 2 <= 16384
    ]  # fmt: skip


def tile_summary(results: list[dict[str, Any]], prefix: str = "acache") -> list[dict[str, Any]]:
    """Per shape, the fastest of the ``PREFIX@TILE`` rows against the default tile (the
    ``PREFIX`` row): ``default_us``, ``best`` (the tile's label), ``best_us``, ``speedup``
    (default over best) and ``best_pct_copy``. Failed rows and shapes without both are left
    out."""
    out = []
    for shape in dict.fromkeys(r["shape"] for r in results):
        rows = [r for r in results if r["shape"] == shape and "us" in r]
        default = next((r for r in rows if r["kernel"] == prefix), None)
        swept = [r for r in rows if r["kernel"].startswith(prefix + "@")]
        if default is None or not swept:
            continue
        best = min(swept, key=lambda r: r["us"])
        out.append({
            "shape": shape, "default_us": default["us"], "best": best["kernel"].split("@", 1)[1],
            "best_us": best["us"], "speedup": round(default["us"] / best["us"], 3),
            "best_pct_copy": best["pct_copy"],
        })  # fmt: skip
    return out


def print_summary(results: list[dict[str, Any]]) -> None:
    for prefix in ("acache", "int8_acache", "int4_acache"):
        for row in tile_summary(results, prefix):
            print(f"best {prefix} {row['shape']:15s} {row['best']:10s} {row['best_us']:8.2f} us"
                  f" ({row['best_pct_copy']:5.1f}%) against the default's {row['default_us']:8.2f}"
                  f" us: {row['speedup']:.3f}x", flush=True)  # fmt: skip


def gemlite_int4(nibbles: torch.Tensor, sz: torch.Tensor) -> Any:
    """GemLite's A16W4 layer (its own packing and Triton GEMVs, autotuned at the first
    call) holding int4wo's values: W = (q - 8) * scale + zero is GemLite's (q - zero') *
    scale with zero' = 8 - zero / scale. None where gemlite is not installed."""
    try:
        from gemlite.core import DType, GemLiteLinearTriton
    except ImportError:
        return None
    from artifactcache.models.quant import unpack_nibbles

    n, k = nibbles.shape[0], nibbles.shape[1] * 2
    scale = sz[..., 0].t().contiguous()  # [N, K/group]
    zero = (8 - sz[..., 1].t().float() / scale.float()).to(scale.dtype)
    layer = GemLiteLinearTriton(
        W_nbits=4, group_size=GROUP, in_features=k, out_features=n,
        input_dtype=DType.BF16, output_dtype=DType.BF16,
    )  # fmt: skip
    layer.pack(unpack_nibbles(nibbles), scale, zero, bias=None, fma_mode=False)
    return layer


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    where = ap.add_mutually_exclusive_group(required=True)
    where.add_argument("--out", type=Path, help="time the kernels; row_gemv.json goes here")
    where.add_argument("--summary", type=Path, help="print a saved row_gemv.json's best tiles")
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument(
        "--sweep", nargs="?", const="all", choices=("all", "int4", "int8"), default=None,
        help="time every tile too: sweep_tiles and (with --quant) int4_tiles; int4: only"
        " those; int8: int8 weights over sweep_tiles (with --quant)",
    )  # fmt: skip
    ap.add_argument(
        "--quant", nargs="?", const="all", choices=("all", "int8"), default=None,
        help="int8 and int4 kernels too (int8: int8's alone)",
    )  # fmt: skip
    ap.add_argument(
        "--stages", default="1",
        help="the sweep's loop stages, e.g. 1,2,3 (above 1: 4-warp tiles of 4k-16k weights)",
    )  # fmt: skip
    ap.add_argument("--no-inductor", action="store_true", help="skip Inductor's (compiles)")
    args = ap.parse_args()
    if args.summary:
        try:
            results = json.loads(args.summary.read_text())["results"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            ap.error(f"{args.summary} is no row_gemv.json ({type(exc).__name__}: {exc})")
        print_summary(results)
        return 0
    if args.sweep in ("int4", "int8") and args.quant not in ("all", args.sweep):
        need = "--quant" if args.sweep == "int4" else "--quant or --quant int8"
        ap.error(f"--sweep {args.sweep} times {args.sweep} weights: it needs {need}")
    tiles = sweep_tiles(tuple(int(t) for t in args.stages.split(",")))
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

    def record(shape: str, kernel: str, fn: Callable, weights: tuple, ref: torch.Tensor,
               nbytes: int) -> None:  # fmt: skip
        t0 = time.perf_counter()
        try:
            err = (fn(*weights).double().reshape(-1) - ref).abs().max().item()
            first_s = time.perf_counter() - t0
            ms = bench(rotating(fn, weights))
        except Exception as exc:  # noqa: BLE001 - a kernel that fails is a result too
            msg = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
            results.append({"shape": shape, "kernel": kernel, "error": msg})
            print(f"{shape:15s} {kernel:22s} failed: {msg}", flush=True)
            return
        tb_s = nbytes / ms / 1e9
        row = {"shape": shape, "kernel": kernel, "us": round(ms * 1e3, 2),
               "tb_s": round(tb_s, 3), "pct_copy": round(100 * tb_s / env["copy_tb_s"], 1),
               "max_abs_err": round(err, 5), "first_call_s": round(first_s, 2)}  # fmt: skip
        results.append(row)
        print(f"{shape:15s} {kernel:22s} {row['us']:8.1f} us {tb_s:5.2f} TB/s "
              f"({row['pct_copy']:5.1f}%) err {err:.4f}", flush=True)  # fmt: skip

    for shape in args.shapes.split(","):
        n, k, role = SHAPES[shape]
        silu, layer_norm = role == "down", role == "layer_norm"
        gelu_from = k // 5 if role == "gelu" else -1

        def vector(size: int, offset: float = 0.0) -> torch.Tensor:
            return (offset + torch.rand(size, device=dev)).to(torch.bfloat16)

        # x far from 0 before a LayerNorm (it must centre it)
        x = (3 if layer_norm else 0) + torch.randn(1, 2 * k if silu else k, device=dev)
        x = x.to(torch.bfloat16)
        g = vector(k, 1) if role in ("norm", "layer_norm") else None
        nb = vector(k, -0.5) if layer_norm else None
        bias = vector(n, -0.5) if role in ("layer_norm", "gelu", "bias_skip") else None
        skip = role in ("skip", "down", "gelu", "bias_skip")
        r = torch.randn(1, n, device=dev, dtype=torch.bfloat16) if skip else None
        w = torch.randn(n, k, device=dev, dtype=torch.bfloat16) / k**0.5

        def prologue(x: torch.Tensor) -> torch.Tensor:
            if layer_norm:
                return F.layer_norm(x, (k,), g.to(x.dtype), nb.to(x.dtype), EPS)
            if g is not None:
                xf = x.float()
                return g * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS)).to(x.dtype)
            if silu:
                gate, up = x.chunk(2, dim=-1)
                return F.silu(gate) * up
            if gelu_from >= 0:
                up = F.gelu(x[:, gelu_from:], approximate="tanh")
                return torch.cat([x[:, :gelu_from], up], dim=-1)
            return x

        def block(w: torch.Tensor) -> torch.Tensor:
            y = F.linear(prologue(x), w, bias)
            return y if r is None else r + y

        a = prologue(x.double() if role != "norm" else x)
        a = a.double().reshape(-1)
        # cuBLAS's reference: the product and its bias; it leaves out the skip
        product = w.double() @ a + (0 if bias is None else bias.double())
        want = product + (0 if r is None else r.double().reshape(-1))
        vectors = [t for t in (r, g, nb, bias) if t is not None]
        io = 2 * (x.numel() + n + sum(t.numel() for t in vectors))
        plain_x = prologue(x)
        record(shape, "cublas", lambda w: F.linear(plain_x, w, bias), (w,), product,
               n * k * 2 + io)  # fmt: skip
        if not args.no_inductor:
            compiled = torch.compile(block, dynamic=False)
            record(shape, "inductor", compiled, (w,), want, n * k * 2 + io)

        def ours(w, s=None, cut=None):
            return gemv.launch_gemv(
                x, w, s, bias, g, EPS, silu, r, cut=cut, norm_bias=nb,
                layer_norm=layer_norm, gelu_from=gelu_from,
            )  # fmt: skip

        def ours_bytes(w, s):  # int8 cast a byte at a time, as before the inline PTX
            grid, kernel_args, consts, y = gemv.kernel_call(
                x, w, s, bias, g, EPS, silu, r, None, nb, layer_norm, gelu_from
            )  # fmt: skip
            gemv._row_gemv[grid](*kernel_args, **(consts | {"INT8_PTX": False}))
            return y

        def ours_plain(w):  # the prologue's work left out; its tile kept
            kind = gemv.prologue_kind(g is not None, layer_norm, silu, gelu_from)
            cut = gemv.gemv_launch(n, k, False, kind)
            return gemv.launch_gemv(plain_x, w, None, bias, None, EPS, False, r, cut=cut)

        record(shape, "acache", ours, (w,), want, n * k * 2 + io)
        record(shape, "acache_plain", ours_plain, (w,), want, n * k * 2 + io)
        if layer_norm:

            def ours_early_tile(w):
                default, gemv_tiles.LN_EARLY_TILE = gemv_tiles.LN_EARLY_TILE, True
                try:
                    return ours(w)
                finally:
                    gemv_tiles.LN_EARLY_TILE = default

            record(shape, "acache_early_tile", ours_early_tile, (w,), want, n * k * 2 + io)
        if shape == "phi2_in":
            fc1 = n - 4 * k  # [q; k; v; fc1], fc1 four times the width

            def ours_gelu_out(w):
                return gemv.launch_gemv(
                    x, w, None, bias, g, EPS, False, None, norm_bias=nb, layer_norm=True,
                    gelu_out_from=fc1,
                )  # fmt: skip

            want_g = torch.cat([want[:fc1], F.gelu(want[fc1:], approximate="tanh")])
            record(shape, "acache_gelu_out", ours_gelu_out, (w,), want_g, n * k * 2 + io)
        if args.sweep == "all":
            for cut in tiles:
                label = f"acache@{tile_label(cut)}"
                record(shape, label, lambda w: ours(w, cut=cut), (w,), want, n * k * 2 + io)
        if args.quant:
            w8, s8 = quantize_int8(w)
            after = want - product + (0 if bias is None else bias.double())  # bias, skip
            want8 = (w8.double() * s8.double()[:, None]) @ a + after
            b8 = n * k + 2 * n + io
            record(shape, "int8_acache", ours, (w8, s8), want8, b8)
            record(shape, "int8_acache_bytes", ours_bytes, (w8, s8), want8, b8)
            if args.sweep == "int8":
                for cut in tiles:
                    label = f"int8_acache@{tile_label(cut)}"
                    fn = lambda w, s: ours(w, s, cut=cut)  # noqa: E731
                    record(shape, label, fn, (w8, s8), want8, b8)
            del w8, s8
            if args.quant == "all":
                nib, sz = quantize_int4(w, GROUP)
                packed = torch.ops.aten._convert_weight_to_int4pack(nib, 8)

                def tinygemm(packed, sz):
                    return torch.ops.aten._weight_int4pack_mm(plain_x, packed, GROUP, sz)

                b4 = n * k // 2 + sz.numel() * 2 + io
                ref4 = tinygemm(packed, sz).double().reshape(-1)  # its own output: time only
                record(shape, "int4_tinygemm", tinygemm, (packed, sz), ref4, b4)
                # acache's int4 GEMV on the same nibbles, with the prologue and skip, against
                # the float64 product of the dequantized weight.
                product4 = dequantize_int4(nib, sz, torch.float64) @ a  # GemLite's reference
                want4 = product4 + after
                record(shape, "int4_acache", ours, (nib, sz), want4, b4)
                gemlite_layer = gemlite_int4(nib, sz)
                if gemlite_layer is not None:
                    from gemlite.core import forward_functional

                    tensors = gemlite_layer.get_tensor_args()
                    meta = gemlite_layer.get_meta_args()

                    def gemlite_fn(w, s, z):
                        return forward_functional(plain_x, None, [w, s, z, *tensors[3:]], meta)

                    record(shape, "int4_gemlite", gemlite_fn, tuple(tensors[:3]), product4, b4)
                    del gemlite_layer, tensors
                if args.sweep in ("all", "int4"):
                    for cut in int4_tiles():
                        label = f"int4_acache@{tile_label(cut)}"
                        fn = lambda w, s: ours(w, s, cut=cut)  # noqa: E731
                        record(shape, label, fn, (nib, sz), want4, b4)
                del packed, nib, sz
        del w
        torch.cuda.empty_cache()
        torch._dynamo.reset()
        doc = {"env": env, "args": vars(args) | {"out": str(args.out)}, "results": results}
        (args.out / "row_gemv.json").write_text(json.dumps(doc, indent=1))
    print_summary(results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
