# Each closure below is timed before its loop moves on, so late binding is harmless.
# ruff: noqa: B023
"""A probe for int4 GEMV with tensor cores (docs/perf-notes.md attempt 60): not acache's
kernel, a candidate for it.

int4wo's nibbles (models/quant.py: uint8 [N, K/2], channel 2j in byte j's high half)
are widened two at a time straight into bf16x2 with inline PTX (`prmt` spreads two bytes
into the halves of a register, `lop3` ORs each nibble into bf16's 128.0, so an element is
128 + u exactly; one `lop3` makes two weights), and multiplied by the decode row with
`tl.dot` (the row broadcast to 16, HMMA's smallest M). Each group's sum is then scaled:
``scale * (dot(x, 128 + u) - 128 sum(x)) + (zero - 8 scale) sum(x)``. The probe covers
the plain product (no prologue, no bias), groups of 128, K a multiple of the group.

- ``--sass``: compiles the kernel for sm_90 here (no GPU needed: Triton's own ptxas and
  nvdisasm) and prints the SASS instruction count of its loop per weight, for tiles
  ``BLOCK_N`` x 128 and 4 or 8 warps; ``--sass-acache`` also counts acache's own int4
  and int8 loops (models/gemv.py, the plain product) for comparison.
- otherwise (a CUDA GPU): on llama-7b's four block shapes, the probe against the float64
  product of the dequantized weight (max abs error) and its time against tinygemm's
  (`aten._weight_int4pack_mm`) and cuBLAS bf16, CUDA-graph timed past L2 as
  benchmarks/row_gemv.py times; writes OUT/int4_dot_probe.json.

    python benchmarks/int4_dot_probe.py --sass [--sass-acache]
    python benchmarks/int4_dot_probe.py --out OUT [--tiles 32x4,64x4,128x4,128x8]

The first form has no split-K: llama's N = 4096 shapes (o, down) get N / BLOCK_N
programs, and each moves one group's bytes (BLOCK_N x 64) a step, one step at a time: on
an H100 it ran at 0.2-1.3 TB/s, bound by load latency, not instructions (attempt 60). The
split form (``int4_dot_gemv_split``) is the same step with K split over a second grid axis
(8 or 16 programs an SM; fp32 atomics into a zeroed output, the zeroing timed too) and its
loads pipelined 1 or 3 steps ahead: how much of the miss is bytes in flight.
"""

from __future__ import annotations

import argparse
import collections
import itertools
import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import triton
import triton.language as tl

GROUP = 128
SHAPES = {"llama_qkv": (12288, 4096), "llama_o": (4096, 4096),
          "llama_gate_up": (22016, 4096), "llama_down": (4096, 11008)}  # fmt: skip
# Two bytes into two bf16x2 of high nibbles and two of low ones: 128 + u each.
WIDEN_PTX: tl.constexpr = tl.constexpr("""{
.reg .b32 t0, t1, s0, s1;
prmt.b32 t0, $4, 0, 0x4140;
prmt.b32 t1, $4, 0, 0x4342;
shr.b32 s0, t0, 4;
shr.b32 s1, t1, 4;
lop3.b32 $0, s0, 0x000F000F, 0x43004300, 0xEA;
lop3.b32 $1, s1, 0x000F000F, 0x43004300, 0xEA;
lop3.b32 $2, t0, 0x000F000F, 0x43004300, 0xEA;
lop3.b32 $3, t1, 0x000F000F, 0x43004300, 0xEA;
}""")


@triton.jit
def int4_dot_gemv(X, W, S, Y, N, K, GROUP: tl.constexpr, BLOCK_N: tl.constexpr):
    rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = rn < N
    rows = rn.to(tl.int64)
    KB = tl.multiple_of(K // 2, 16)
    rj = tl.arange(0, GROUP // 2)
    rk = tl.arange(0, GROUP)
    acc = tl.zeros([BLOCK_N], tl.float32)
    w_ptrs = W + rows[:, None] * KB + rj[None, :]
    for k0 in range(0, K, GROUP):
        b = tl.load(w_ptrs, mask=nmask[:, None], other=0, eviction_policy="evict_first")
        hi, lo = tl.inline_asm_elementwise(
            asm=WIDEN_PTX, constraints="=r,=r,=r,=r,r", args=[b],
            dtype=(tl.bfloat16, tl.bfloat16), is_pure=True, pack=4,
        )  # fmt: skip
        u = tl.interleave(hi, lo)  # [BLOCK_N, GROUP]: 128 + u, channels in order
        x = tl.load(X + k0 + rk)
        x16 = tl.broadcast_to(x[None, :], [16, GROUP])
        d = tl.dot(x16, tl.trans(u))  # [16, BLOCK_N], 16 equal rows
        xsum = tl.sum(x.to(tl.float32), axis=0)
        dots = tl.sum(d, axis=0) * 0.0625 - 128.0 * xsum
        sz = S + (k0 // GROUP) * N * 2 + rows * 2
        scale = tl.load(sz, mask=nmask, other=0.0).to(tl.float32)
        zero = tl.load(sz + 1, mask=nmask, other=0.0).to(tl.float32)
        acc += dots * scale + (zero - 8.0 * scale) * xsum
        w_ptrs += GROUP // 2
    tl.store(Y + rn, acc.to(Y.dtype.element_ty), mask=nmask)


@triton.jit
def int4_dot_gemv_split(X, W, S, Y, N, K, K_SPLIT, GROUP: tl.constexpr,
                        BLOCK_N: tl.constexpr, STAGES: tl.constexpr):  # fmt: skip
    """The first form with bytes in flight: K split over grid axis 1 (fp32 atomics into
    a zeroed Y; K_SPLIT a multiple of GROUP) and the loads pipelined STAGES steps ahead."""
    rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = rn < N
    rows = rn.to(tl.int64)
    KB = tl.multiple_of(K // 2, 16)
    rj = tl.arange(0, GROUP // 2)
    rk = tl.arange(0, GROUP)
    k_lo = tl.multiple_of(tl.program_id(1) * K_SPLIT, GROUP)
    k_hi = tl.minimum(k_lo + K_SPLIT, K)
    acc = tl.zeros([BLOCK_N], tl.float32)
    for k0 in tl.range(k_lo, k_hi, GROUP, num_stages=STAGES):
        k0 = tl.multiple_of(k0, GROUP)
        b = tl.load(W + rows[:, None] * KB + (k0 // 2 + rj)[None, :], mask=nmask[:, None],
                    other=0, eviction_policy="evict_first")  # fmt: skip
        hi, lo = tl.inline_asm_elementwise(
            asm=WIDEN_PTX, constraints="=r,=r,=r,=r,r", args=[b],
            dtype=(tl.bfloat16, tl.bfloat16), is_pure=True, pack=4,
        )  # fmt: skip
        u = tl.interleave(hi, lo)
        x = tl.load(X + k0 + rk)
        d = tl.dot(tl.broadcast_to(x[None, :], [16, GROUP]), tl.trans(u))
        xsum = tl.sum(x.to(tl.float32), axis=0)
        sz = S + (k0 // GROUP) * N * 2 + rows * 2
        scale = tl.load(sz, mask=nmask, other=0.0).to(tl.float32)
        zero = tl.load(sz + 1, mask=nmask, other=0.0).to(tl.float32)
        acc += (tl.sum(d, axis=0) * 0.0625) * scale + (zero - 136.0 * scale) * xsum
    tl.atomic_add(Y + rn, acc, mask=nmask)


def _tiles(text: str) -> list[tuple[int, int]]:
    return [(int(a), int(b)) for a, b in (t.split("x") for t in text.split(","))]


def _compiled_loop(fn: Any, sig: dict, consts: dict, warps: int, name: str) -> collections.Counter:
    """The opcodes of ``fn``'s K loop, compiled here for sm_90 (Triton's own ptxas and
    nvdisasm) as a launch on these shapes specializes it: every pointer 16-byte aligned
    and N and K multiples of 16 (Triton's launcher marks such arguments itself; without
    it each weight of a row starting at ``row * K`` is a byte load)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    nvdisasm = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "nvdisasm"
    divisible = [i for i, (a, t) in enumerate(sig.items()) if t.startswith("*") or a in ("N", "K")]
    aligned = {(i,): [["tt.divisibility", 16]] for i in divisible}
    src = ASTSource(fn, sig | dict.fromkeys(consts, "constexpr"), consts, aligned)
    kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps})
    cubin = Path(f"/tmp/int4_dot_probe_{name}.cubin")
    cubin.write_bytes(kernel.asm["cubin"])
    text = subprocess.run([str(nvdisasm), "-c", str(cubin)], capture_output=True,
                          text=True, check=True).stdout  # fmt: skip
    return _loop_ops(text.splitlines())


def _row(tile: str, warps: int, ops: collections.Counter, weights_a_thread: float) -> dict:
    return {"tile": tile, "warps": warps, "loop": sum(ops.values()),
            "per_weight": round(sum(ops.values()) / weights_a_thread, 2),
            "ops": dict(ops.most_common(12))}  # fmt: skip


def sass_counts(tiles: list[tuple[int, int]]) -> list[dict[str, Any]]:
    """The probe's loop: SASS instructions a weight for each (BLOCK_N, warps)."""
    sig = {"X": "*bf16", "W": "*u8", "S": "*bf16", "Y": "*bf16", "N": "i32", "K": "i32"}
    out = []
    for block_n, warps in tiles:
        consts = {"GROUP": GROUP, "BLOCK_N": block_n}
        ops = _compiled_loop(int4_dot_gemv, sig, consts, warps, f"{block_n}x{warps}")
        out.append(_row(f"{block_n}x{GROUP}", warps, ops, block_n * GROUP / (32 * warps)))
    return out


def split_sass_counts(tiles: list[tuple[int, int]], stages: int = 1) -> list[dict[str, Any]]:
    """The split-K form's loop, as ``sass_counts``."""
    sig = {"X": "*bf16", "W": "*u8", "S": "*bf16", "Y": "*fp32", "N": "i32", "K": "i32",
           "K_SPLIT": "i32"}  # fmt: skip
    out = []
    for block_n, warps in tiles:
        consts = {"GROUP": GROUP, "BLOCK_N": block_n, "STAGES": stages}
        name = f"split_{block_n}x{warps}s{stages}"
        ops = _compiled_loop(int4_dot_gemv_split, sig, consts, warps, name)
        row = _row(f"{block_n}x{GROUP}", warps, ops, block_n * GROUP / (32 * warps))
        out.append({"form": "split", "stages": stages} | row)
    return out


def acache_sass_counts(
    tiles: list[tuple[int, int, int]], int8: bool, int8_ptx: bool = True
) -> list[dict[str, Any]]:
    """acache's row GEMV (models/gemv.py), plain product, int4 (groups of 128) or int8
    (its inline PTX cast, as on a GPU, or with ``int8_ptx=False`` the interpreter's
    byte-at-a-time form): SASS instructions a weight of its loop for each (BLOCK_N,
    BLOCK_K, warps)."""
    from artifactcache.models import gemv

    gemv._define_kernels()
    sig = {"X": "*bf16", "W": "*u8", "S": "*bf16", "BIAS": "*bf16", "G": "*bf16",
           "NB": "*bf16", "R": "*bf16", "Y": "*bf16", "N": "i32", "K": "i32", "eps": "fp32",
           "gelu_from": "i32", "XT": "*bf16", "x_split": "i32", "gelu_out_from": "i32"}  # fmt: skip
    import torch

    from artifactcache.models.quant import quantize_int4, quantize_int8

    out = []
    for block_n, block_k, warps in tiles:
        # The constexprs _launch gives the kernel for such weights: K two tiles wide, so
        # EVEN_K; CPU tensors, nothing launched.
        w = torch.zeros(block_n, 2 * block_k, dtype=torch.bfloat16)
        weight, scales = quantize_int8(w) if int8 else quantize_int4(w, GROUP)
        _, _, consts, _ = gemv.kernel_call(
            torch.zeros(1, 2 * block_k, dtype=torch.bfloat16), weight, scales, None, None,
            0.0, False, None, gemv.GemvLaunch(block_n, block_k, warps), None, False, -1,
        )  # fmt: skip
        consts.pop("num_warps")
        consts["INT8_PTX"] = int8 and int8_ptx  # as on a GPU (these tensors are the CPU's)
        name = f"acache_{'int8' if int8 else 'int4'}_{block_n}x{block_k}x{warps}"
        ops = _compiled_loop(gemv._row_gemv, sig, consts, warps, name)
        out.append(_row(f"{block_n}x{block_k}", warps, ops, block_n * block_k / (32 * warps)))
    return out


def _loop_ops(lines: list[str]) -> collections.Counter:
    """Opcodes between the longest backward branch and its target: the K loop."""
    labels = {
        m.group(1): i for i, ln in enumerate(lines) if (m := re.match(r"\.(L_x_\d+):", ln.strip()))
    }
    body = (0, 0)
    for i, ln in enumerate(lines):
        m = re.search(r"BRA\s+`?\(?\.?(L_x_\d+)", ln)
        if m and labels.get(m.group(1), i) < i and i - labels[m.group(1)] > body[1] - body[0]:
            body = (labels[m.group(1)], i)
    ops: collections.Counter = collections.Counter()
    for ln in lines[body[0] + 1 : body[1] + 1]:
        m = re.search(r"\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_]+)", ln)
        if m and re.search(r"/\*[0-9a-f]{4}\*/", ln):
            ops[m.group(1)] += 1
    return ops


def on_gpu(
    out: Path, tiles: list[tuple[int, int]], split_tiles: list[tuple[int, int]]
) -> dict[str, Any]:
    import torch
    from row_gemv import bench, rotating  # benchmarks/row_gemv.py, beside this script

    from artifactcache.measure.child.timing import copy_bandwidth
    from artifactcache.models.quant import dequantize_int4, quantize_int4

    torch.manual_seed(0)
    dev = torch.device("cuda")
    copy_tb_s = copy_bandwidth(dev)["gbps"] / 1e3
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    rows: list[dict[str, Any]] = []
    for shape, (n, k) in SHAPES.items():
        w = torch.randn(n, k, device=dev, dtype=torch.bfloat16) / k**0.5
        x = torch.randn(1, k, device=dev, dtype=torch.bfloat16)
        nib, sz = quantize_int4(w, GROUP)
        want = (dequantize_int4(nib, sz, torch.float64) @ x.double().reshape(-1)).reshape(1, -1)
        nbytes = n * k // 2 + sz.numel() * 2 + 2 * (k + n)

        def record(kernel: str, fn: Any, weights: tuple, ref: Any = want, **launch: Any) -> None:
            err = (fn(*weights).double() - ref).abs().max().item()
            ms = bench(rotating(fn, weights))
            # bytes each kernel reads: cuBLAS the bf16 weight, the others the int4 one
            tb_s = (nbytes if kernel != "cublas_bf16" else 2 * n * k) / ms / 1e9
            rows.append({"shape": shape, "kernel": kernel, "us": round(ms * 1e3, 2), **launch,
                         "tb_s": round(tb_s, 3), "pct_copy": round(100 * tb_s / copy_tb_s, 1),
                         "max_abs_err": round(err, 5)})  # fmt: skip
            print(f"{shape:14s} {kernel:16s} {ms * 1e3:7.1f} us {tb_s:5.2f} TB/s err {err:.4f}",
                  flush=True)  # fmt: skip

        record("cublas_bf16", lambda w: torch.nn.functional.linear(x, w), (w,),
               (w.double() @ x.double().reshape(-1)).reshape(1, -1))  # fmt: skip
        packed = torch.ops.aten._convert_weight_to_int4pack(nib, 8)
        record("int4_tinygemm", lambda p, s: torch.ops.aten._weight_int4pack_mm(x, p, GROUP, s),
               (packed, sz))  # fmt: skip
        for block_n, warps in tiles:

            def probe(nib: Any, sz: Any) -> Any:
                y = torch.empty(1, n, device=dev, dtype=torch.bfloat16)
                int4_dot_gemv[(triton.cdiv(n, block_n),)](
                    x, nib, sz, y, n, k, GROUP=GROUP, BLOCK_N=block_n, num_warps=warps
                )
                return y

            record(f"int4_dot@{block_n}w{warps}", probe, (nib, sz))
        groups = k // GROUP
        timed = set()
        for (block_n, warps), stages, per_sm in itertools.product(split_tiles, (1, 3), (8, 16)):
            split = max(1, min(groups, round(per_sm * sms / triton.cdiv(n, block_n))))
            k_split = triton.cdiv(groups, split) * GROUP
            split = triton.cdiv(k, k_split)
            if (block_n, warps, stages, split) in timed:  # 8 and 16 an SM gave one grid
                continue
            timed.add((block_n, warps, stages, split))

            def probe_split(nib: Any, sz: Any) -> Any:
                y = torch.zeros(1, n, device=dev, dtype=torch.float32)
                int4_dot_gemv_split[(triton.cdiv(n, block_n), split)](
                    x, nib, sz, y, n, k, k_split, GROUP=GROUP, BLOCK_N=block_n,
                    STAGES=stages, num_warps=warps,
                )  # fmt: skip
                return y

            programs = triton.cdiv(n, block_n) * split
            record(f"int4_split@{block_n}w{warps}s{stages}k{split}", probe_split, (nib, sz),
                   split=split, stages=stages, programs=programs, per_sm=per_sm)  # fmt: skip
        del w, nib, sz, packed
        torch.cuda.empty_cache()
    doc = {"date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
           "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
           "triton": triton.__version__, "copy_tb_s": round(copy_tb_s, 3),
           "results": rows}  # fmt: skip
    out.mkdir(parents=True, exist_ok=True)
    (out / "int4_dot_probe.json").write_text(json.dumps(doc, indent=1))
    return doc


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sass", action="store_true", help="count the loop's SASS here (no GPU)")
    ap.add_argument("--sass-acache", action="store_true",
                    help="count acache's own int4 and int8 loops too (with --sass)")  # fmt: skip
    ap.add_argument("--out", type=Path, help="where the GPU run writes int4_dot_probe.json")
    ap.add_argument("--tiles", default="32x4,128x4", help="BLOCK_NxWARPS,... (first form)")
    ap.add_argument("--split-tiles", default="32x4,64x4,128x4",
                    help="BLOCK_NxWARPS,... of the split-K form (each with 1 and 3 stages and"
                    " 8 and 16 programs an SM)")  # fmt: skip
    args = ap.parse_args()
    tiles = _tiles(args.tiles)
    if args.sass:
        for row in sass_counts(tiles) + split_sass_counts(_tiles(args.split_tiles)):
            print(json.dumps(row))
        if args.sass_acache:
            for int8, cuts in ((False, [(8, 1024, 4), (8, 1024, 8), (16, 256, 4)]),
                               (True, [(4, 1024, 4)])):  # fmt: skip
                for row in acache_sass_counts(cuts, int8):
                    print(json.dumps({"acache": "int8" if int8 else "int4"} | row))
        return 0
    if args.out is None:
        print("error: --out is needed for a GPU run (or pass --sass)", file=sys.stderr)
        return 1
    on_gpu(args.out, tiles, _tiles(args.split_tiles))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
