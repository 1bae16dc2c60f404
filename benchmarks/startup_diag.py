"""Where a warm start's "weights" segment and a cold aoti build's memory go, on a GPU.

``weights``: a warm llama-7b aoti start spent 3.24 s between "CUDA context ready"
and "weights ready", materializing seeded random weights that are ~13.5 GB of
writes (a few ms of bandwidth). Where does it go? Times, each device-synchronized,
in a fresh process: the meta-device construction, ``to_empty`` (the allocations),
the seeded ``normal_`` fills, and ``setup_caches``; then the same again in the same
process, which separates first-use costs (kernel loading, allocator growth) from
steady ones.

``memory``: the cold aoti process still peaked at ~2x the weights (27.5 GB
allocated for 13.5 GB of weights) after export's module-level map was cleared.
Which step allocates it? ``torch.export.export`` and
``torch._inductor.aoti_compile_and_package`` are wrapped to record the allocated and
peak device memory around each call during ``api.build``, then the same after the
build returns and after a load. Also counts model instances still alive after the
build, and names what refers to one.

``warm``: after ``memory`` built the aoti entry into ``--cache-dir``, ``--runs``
fresh-process probes (the coldstart probe, empty framework caches) of a warm aoti
start, each followed by an eager start, so the two share the machine's state.

    python benchmarks/startup_diag.py weights llama-7b
    python benchmarks/startup_diag.py memory llama-7b --cache-dir C
    python benchmarks/startup_diag.py warm llama-7b --cache-dir C --runs 3

Prints one JSON object on stdout. Needs a CUDA GPU.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _timed(fn: Any, sync: Any) -> float:
    t0 = time.perf_counter()
    fn()
    sync()
    return round(time.perf_counter() - t0, 4)


def _materialize_once(recipe: Any, dev: Any, sync: Any) -> dict[str, Any]:
    """build_model's steps for random weights, each timed on its own."""
    import torch

    from artifactcache.models import architecture
    from artifactcache.models.weights import init_random

    t0 = time.perf_counter()
    with torch.device("meta"):
        m = architecture(recipe).to(torch.bfloat16)
    r = {"meta_s": round(time.perf_counter() - t0, 4)}
    r["to_empty_s"] = _timed(lambda: m.to_empty(device=dev), sync)
    # In the run docs/benchmarks.md shows (2026-12-01 04:46 UTC), this timed
    # Module.to_empty, the path build_model used until that day. init_random now materializes with
    # weights.materialize, so fill_s below also includes a second allocation of the
    # weights; both were measured before that change, as recorded.
    r["fill_s"] = _timed(lambda: init_random(m, 0, dev, torch.bfloat16), sync)
    shapes = recipe.shapes
    r["setup_caches_s"] = _timed(lambda: m.setup_caches(shapes.max_batch, shapes.max_seq_len), sync)
    r["param_tensors"] = sum(1 for _ in m.parameters())
    r["param_bytes"] = sum(p.numel() * p.element_size() for p in m.parameters())
    return r


def weights(recipe_name: str) -> dict[str, Any]:
    import torch

    from artifactcache.recipes import load_recipe

    recipe = load_recipe(recipe_name)
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # cpu: a script check
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    out: dict[str, Any] = {"context_s": _timed(lambda: torch.empty(1, device=dev), sync)}
    for round_ in ("first", "second"):
        out[round_] = _materialize_once(recipe, dev, sync)
        gc.collect()
        if dev.type == "cuda":
            torch.cuda.empty_cache()  # the next round pays cudaMalloc again, as a new process
    return out


def memory(recipe_name: str, cache: Path) -> dict[str, Any]:
    import torch
    import torch._inductor

    from artifactcache import api

    events: list[dict[str, Any]] = []

    def mark(what: str) -> None:
        torch.cuda.synchronize()
        events.append(
            {
                "at": what,
                "allocated_gib": round(torch.cuda.memory_allocated() / 2**30, 2),
                "peak_since_last_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2),
            }
        )
        torch.cuda.reset_peak_memory_stats()

    def wrap(owner: Any, name: str) -> None:
        orig = getattr(owner, name)

        def wrapper(*a: Any, **k: Any) -> Any:
            mark(f"before {name}")
            r = orig(*a, **k)
            mark(f"after {name}")
            return r

        setattr(owner, name, wrapper)

    wrap(torch.export, "export")
    wrap(torch._inductor, "aoti_compile_and_package")
    common = {"device": "cuda", "dtype": "bf16", "cache_dir": cache}
    mark("start")
    api.build(recipe_name, "aoti", **common)
    mark("build returned")
    gc.collect()
    mark("after gc")
    alive = [
        o for o in gc.get_objects() if isinstance(o, torch.nn.Module) and hasattr(o, "setup_caches")
    ]
    holders = []
    for o in alive[:1]:
        for ref in gc.get_referrers(o):
            if ref is alive:
                continue
            keys = f" keys={list(ref)[:8]}" if isinstance(ref, dict) else ""
            holders.append(type(ref).__name__ + keys)
    n_alive = len(alive)
    del alive
    runner = api.load(recipe_name, "aoti", build_on_miss=False, **common)
    mark("loaded")
    del runner
    return {"events": events, "models_alive_after_build": n_alive, "holders": holders[:20]}


def warm(recipe_name: str, cache: Path, runs: int) -> dict[str, Any]:
    from artifactcache.measure.coldstart import ProbeSpec, fresh_framework_dirs, spawn_probe

    keep = ("phases", "subphases", "compile", "memory", "backend_durations", "first_token")
    out: dict[str, list[dict[str, Any]]] = {"aoti": [], "eager": []}
    eager_cache = Path(tempfile.mkdtemp(prefix="acache-diag-eager-"))
    for _ in range(runs):
        for backend, where in (("aoti", cache), ("eager", eager_cache)):
            spec = ProbeSpec(recipe_name, backend, "cuda", "bf16", iters=1)
            dirs = fresh_framework_dirs(Path(tempfile.mkdtemp(prefix="acache-diag-fw-")))
            r = spawn_probe(spec, where, env_dirs=dirs)
            out[backend].append({k: r.get(k) for k in keep})
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("what", choices=("weights", "memory", "warm"))
    p.add_argument("recipe")
    p.add_argument("--cache-dir", type=Path, default=None, help="default: a fresh temp dir")
    p.add_argument("--runs", type=int, default=3)
    a = p.parse_args()
    cache = (a.cache_dir or Path(tempfile.mkdtemp(prefix="acache-diag-"))).resolve()
    if a.what == "weights":
        result = weights(a.recipe)
    elif a.what == "memory":
        result = memory(a.recipe, cache)
    else:
        result = warm(a.recipe, cache, a.runs)
    print(json.dumps({"what": a.what, "recipe": a.recipe, **result}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
