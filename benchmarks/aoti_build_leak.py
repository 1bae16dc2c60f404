"""Who keeps an aoti build's weight tensors alive? (the cold-start 2x peak)

On the H200 with torch 2.11.0+cu130, 12.8 GiB (llama-7b's weights) stay allocated
after ``api.build(..., "aoti", device="cuda")`` returns, with no model object alive
(docs/perf-notes.md, "The cold aoti peak, measured again"). On CPU with torch 2.11
and 2.13 the same build leaves none of the 27 parameters/buffers of tiny-llama alive,
so the holder is on a CUDA-only path. Not yet run on a GPU (no device time was
left); this is the next session's first diagnostic.

It takes a weak reference to every parameter and buffer of the model the build
creates and notes its storage address, then after the build:

1. counts those still alive and the allocated device memory;
2. on CUDA (allocation history recorded from the start), lists the largest blocks
   still allocated, whether each is one of the model's storages, and the Python
   frames that allocated it: this also catches storage kept through an alias or from
   C++, which weak references to the Parameter objects miss;
3. for up to two surviving tensors, walks ``gc.get_referrers`` back to a module
   global and prints the chain (or says there is none: then C++ holds them);
4. clears candidate caches one at a time (Inductor's PyCodeCache and compiled Triton
   kernels, ``torch._inductor.utils.clear_caches``, ``torch._dynamo.reset``) and
   prints what is still alive after each, which names the fix.

    python benchmarks/aoti_build_leak.py --device cuda --recipe tiny-llama
    python benchmarks/aoti_build_leak.py --device cpu   # a check of the script
"""

from __future__ import annotations

import argparse
import gc
import sys
import tempfile
import types
import weakref
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _chain_to_global(t: Any, skip: set[int], limit: int = 50_000) -> list[str]:
    """Referrer chain from ``t`` to a module's globals, breadth first."""
    module_dicts = {
        id(m.__dict__): m.__name__
        for m in list(sys.modules.values())
        if isinstance(m, types.ModuleType) and m.__name__ != "__main__"
    }
    seen = {id(t)} | skip
    frontier: list[tuple[Any, list[str]]] = [(t, [])]
    while frontier:
        nxt: list[tuple[Any, list[str]]] = []
        skip.update({id(frontier), id(nxt)})
        for obj, path in frontier:
            for ref in gc.get_referrers(obj):
                if id(ref) in seen or isinstance(ref, types.FrameType):
                    continue
                seen.add(id(ref))
                if isinstance(ref, dict) and id(ref) in module_dicts:
                    names = [k for k, v in ref.items() if v is obj]
                    return [*path, f"GLOBAL {module_dicts[id(ref)]}.{names}"]
                what = type(ref).__qualname__
                if isinstance(ref, dict):
                    what += f" keys={list(ref)[:4]}"
                nxt.append((ref, [*path, what[:120]]))
        frontier = nxt
        if len(seen) > limit:
            return [*path, "gave up"]
    return ["no Python referrer chain to a module global: held from C++ (or untracked)"]


def _live_blocks(snapshot: dict[str, Any], storages: dict[int, str], top: int = 8) -> None:
    """The largest allocated blocks, whether they are model storages, and their frames."""
    blocks = [
        b
        for seg in snapshot.get("segments", [])
        for b in seg.get("blocks", [])
        if b.get("state") == "active_allocated"
    ]
    blocks.sort(key=lambda b: -b.get("size", 0))
    total = sum(b.get("size", 0) for b in blocks)
    ours = sum(b.get("size", 0) for b in blocks if b.get("address") in storages)
    print(f"live blocks: {len(blocks)}, {total / 2**30:.2f} GiB; model storages: "
          f"{ours / 2**30:.2f} GiB")  # fmt: skip
    for b in blocks[:top]:
        name = storages.get(b.get("address"), "not a model storage")
        print(f"  {b.get('size', 0) / 2**20:9.1f} MiB  {name}")
        frames = [f for f in b.get("frames", []) if f.get("filename", "").endswith(".py")]
        for f in frames[:6]:
            print(f"      {f.get('filename')}:{f.get('line')} {f.get('name')}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--recipe", default="tiny-llama")
    a = p.parse_args()

    import torch

    from artifactcache import api
    from artifactcache.backends import aoti

    refs: list[tuple[str, weakref.ref]] = []
    storages: dict[int, str] = {}  # data_ptr -> tensor name
    build_model_for = aoti.build_model_for

    def spy(ctx: Any, dev: Any) -> Any:
        model = build_model_for(ctx, dev)
        named = [*model.named_parameters(), *model.named_buffers()]
        refs.extend((n, weakref.ref(t)) for n, t in named)
        storages.update({t.untyped_storage().data_ptr(): n for n, t in named})
        return model

    aoti.build_model_for = spy
    cuda = a.device.startswith("cuda")
    if cuda:
        torch.cuda.memory._record_memory_history(max_entries=200_000)
    dtype = "bf16" if cuda else "fp32"
    api.build(a.recipe, "aoti", device=a.device, dtype=dtype, cache_dir=tempfile.mkdtemp())
    gc.collect()

    def report(when: str) -> None:
        alive = sum(r() is not None for _, r in refs)
        mib = torch.cuda.memory_allocated() / 2**20 if cuda else 0.0
        print(f"{when}: {alive}/{len(refs)} parameters/buffers alive, allocated {mib:.1f} MiB")

    print(f"torch {torch.__version__}, {a.recipe} on {a.device}")
    report("after build + gc")
    if cuda:
        _live_blocks(torch.cuda.memory._snapshot(), storages)
    survivors = [(n, r()) for n, r in refs if r() is not None][:2]
    for name, t in survivors:
        print(f"chain for {name} {tuple(t.shape)}:")
        for step in _chain_to_global(t, {id(survivors), id(refs)}):
            print("   <-", step)
    survivors = []  # type: ignore[assignment]
    t = None
    gc.collect()

    from torch._inductor import async_compile, codecache
    from torch._inductor import utils as inductor_utils

    clears = [
        ("PyCodeCache", lambda: codecache.PyCodeCache.cache_clear(purge=False)),
        ("CompiledTritonKernels", async_compile.CompiledTritonKernels.cache_clear),
        ("inductor clear_caches", inductor_utils.clear_caches),
        ("dynamo.reset", torch._dynamo.reset),
    ]
    for name, clear in clears:
        try:
            clear()
        except Exception as e:  # a cache this torch lacks: say so, try the next
            print(f"{name}: failed: {e}")
        gc.collect()
        report(f"after {name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
