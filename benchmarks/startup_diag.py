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

``warm``: after an entry of ``--backend`` (default aoti; ``memory`` builds one) is in
``--cache-dir``, ``--runs`` fresh-process probes (the coldstart probe, empty framework
caches) of a warm start, each followed by an eager start, so the two share the
machine's state. Each run also says what the warm process left in its framework
caches (a Triton dir per kernel compiled or installed), and the output what the
entries' ``kernels/`` carry, so a recompile in the warm process shows.

``profile``: one warm ``artifactcache.load`` + first token of that entry under cProfile
in a fresh process with empty framework caches; the top functions by cumulative and
by own time go to ``--out``, the raw stats to ``--out`` + ``.pstats`` (for callers). It
says where a slow warm start's seconds go.

``tuning``: the same warm load, counting what Inductor's runtime does to its Triton
kernels there (autotune-cache checks and their hits, benchmarking, coordinate-descent
tuning, Triton compiles, tuning results saved; benchmarks/_tuning_child.py), JSON to
``--out``. ``--build`` counts a build instead; ``--framework-dir D`` keeps the framework
caches in D across runs (a second warm load after a first one, say).

``imports``: what a warm start imports beyond ``import torch``. Each scenario runs
``--runs`` times as a fresh ``python -X importtime`` process, interleaved: ``torch``
(``import torch`` alone, the floor), ``load`` (``artifactcache.load`` of the built entry
+ one generated token), ``cli`` (``acache run`` on a hit, one new token) and
``eager_load``. Per scenario: the summed import time, the part beyond the modules
``import torch`` itself loads (grouped by top package, ``torch.X`` for torch's own
subpackages), and which of the heavy modules (``NOT_ON_A_WARM_LOAD``) were imported.
The entry is built first (``acache build``; a hit returns at once). Runs on CPU too.

    python benchmarks/startup_diag.py weights llama-7b
    python benchmarks/startup_diag.py memory llama-7b --cache-dir C
    python benchmarks/startup_diag.py warm llama-7b --cache-dir C --runs 3
    python benchmarks/startup_diag.py warm llama-7b --backend inductor --cache-dir C --runs 2
    python benchmarks/startup_diag.py profile llama-7b --backend inductor --cache-dir C --out P
    python benchmarks/startup_diag.py tuning llama-7b --backend inductor --cache-dir C --out T
    python benchmarks/startup_diag.py imports llama-7b --device cuda --dtype bf16 --cache-dir C

Prints one JSON object on stdout. Needs a CUDA GPU, except ``imports``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from artifactcache.measure.coldstart import MODULES_AT_EXIT, NOT_ON_A_WARM_LOAD  # noqa: E402


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


def _tree(path: Path) -> dict[str, int]:
    """Bytes, files and top-level dirs under path (Triton: a dir per compiled kernel)."""
    files = [f for f in path.rglob("*") if f.is_file()] if path.is_dir() else []
    tops = [d for d in path.iterdir() if d.is_dir()] if path.is_dir() else []
    return {"bytes": sum(f.stat().st_size for f in files), "files": len(files), "dirs": len(tops)}


def warm(
    recipe_name: str, cache: Path, runs: int, backend: str = "aoti", mode: str | None = None,
    device: str = "cuda", dtype: str = "bf16",
) -> dict[str, Any]:  # fmt: skip
    from artifactcache.choices import BuildChoices
    from artifactcache.measure.coldstart import ProbeSpec, fresh_framework_dirs, spawn_probe

    keep = ("phases", "subphases", "compile", "memory", "backend_durations", "first_token",
            "runner_info", "steady")  # fmt: skip
    out: dict[str, list[dict[str, Any]]] = {backend: [], "eager": []}
    eager_cache = Path(tempfile.mkdtemp(prefix="acache-diag-eager-"))
    for _ in range(runs):
        for name, where in ((backend, cache), ("eager", eager_cache)):
            choices = BuildChoices(device=device, dtype=dtype,
                                   mode=mode if name == backend else None)  # fmt: skip
            spec = ProbeSpec(recipe_name, name, choices, iters=1)
            dirs = fresh_framework_dirs(Path(tempfile.mkdtemp(prefix="acache-diag-fw-")))
            r = spawn_probe(spec, where, env_dirs=dirs)
            row = {k: r.get(k) for k in keep}
            if isinstance(row.get("steady"), dict):
                row["steady"] = {k: v for k, v in row["steady"].items() if k != "tokens"}
            # What the warm process left in its (empty at start) framework caches: a
            # Triton dir per kernel it compiled or was given by the entry.
            row["framework_after"] = {var: _tree(d) for var, d in dirs.items()}
            out[name].append(row)
            # One line per run as it ends, so a run cut by a time limit keeps the others.
            print(json.dumps({"run": name, **row}), flush=True)
    out["entry_kernels"] = {
        str(e.relative_to(cache)): {"all": _tree(e), "triton": _tree(e / "triton")}
        for e in cache.rglob("kernels") if e.is_dir()
    }  # fmt: skip
    return out


PROFILE_CHILD = (
    "import cProfile, pstats, io, sys, time\n"
    "recipe, backend, mode, cache, out, device, dtype = sys.argv[1:8]\n"
    "t0 = time.perf_counter()\n"
    "import torch, artifactcache\n"
    "from artifactcache.recipes import load_recipe\n"
    "t1 = time.perf_counter()\n"
    "prof = cProfile.Profile()\n"
    "prof.enable()\n"
    "r = artifactcache.load(recipe, backend=backend, device=device, dtype=dtype,\n"
    "                       mode=mode or None, cache_dir=cache, build_on_miss=False)\n"
    "r.generate(list(load_recipe(recipe).bench.prompt_ids), 1)\n"
    "torch.cuda.synchronize() if device.startswith('cuda') else None\n"
    "prof.disable()\n"
    "t2 = time.perf_counter()\n"
    "prof.dump_stats(out + '.pstats')\n"
    "s = io.StringIO()\n"
    "st = pstats.Stats(prof, stream=s)\n"
    "st.sort_stats('cumulative').print_stats(80)\n"
    "st.sort_stats('tottime').print_stats(50)\n"
    "head = f'imports {t1 - t0:.2f} s, load + 1 token {t2 - t1:.2f} s\\n'\n"
    "open(out, 'w').write(head + s.getvalue())\n"
)


def tuning(
    recipe_name: str, cache: Path, backend: str, mode: str | None, out: Path,
    device: str = "cuda", dtype: str = "bf16", framework: Path | None = None,
    action: str = "load",
) -> dict[str, Any]:  # fmt: skip
    """One warm load + first token (or, action "build", a build) in a fresh process,
    counting the autotune-cache checks, tuning, saved tuning results and Triton
    compiles it makes (benchmarks/_tuning_child.py). Its framework caches are empty,
    or those under ``framework``, kept from an earlier run."""
    from artifactcache.measure.coldstart import FRAMEWORK_CACHE_VARS, fresh_framework_dirs

    if framework is not None and framework.is_dir():
        dirs = {var: framework / var.lower() for var in FRAMEWORK_CACHE_VARS}
    else:
        dirs = fresh_framework_dirs(framework or Path(tempfile.mkdtemp(prefix="acache-diag-fw-")))
    env = {**os.environ, **{var: str(d) for var, d in dirs.items()}}
    child = REPO / "benchmarks" / "_tuning_child.py"
    cmd = [sys.executable, str(child), recipe_name, backend, mode or "", str(cache), str(out),
           device, dtype, action]  # fmt: skip
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=REPO)
    counts = json.loads(out.read_text()) if out.is_file() else {}
    return {
        "rc": proc.returncode,
        "stderr_tail": proc.stderr[-2000:],
        **counts,
        "framework_after": {var: _tree(d) for var, d in dirs.items()},
    }


def profile(
    recipe_name: str, cache: Path, backend: str, mode: str | None, out: Path,
    device: str = "cuda", dtype: str = "bf16",
) -> dict[str, Any]:  # fmt: skip
    """One warm load + first token under cProfile, framework caches empty."""
    from artifactcache.measure.coldstart import fresh_framework_dirs

    dirs = fresh_framework_dirs(Path(tempfile.mkdtemp(prefix="acache-diag-fw-")))
    env = {**os.environ, **{var: str(d) for var, d in dirs.items()}}
    cmd = [sys.executable, "-c", PROFILE_CHILD, recipe_name, backend, mode or "", str(cache),
           str(out), device, dtype]  # fmt: skip
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=REPO)
    return {
        "rc": proc.returncode,
        "stderr_tail": proc.stderr[-2000:],
        "profile": str(out),
        "framework_after": {var: _tree(d) for var, d in dirs.items()},
    }


# Each scenario's child writes sys.modules at exit to argv[1]: `-X importtime` does not
# log a module imported with importlib.import_module (the backends are), so the heavy
# check reads sys.modules, and such a module's own body time is missing from the sums.
LOAD_CHILD = MODULES_AT_EXIT + (
    "import artifactcache\n"
    "from artifactcache.recipes import load_recipe\n"
    "recipe, backend, device, dtype, cache = sys.argv[1:6]\n"
    "r = artifactcache.load(recipe, backend=backend, device=device, dtype=dtype,\n"
    "                       cache_dir=cache, build_on_miss=False)\n"
    "r.generate(list(load_recipe(recipe).bench.prompt_ids), 1)\n"
)
CLI_CHILD = MODULES_AT_EXIT + (
    "import runpy\n"
    "sys.argv[0] = 'acache'\n"
    "runpy.run_module('artifactcache.cli', run_name='__main__')\n"
)


def import_times(stderr: str) -> dict[str, int]:
    """``-X importtime`` output -> {module: self microseconds}."""
    out: dict[str, int] = {}
    for line in stderr.splitlines():
        if line.startswith("import time:") and "self [us]" not in line:
            self_us, _, name = line.removeprefix("import time:").split("|")
            out[name.strip()] = int(self_us)
    return out


def _group(module: str) -> str:
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "torch" else parts[0]


def _importtime(code: str, args: list[str], env: dict[str, str]) -> tuple[dict[str, int], set[str]]:
    """(self microseconds per logged module, sys.modules at exit) of one fresh process."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "modules.json"
        p = subprocess.run([sys.executable, "-X", "importtime", "-c", code, str(out), *args],
                           capture_output=True, text=True, env=env)  # fmt: skip
        if p.returncode != 0:
            raise SystemExit(f"error: {' '.join(args)[:200]} failed: {p.stderr.strip()[-500:]}")
        return import_times(p.stderr), set(json.loads(out.read_text()))


def imports(recipe_name: str, cache: Path, runs: int, device: str, dtype: str) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    common = ["--device", device, "--dtype", dtype, "--cache-dir", str(cache)]
    cli = [sys.executable, "-m", "artifactcache.cli"]
    for backend in ("aoti", "eager"):
        subprocess.run([*cli, "build", recipe_name, "--backend", backend, *common], check=True,
                       env=env, stdout=subprocess.DEVNULL)  # fmt: skip
    scenarios = {
        "torch": (MODULES_AT_EXIT + "import torch\n", []),
        "load": (LOAD_CHILD, [recipe_name, "aoti", device, dtype, str(cache)]),
        "cli": (CLI_CHILD, ["run", recipe_name, "--backend", "aoti", *common,
                            "--new-tokens", "1"]),
        "eager_load": (LOAD_CHILD, [recipe_name, "eager", device, dtype, str(cache)]),
    }  # fmt: skip
    seen: dict[str, list[dict[str, int]]] = {k: [] for k in scenarios}
    loaded: dict[str, set[str]] = {}
    for _ in range(runs):
        for name, (code, args) in scenarios.items():
            times, modules = _importtime(code, args, env)
            seen[name].append(times)
            loaded[name] = modules
    floor = set().union(*seen["torch"], loaded["torch"])
    out: dict[str, Any] = {
        "device": device, "dtype": dtype, "runs": runs, "heavy_checked": NOT_ON_A_WARM_LOAD,
    }  # fmt: skip
    for name, per_run in seen.items():
        beyond = [{m: us for m, us in r.items() if m not in floor} for r in per_run]
        groups: dict[str, list[int]] = {}
        for r in beyond:
            summed: dict[str, int] = {}
            for m, us in r.items():
                summed[_group(m)] = summed.get(_group(m), 0) + us
            for g, us in summed.items():
                groups.setdefault(g, []).append(us)
        top = sorted(groups.items(), key=lambda kv: -statistics.median(kv[1]))[:15]
        out[name] = {
            "import_s": [round(sum(r.values()) / 1e6, 3) for r in per_run],
            "beyond_torch_s": [round(sum(r.values()) / 1e6, 3) for r in beyond],
            "beyond_torch_modules": len(beyond[0]),
            "beyond_torch_top_ms": {g: round(statistics.median(v) / 1e3, 1) for g, v in top},
            "heavy_imported": sorted(m for m in NOT_ON_A_WARM_LOAD if m in loaded[name]),
        }
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("what", choices=("weights", "memory", "warm", "imports", "profile", "tuning"))
    p.add_argument("recipe")
    p.add_argument("--cache-dir", type=Path, default=None, help="default: a fresh temp dir")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--device", default="cuda", help="imports, warm, profile (the others: cuda)")
    p.add_argument("--dtype", default="bf16", help="imports, warm, profile")
    p.add_argument("--backend", default="aoti", help="warm, profile, tuning")
    p.add_argument("--mode", default=None, help="warm, profile, tuning: the backend's mode")
    p.add_argument("--out", type=Path, default=Path("load.prof.txt"),
                   help="profile's text, tuning's JSON")  # fmt: skip
    p.add_argument(
        "--framework-dir",
        type=Path,
        default=None,
        help="tuning: framework cache dirs to keep (made empty if absent)",
    )
    p.add_argument("--build", action="store_true", help="tuning: count a build, not a load")
    a = p.parse_args()
    cache = (a.cache_dir or Path(tempfile.mkdtemp(prefix="acache-diag-"))).resolve()
    if a.what == "weights":
        result = weights(a.recipe)
    elif a.what == "memory":
        result = memory(a.recipe, cache)
    elif a.what == "imports":
        result = imports(a.recipe, cache, a.runs, a.device, a.dtype)
    elif a.what == "tuning":
        result = tuning(a.recipe, cache, a.backend, a.mode, a.out.resolve(), a.device, a.dtype,
                        a.framework_dir, "build" if a.build else "load")  # fmt: skip
    elif a.what == "profile":
        result = profile(a.recipe, cache, a.backend, a.mode, a.out.resolve(), a.device, a.dtype)
    else:
        result = warm(a.recipe, cache, a.runs, a.backend, a.mode, a.device, a.dtype)
    print(json.dumps({"what": a.what, "recipe": a.recipe, **result}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
