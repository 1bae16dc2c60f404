"""How long Inductor's analysis of acache's row GEMV takes a call site, with no GPU.

Inductor reads every call of a user Triton kernel (``wrap_triton``, under the
``acache::row_gemv`` triton_op) by compiling the kernel to TTIR and walking it for the
tensors it writes (torch._higher_order_ops.triton_kernel_wrap.identify_accessed_tensors).
A phi-2 decode step has 65 such calls; this script times the analysis of phi-2's three
(the fused in-projection with its LayerNorm, the out-projection with GELU and the skip,
the LM head), Triton's target set to sm_90 so that it runs on a machine without a GPU.
A question of docs/perf-notes.md attempt 63 (phi-2's build time). ``--compile`` also
times each site's kernel compiled for sm_90 by Triton itself (ptxas included; a fresh
TRITON_CACHE_DIR, so nothing is found cached).

    python benchmarks/user_kernel_analysis.py [--repeat 5] [--compile] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from typing import Any

import torch


def _launch_kwargs(
    n: int, k: int, *, layer_norm: bool = False, x_split: int = 0, gelu_out_from: int = -1
) -> dict[str, Any]:
    """The kernel's arguments by name, as models/gemv.py's _launch passes them for a bf16
    GEMV with a bias (CPU tensors: the analysis reads dtypes, not data): with a LayerNorm
    prologue, GELU on the outputs from ``gelu_out_from`` (phi-2's in-projection), or
    (``x_split`` > 0) the skip and x in two parts from there, as phi-2's out-projection
    reads [attention | fc1]."""
    from artifactcache.models import gemv

    def vector(size: int) -> torch.Tensor:
        return torch.empty(size, dtype=torch.bfloat16)

    head = x_split or k
    _, args, consts, _ = gemv.kernel_call(
        torch.empty(1, head, dtype=torch.bfloat16), torch.empty(n, k, dtype=torch.bfloat16),
        None, vector(n), vector(k) if layer_norm else None, 1e-5, False,
        vector(n) if x_split else None, None, vector(k) if layer_norm else None,
        layer_norm, -1, torch.empty(1, k - head, dtype=torch.bfloat16) if x_split else None,
        gelu_out_from,
    )  # fmt: skip
    gemv._define_kernels()
    # num_warps is a launch option, not an argument (_compile_s reads it)
    return dict(zip(gemv._row_gemv.arg_names, args, strict=False)) | consts


def _analyse(repeat: int, compile_too: bool = False) -> list[dict[str, Any]]:
    """Each phi-2 call site analysed ``repeat`` times: the first and the median after."""
    from torch._higher_order_ops.triton_kernel_wrap import identify_accessed_tensors

    from artifactcache.models import gemv

    gemv._define_kernels()
    sites = {"phi2_in (LayerNorm, GELU on fc1)":
                 _launch_kwargs(17920, 2560, layer_norm=True, gelu_out_from=7680),
             "phi2_out (skip, x in two parts)": _launch_kwargs(2560, 12800, x_split=2560),
             "phi2_head (LayerNorm)": _launch_kwargs(51200, 2560, layer_norm=True)}  # fmt: skip
    rows = []
    for site, kwargs in sites.items():
        times = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            writes = identify_accessed_tensors(gemv._row_gemv, dict(kwargs), {})
            times.append(time.perf_counter() - t0)
        written = sorted(d.name for d in writes.read_writes.writes)
        rows.append({"site": site, "first_ms": round(times[0] * 1e3, 1),
                     "median_after_ms": round(statistics.median(times[1:] or times) * 1e3, 1),
                     "writes": written})  # fmt: skip
        if compile_too:
            rows[-1]["compile_s"] = round(_compile_s(gemv._row_gemv, kwargs), 2)
    return rows


def _compile_s(kernel: Any, kwargs: dict[str, Any]) -> float:
    """Seconds for Triton to compile ``kernel`` at these arguments (``num_warps`` among
    them) for sm_90."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    kwargs = dict(kwargs)
    warps = kwargs.pop("num_warps")
    const_names = {kernel.arg_names[i] for i in kernel.constexprs}
    consts = {k: v for k, v in kwargs.items() if k in const_names}
    names = {torch.bfloat16: "*bf16"}
    sig = {k: names[v.dtype] if isinstance(v, torch.Tensor) else "fp32" if isinstance(v, float)
           else "i32" for k, v in kwargs.items() if k not in consts}  # fmt: skip
    aligned = {(i,): [["tt.divisibility", 16]] for i, v in enumerate(kwargs.values())
               if isinstance(v, torch.Tensor)}  # fmt: skip
    src = ASTSource(kernel, sig | dict.fromkeys(consts, "constexpr"), consts, aligned)
    t0 = time.perf_counter()
    triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps})
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeat", type=int, default=5, help="analyses a call site")
    ap.add_argument("--compile", action="store_true", help="time Triton's compile too")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    import triton
    from triton.backends.compiler import GPUTarget

    class Hopper:  # a driver's target alone: nothing is launched
        def get_current_target(self) -> GPUTarget:
            return GPUTarget("cuda", 90, 32)

    drivers = triton.runtime.driver
    cache_dir = os.environ.get("TRITON_CACHE_DIR")
    before = drivers._active  # put back after: a process with a GPU keeps its own driver
    drivers.set_active(Hopper())  # type: ignore[arg-type]
    try:
        with tempfile.TemporaryDirectory(prefix="acache-uka-") as fresh:
            if args.compile:  # nothing found cached
                os.environ["TRITON_CACHE_DIR"] = fresh
            rows = _analyse(args.repeat, args.compile)
    finally:
        drivers._active = before
        if cache_dir is None:
            os.environ.pop("TRITON_CACHE_DIR", None)
        else:
            os.environ["TRITON_CACHE_DIR"] = cache_dir
    doc = {"date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
           "torch": torch.__version__, "triton": triton.__version__, "sites": rows}  # fmt: skip
    if args.json:
        print(json.dumps(doc, indent=1))
    else:
        for r in rows:
            after = r["median_after_ms"]
            compiled = f"; compiled in {r['compile_s']} s" if "compile_s" in r else ""
            print(f"{r['site']:24s} first {r['first_ms']:7.1f} ms, then {after:6.1f} ms a call; "
                  f"writes {', '.join(r['writes'])}{compiled}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
