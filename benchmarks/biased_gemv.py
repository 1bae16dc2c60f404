"""Decode matmuls with a bias (phi-2's every Linear) at M=1, on one GPU (issue 32).

phi-2 decodes at ~47% of the bandwidth roofline while the llama models reach ~77%; an
earlier profile put 2.0 ms of its 2.57 ms step in cuBLAS GEMMs-with-bias at ~2.65 TB/s.
Inductor rewrites an M=1 ``aten.mm`` into a pointwise-multiply + reduction (a Triton
GEMV that coordinate-descent tuning sizes), but its ``aten.addmm`` rewrite is CPU-only,
so a biased Linear stays on cuBLAS. Per phi-2 shape (fused qkv, dense, fc1, fc2,
lm_head) and llama-7b's gate_up for reference, at rows 1 (and 8), times:

- ``eager_addmm``: ``F.linear(x, w, b)`` uncompiled (cuBLAS, bias in the epilogue);
- ``compiled_addmm``: the same under ``torch.compile`` with coordinate-descent tuning
  (what acache's CUDA builds use for decode);
- ``compiled_mm_add``: ``F.linear(x, w) + b`` under the same compile (the bias outside
  the matmul, so the mm rewrite applies and the add fuses into its reduction);
- ``compiled_mm``: ``F.linear(x, w)`` without a bias, the reference rate.

Timing: ``triton.testing.do_bench_cudagraph`` median (calls replayed from a CUDA graph,
as acache's decode runs them; timing calls one by one measures the host's guards and
launches instead, 20-70 us here), each call on the next of enough weight copies to
overflow the L2 cache (a single copy of phi-2's smaller weights stays in it). TB/s
counts weight + bias + activation bytes.
Writes OUT/biased_gemv.json and prints a line per kernel.

    python benchmarks/biased_gemv.py --out OUT
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

# (out, in) of each Linear; phi-2's q/k/v are fused on CUDA builds (fuse_projections).
SHAPES = {
    "phi2_qkv": (7680, 2560), "phi2_dense": (2560, 2560), "phi2_fc1": (10240, 2560),
    "phi2_fc2": (2560, 10240), "phi2_lm_head": (51200, 2560), "llama_gate_up": (22016, 4096),
}  # fmt: skip


def bench(fn: Callable[[], Any]) -> float:
    """Kernel time per call, from a CUDA graph's replays: a compiled function's guards
    and launch take longer on the host than these kernels on the GPU, so timing calls
    one by one (``do_bench``) would measure the host, not the kernel."""
    from triton.testing import do_bench_cudagraph

    return float(do_bench_cudagraph(fn, rep=100, return_mode="median"))


# An H200's L2 holds 50 MB: phi-2's smaller weights (13-52 MB) would be read from it if
# one copy were timed again and again, which no decode step does.
ROTATE_BYTES = 256 << 20


def rotating(fn: Callable[..., Any], x: Any, w: Any, b: Any) -> Callable[[], Any]:
    """A call of ``fn`` on the next of enough weight copies to overflow L2 each time."""
    copies = max(1, -(-ROTATE_BYTES // (w.numel() * w.element_size())))
    ws = [w] + [w.clone() for _ in range(copies - 1)]
    bs = [b] + [b.clone() for _ in range(copies - 1)]
    turn = [0]

    def call() -> Any:
        i = turn[0] % copies
        turn[0] += 1
        return fn(x, ws[i], bs[i])

    return call


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--rows", default="1,8")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    import torch._inductor.config as icfg

    icfg.coordinate_descent_tuning = True
    torch.manual_seed(0)
    env = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
        "python": platform.python_version(),
    }  # fmt: skip
    print(env, flush=True)
    results: list[dict[str, Any]] = []

    def addmm(x, w, b):
        return F.linear(x, w, b)

    def mm_add(x, w, b):
        return F.linear(x, w) + b

    def mm(x, w, b):
        return F.linear(x, w)

    kinds = {
        "eager_addmm": addmm,
        "compiled_addmm": torch.compile(addmm, dynamic=False),
        "compiled_mm_add": torch.compile(mm_add, dynamic=False),
        "compiled_mm": torch.compile(mm, dynamic=False),
    }
    for rows in (int(r) for r in args.rows.split(",")):
        for shape, (n, k) in SHAPES.items():
            w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k**0.5
            b = torch.randn(n, device="cuda", dtype=torch.bfloat16)
            x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
            ref = addmm(x, w, b).float()
            nbytes = (n * k + n + rows * (n + k)) * 2
            for kind, fn in kinds.items():
                t0 = time.perf_counter()
                try:
                    want = ref - b.float() if kind == "compiled_mm" else ref
                    err = (fn(x, w, b).float() - want).abs().max().item()
                    first_s = time.perf_counter() - t0
                    ms = bench(rotating(fn, x, w, b))
                except Exception as exc:  # noqa: BLE001 - a kernel that fails is a result too
                    msg = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
                    results.append({"shape": shape, "rows": rows, "kernel": kind, "error": msg})
                    print(f"{shape:14s} {rows:3d} {kind:16s} failed: {msg}", flush=True)
                    continue
                row = {"shape": shape, "n": n, "k": k, "rows": rows, "kernel": kind,
                       "us": round(ms * 1e3, 2), "tb_s": round(nbytes / ms / 1e9, 3),
                       "max_abs_err_vs_eager": round(err, 5),
                       "first_call_s": round(first_s, 2)}  # fmt: skip
                results.append(row)
                print(f"{shape:14s} {rows:3d} {kind:16s} {row['us']:8.1f} us "
                      f"{row['tb_s']:5.2f} TB/s err {err:.4f} (first call {first_s:.1f} s)",
                      flush=True)  # fmt: skip
    doc = {"env": env, "results": results}
    (args.out / "biased_gemv.json").write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
