"""Child of ``startup_diag.py tuning``: one warm load + first token, counting what
Inductor's runtime does to its Triton kernels in this process.

Wraps, before the load: the autotune-cache check each kernel makes when its module is
imported, the static autotuner's recheck of it on a cache load, benchmarking all of a
kernel's configs, coordinate-descent tuning, and Triton's cubin stage (one per kernel
Triton compiles here), and each autotune result it saves (where, and the configs hash).
Writes {what: {count, examples}} as JSON to argv[5], with the load's phase stamps
(seconds after the imports). With ``ACACHE_DIAG_DECODE_TOKENS=N``, after the counted
span, also the seed prompt's decode tok/s over N new tokens (3 timed requests after 1).
ACTION "build" builds the entry instead (``artifactcache.build``), counting the same
things in the building process.

    python benchmarks/_tuning_child.py RECIPE BACKEND MODE CACHE OUT [DEVICE DTYPE [ACTION]]
"""

from __future__ import annotations

import collections
import functools
import hashlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

recipe, backend, mode, cache, out = sys.argv[1:6]
device, dtype, action = (sys.argv[6:9] + ["cuda", "bf16", "load"][len(sys.argv[6:9]) :])[:3]
t0 = time.perf_counter()
# New tokens of a timed steady-state decode after the counted span; 0: none.
DECODE_TOKENS = int(os.environ.get("ACACHE_DIAG_DECODE_TOKENS", "0"))

import torch  # noqa: E402
import torch._inductor.runtime.autotune_cache as ac  # noqa: E402
import torch._inductor.runtime.triton_heuristics as th  # noqa: E402

import artifactcache  # noqa: E402
from artifactcache.backends.base import BuildContext  # noqa: E402
from artifactcache.recipes import load_recipe  # noqa: E402

seen: dict[str, list[Any]] = collections.defaultdict(list)
# Kept whole in the JSON: what a diagnosis compares across processes.
FULL = ("autotune_save", "benchmark_all_configs", "coordinate_descent_tuning",
        "triton_make_cubin", "triton_cache_lookup", "triton_cache_key")  # fmt: skip


def _name(self: Any) -> str:
    return str(self.inductor_meta.get("kernel_name") or getattr(self.fn, "__name__", "?"))


def wrap(owner: Any, attr: str, what: str, describe: Any) -> None:
    real = getattr(owner, attr)

    @functools.wraps(real)
    def wrapper(*a: Any, **k: Any) -> Any:
        result = real(*a, **k)
        seen[what].append(describe(a, k, result))
        return result

    setattr(owner, attr, wrapper)


wrap(th, "check_autotune_cache", "check_autotune_cache",
     lambda a, k, r: {"file": str(a[1]).rsplit("/", 2)[-2:] if a[1] else None,
                      "configs": len(a[0]), "state": r[2].get("autotune_cache_state")})  # fmt: skip
wrap(th.CachingAutotuner, "recheck_autotune_cache", "recheck_autotune_cache",
     lambda a, k, r: {"kernel": _name(a[0]), "state": a[0].autotune_cache_info.get(
         "autotune_cache_state")})  # fmt: skip


def _benchmarked(a: Any, k: Any, r: Any) -> dict[str, Any]:
    """Which kernel benchmarked its configs, and the autotune-cache file it would have
    read a winner from: was it there (installed from the entry), and was it looked up."""
    tuner = a[0]
    cache = getattr(getattr(tuner, "save_cache_hook", None), "__self__", None)
    local = getattr(cache, "local_cache", None) if cache else None
    path = Path(str(local[1])) if local else None
    return {"kernel": _name(tuner), "configs": len(r),
            "cache_info": {x: str(y) for x, y in (tuner.autotune_cache_info or {}).items()},
            "best_config": "/".join(path.parts[-2:]) if path else None,
            "best_config_exists": path.is_file() if path else None}  # fmt: skip


wrap(th.CachingAutotuner, "benchmark_all_configs", "benchmark_all_configs", _benchmarked)
wrap(th.CachingAutotuner, "_coordinate_descent_tuning", "coordinate_descent_tuning",
     lambda a, k, r: {"kernel": _name(a[0])})  # fmt: skip


def _saved(a: Any, k: Any, r: Any) -> dict[str, Any]:
    local = a[0].local_cache
    return {"at": str(local[1]).rsplit("/", 2)[-2:] if local else None,
            "configs_hash": a[0].configs_hash[:12],
            "coordesc": k.get("found_by_coordesc", a[3] if len(a) > 3 else None)}  # fmt: skip


wrap(ac.AutotuneCache, "save", "autotune_save", _saved)
try:
    from triton.backends.nvidia.compiler import CUDABackend

    def _cubin(a: Any, k: Any, r: Any) -> dict[str, Any]:
        return {"kernel": a[2].get("name") if isinstance(a[2], dict) else None}

    wrap(CUDABackend, "make_cubin", "triton_make_cubin", _cubin)
except ImportError:  # no CUDA Triton here: the count stays 0
    pass
try:  # each Triton cache lookup: its hash, and whether a finished kernel dir was there
    import triton.compiler.compiler as tcc

    _real_manager = tcc.get_cache_manager

    def _manager(key: str) -> Any:
        m = _real_manager(key)
        d = Path(getattr(m, "cache_dir", "") or "")
        found = d.is_dir() and any(f.suffix == ".json" for f in d.iterdir())
        seen["triton_cache_lookup"].append({"hash": key, "state": "hit" if found else "miss"})
        return m

    tcc.get_cache_manager = _manager
    _real_key = tcc.get_cache_key

    def _key(src: Any, backend: Any, options: Any, env_vars: Any) -> Any:
        """What a Triton cache key is made of, per kernel: which part differs between
        the build and a warm process that misses."""
        key = _real_key(src, backend, options, env_vars)
        seen["triton_cache_key"].append({
            "kernel": getattr(src, "name", None), "src": src.hash()[:16],
            "backend": hashlib.sha256(backend.hash().encode()).hexdigest()[:16],
            "backend_tail": backend.hash()[-60:], "options": options.hash()[:16],
            "ptxas_env": os.environ.get("TRITON_PTXAS_PATH"),
            "key_sha": hashlib.sha256(key.encode()).hexdigest(),
            "env": sorted(env_vars.items()), "attrs": str(getattr(src, "attrs", None))[:300],
            "signature": str(getattr(src, "signature", None))[:300],
        })  # fmt: skip
        return key

    tcc.get_cache_key = _key
except (ImportError, AttributeError):
    pass

t1 = time.perf_counter()
if action == "build":
    artifactcache.build(recipe, backend, device=device, dtype=dtype, mode=mode or None,
                        cache_dir=cache)  # fmt: skip
else:
    ctx = BuildContext(recipe=None, opts=None, weights=None)  # type: ignore[arg-type]
    r = artifactcache.load(recipe, backend=backend, device=device, dtype=dtype,
                           mode=mode or None, cache_dir=cache, build_on_miss=False,
                           context=ctx)  # fmt: skip
    phases = {k: round(v - t1, 3) for k, v in ctx.phases.items()}
    seed = list(load_recipe(recipe).bench.prompt_ids)
    tokens = r.generate(seed, 1)
if device.startswith("cuda"):
    torch.cuda.synchronize()
t2 = time.perf_counter()
decode: dict[str, Any] = {}
if action != "build":  # after the timed span: whether warm processes agree on tokens
    tokens += r.generate(seed, 32, eos_token_ids=())
    if DECODE_TOKENS:  # steady-state decode, as acache bench counts it (seed prompt)
        from artifactcache.measure.child.timing import measure_requests

        dev = torch.device(device)
        d = measure_requests(r, [seed], DECODE_TOKENS, iters=3, warmup=1, device=dev)
        decode = {k: d[k] for k in ("new_tokens", "iters", "decode_tok_s", "request_median_s")}
summary = {
    "tokens": tokens if action != "build" else None,
    "imports_s": round(t1 - t0, 2),
    "action": action,
    "seconds": round(t2 - t1, 2),
    "load_phases_s": phases if action != "build" else None,
    "decode": decode,
    **{
        what: {
            "count": len(rows),
            "states": dict(collections.Counter(str(x.get("state")) for x in rows)),
            "examples": rows if what in FULL else rows[:8],
        }
        for what, rows in seen.items()
    },
}
with open(out, "w") as f:
    json.dump(summary, f, indent=1, default=str)
