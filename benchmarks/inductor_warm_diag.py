"""Why a warm inductor process still compiles and tunes (issue 31), on a GPU.

Builds ``RECIPE``'s inductor entry in a fresh process, then loads it in ``--warm``
fresh processes with empty framework caches, each counted by benchmarks/_tuning_child.py
(Triton cache lookups by hash, kernels benchmarked with the autotune file each would
have read, coordinate-descent runs, cubins compiled). Then compares:

- each Triton cache miss of a warm process with the kernel dirs the entry carries and
  the dirs the build's Triton cache held (is the binary missing from the entry, or
  asked for under another key?);
- each kernel a warm process benchmarked with the ``.best_config`` files the entry
  carries (not carried, or carried and not read?);
- the greedy tokens of the warm processes (do they agree?).

The build and the warm processes run with ``TORCHINDUCTOR_COMPILE_THREADS=1`` (unless
``--compile-threads`` says otherwise) so every compile happens in the counted process;
each warm miss is compared, part by part (source, backend, options, env, attrs,
signature, ptxas, the key's sha), with the build's compiles of the
same kernel name. Writes ``OUT/summary.json`` and each child's JSON.

    python benchmarks/inductor_warm_diag.py llama-7b --out OUT [--warm 2]
    ACACHE_DIAG_DECODE_TOKENS=200 python benchmarks/inductor_warm_diag.py ...  # + decode
    ACACHE_INDUCTOR_WARM_PATH=aot_compile python benchmarks/inductor_warm_diag.py ...
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

from startup_diag import tuning  # noqa: E402


def _entry_files(cache: Path) -> tuple[set[str], set[str]]:
    """The Triton kernel dir names and the ``<xx>/<key>.best_config`` paths the
    inductor entries under ``cache`` carry."""
    triton, best = set(), set()
    for kernels in cache.rglob("kernels"):
        if not kernels.is_dir():
            continue
        if (kernels / "triton").is_dir():
            triton |= {d.name for d in (kernels / "triton").iterdir() if d.is_dir()}
        best |= {"/".join(f.parts[-2:]) for f in kernels.rglob("*.best_config")}
    return triton, best


def _rows(child: dict[str, Any], what: str) -> list[dict[str, Any]]:
    return (child.get(what) or {}).get("examples") or []


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("recipe")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--warm", type=int, default=2)
    p.add_argument("--mode", default=None)
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default="bf16")
    p.add_argument("--compile-threads", default="1",
                   help="TORCHINDUCTOR_COMPILE_THREADS; '' leaves Inductor's workers")  # fmt: skip
    a = p.parse_args()
    out = a.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    cache = Path(tempfile.mkdtemp(prefix="acache-warm-diag-"))
    fw_build = Path(tempfile.mkdtemp(prefix="acache-warm-diag-fw-"))
    if a.compile_threads:
        # Every compile in the counted process, the build's too: its keys are compared below.
        os.environ["TORCHINDUCTOR_COMPILE_THREADS"] = a.compile_threads
    build = tuning(a.recipe, cache, "inductor", a.mode, out / "build-child.json",
                   a.device, a.dtype, framework=fw_build, action="build")  # fmt: skip
    (out / "build.json").write_text(json.dumps(build, indent=1))
    if build["rc"] != 0:
        print(json.dumps({"build_failed": build["stderr_tail"]}))
        return 1
    build_triton = {
        d.name for d in (fw_build / "triton_cache_dir").iterdir() if d.is_dir()
    } if (fw_build / "triton_cache_dir").is_dir() else set()  # fmt: skip
    entry_triton, entry_best = _entry_files(cache)
    build_keys: dict[str, list[dict[str, Any]]] = {}
    for r in _rows(json.loads((out / "build-child.json").read_text()), "triton_cache_key"):
        build_keys.setdefault(str(r["kernel"]), []).append(r)
    summary: dict[str, Any] = {
        "recipe": a.recipe,
        "build_s": build.get("seconds"),
        "entry_triton_dirs": len(entry_triton),
        "entry_best_configs": len(entry_best),
        "build_triton_dirs": len(build_triton),
        "build_triton_dirs_not_in_entry": sorted(build_triton - entry_triton)[:50],
        "warm": [],
    }
    tokens = []
    for i in range(a.warm):
        w = tuning(
            a.recipe, cache, "inductor", a.mode, out / f"warm-{i}-child.json", a.device, a.dtype
        )
        (out / f"warm-{i}.json").write_text(json.dumps(w, indent=1))
        misses = [r["hash"] for r in _rows(w, "triton_cache_lookup") if r["state"] == "miss"]
        bench = _rows(w, "benchmark_all_configs")
        lookups = _rows(w, "triton_cache_lookup")
        keys = _rows(w, "triton_cache_key")  # in step with the lookups: one each per compile
        differs = []
        for k, look in zip(keys, lookups, strict=False):
            if look["state"] != "miss":
                continue
            built = build_keys.get(str(k["kernel"]), [])
            parts = ("src", "backend", "options", "env", "attrs", "signature", "key_sha")
            differs.append({
                "kernel": k["kernel"], "build_compiles_of_it": len(built),
                "warm_ptxas": f"{k.get('ptxas_env')} | {k.get('backend_tail')}",
                "build_ptxas": sorted(
                    {f"{b.get('ptxas_env')} | {b.get('backend_tail')}" for b in built}
                ),
                "parts_differing_from_each": [[p for p in parts if b[p] != k[p]] for b in built],
            })  # fmt: skip
        tokens.append(w.get("tokens"))
        summary["warm"].append({
            "rc": w["rc"],
            "seconds": w.get("seconds"),
            "imports_s": w.get("imports_s"),
            "load_phases_s": w.get("load_phases_s"),
            "decode": w.get("decode"),
            "triton_lookups": len(_rows(w, "triton_cache_lookup")),
            "triton_misses": len(misses),
            "misses_in_entry": sum(h in entry_triton for h in misses),
            "misses_in_build_cache": sum(h in build_triton for h in misses),
            "cubins_compiled": (w.get("triton_make_cubin") or {}).get("count", 0),
            "cubin_kernels": sorted({str(r.get("kernel")) for r in _rows(w, "triton_make_cubin")}),
            "benchmarked": [
                {**r, "best_config_in_entry": r.get("best_config") in entry_best} for r in bench
            ],
            "coordinate_descent": [r["kernel"] for r in _rows(w, "coordinate_descent_tuning")],
            "misses_against_the_build": differs,
            "static_rechecks": (w.get("recheck_autotune_cache") or {}).get("states"),
            "autotune_lookups": (w.get("check_autotune_cache") or {}).get("states"),
        })  # fmt: skip
        summary["tokens_agree"] = all(t == tokens[0] for t in tokens)
        (out / "summary.json").write_text(json.dumps(summary, indent=1))  # kept if cut short
    summary["tokens_agree"] = all(t == tokens[0] for t in tokens) if tokens else None
    summary["tokens"] = tokens
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps({k: v for k, v in summary.items() if k != "tokens"}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
