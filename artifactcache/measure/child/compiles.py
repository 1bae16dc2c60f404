"""What a measured process compiled and tuned, from torch's and Triton's own counters.

A warm start should compile nothing: no graph through Inductor, no Triton kernel, no
kernel benchmarked for tuning. The probe reports each count so ``coldstart`` can flag a
"warm" process that did any of it.

- Graphs: Inductor's FX graph cache ``fxgraph_cache_miss`` and ``_bypass`` count graphs
  compiled from scratch; a hit replays a cached graph (and even replays
  ``generated_kernel_count``, so that metric cannot tell a hit from a compile). Dynamo
  tracing alone is not compilation: a warm ``torch.compile`` still traces, then hits.
- Triton kernels: Triton's compile hook (``triton.knobs.compilation.listener``) reports
  each compile with whether its cache held the binary. It sees this process only;
  Inductor hands kernels to its worker processes when it generates code, which is a
  graph compile counted above.
- Tuning: Inductor counts each kernel timing it runs (``benchmarking.*``: a candidate
  config benchmarked, a coordinate-descent step) and each coordinate-descent benchmark.
- AOTInductor's ``compile_and_package`` leaves these counters untouched, so an entry
  built in this process by any backend but eager counts as compiled too.
"""

from __future__ import annotations

import sys
from typing import Any

_triton: dict[str, int] = {"compiled": 0, "cache_hits": 0}
_watching = False


def watch_triton_compiles() -> bool:
    """Count this process's Triton compiles from here on (imports triton: call it only
    where the load imports it anyway). False where this Triton has no compile hook."""
    global _watching
    try:
        from triton import knobs
    except ImportError:
        return False
    compilation = getattr(knobs, "compilation", None)
    if compilation is None or not hasattr(compilation, "listener"):
        return False
    before = compilation.listener

    def listener(*args: Any, cache_hit: bool = False, **kwargs: Any) -> None:
        _triton["cache_hits" if cache_hit else "compiled"] += 1
        if before is not None:
            before(*args, cache_hit=cache_hit, **kwargs)

    compilation.listener = listener
    _watching = True
    return True


def compile_report(backend: str, built: bool) -> dict[str, Any]:
    """This process's compile and tuning counts (see the module doc); ``compiled`` says
    whether it did any of it."""
    out: dict[str, Any] = {
        "dynamo_imported": "torch._dynamo" in sys.modules,
        "inductor_imported": "torch._inductor" in sys.modules,
    }
    utils = sys.modules.get("torch._dynamo.utils")
    counters = getattr(utils, "counters", None) if utils else None
    ind = dict(counters.get("inductor", {})) if counters else {}
    aot = dict(counters.get("aot_autograd", {})) if counters else {}
    stats = dict(counters.get("stats", {})) if counters else {}
    out.update(
        fxgraph_cache_miss=int(ind.get("fxgraph_cache_miss", 0)),
        fxgraph_cache_hit=int(ind.get("fxgraph_cache_hit", 0)),
        fxgraph_cache_bypass=int(ind.get("fxgraph_cache_bypass", 0)),
        autograd_cache_miss=int(aot.get("autograd_cache_miss", 0)),
        autograd_cache_hit=int(aot.get("autograd_cache_hit", 0)),
        dynamo_unique_graphs=int(stats.get("unique_graphs", 0)),
        kernel_benchmarks=sum(int(v) for k, v in ind.items() if k.startswith("benchmarking.")),
        coordesc_benchmarks=int(ind.get("coordesc_tuning_bench", 0)),
        # None: not counted (no hook in this Triton, or a backend that never loads it).
        triton_compiles=_triton["compiled"] if _watching else None,
        triton_cache_hits=_triton["cache_hits"] if _watching else None,
    )
    out["inductor_codegen"] = out["fxgraph_cache_miss"] + out["fxgraph_cache_bypass"] > 0
    out["built_here"] = built
    out["tuned"] = out["kernel_benchmarks"] + out["coordesc_benchmarks"] > 0
    out["compiled"] = (
        out["inductor_codegen"]
        or bool(out["triton_compiles"])
        or out["tuned"]
        or (built and backend != "eager")
    )
    return out
