"""GPU evidence for "a checkpoint on disk": a Llama-2-7B-shaped folder, the folder path, aoti.

In one call:

1. **write** a checkpoint with random bf16 weights as Hugging Face writes one: four
   ``model-0000i-of-00004.safetensors`` shards, ``model.safetensors.index.json`` and a
   ``config.json`` (model_type llama, llama-7b's dims, max_position_embeddings 4096);
   reused when the folder already holds the same one;
2. **loader sweep** (in this process, the files in the page cache): seconds and GB/s of
   safetensors' ``safe_open`` per tensor (what acache did before) against the threaded
   loader at several thread counts x chunk sizes;
3. **build** through the folder path, ``acache build DIR --backend aoti --device cuda
   --dtype bf16 --max-seq-len 256``, and the keys of the three spellings (the folder, the
   TOML saved from it, ``llama-7b --weights DIR``): do they share the entry?
4. **fresh processes** (the probe of ``acache bench``/``coldstart``, framework caches
   empty, weights in the page cache): per run the phases (imports, lookup, compiler
   imports (inductor), CUDA context, weights as s and GB/s, artifact, first token), time
   to first token against "imports + 2.5 s", and decode tok/s, for the folder path (a
   TOML saved from the folder with the recipe's prompt ids: a folder has none) and for
   the recipe path.

Writes OUT/checkpoint_folder.json and OUT/checkpoint_folder.md (date, machine, command).
The checkpoint writer and the loader sweep are in checkpoint_loading.py beside this file.

On the GPU machine (repo root), about 5 minutes with the aoti build:

    python benchmarks/checkpoint_folder.py --out OUT

On CPU, as a check of the script (tiny-llama shapes; --allow-build because a folder
derives prefill_len 16 where tiny-llama has 8, so the recipe path has its own key):

    python benchmarks/checkpoint_folder.py --tiny --device cpu --allow-build --out /tmp/cf

The loader alone, e.g. a 2 GB llama-7b-shaped checkpoint of 4 layers on CPU:

    python benchmarks/checkpoint_folder.py --loader-only --layers 4 --device cpu --out /tmp/cf
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from checkpoint_loading import (  # noqa: E402  (found through the line above)
    base_recipe,
    checkpoint_bytes,
    loader_sweep,
    parse_sweep,
    same_as_safe_open,
    warm_page_cache,
    write_checkpoint,
)

TARGET_OVER_IMPORTS_S = 2.5  # issue 31: first token <= imports + 2.5 s, 13.5 GB checkpoint
CUDA_SWEEP = "8x16,4x16,16x16,8x4,8x64"  # threads x chunk MiB
CPU_SWEEP = "1x16,2x16,8x16"


# --------------------------------------------------------- build, keys, probes --


def _env(cache: Path) -> dict[str, str]:
    from artifactcache.measure.coldstart import fresh_framework_dirs

    dirs = fresh_framework_dirs(Path(tempfile.mkdtemp(prefix="acache-ckpt-")))
    return {
        **os.environ,
        "ACACHE_DIR": str(cache),
        **{var: str(d) for var, d in dirs.items()},
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }


def cli(args: list[str], cache: Path) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "artifactcache.cli", *args, "--json"]
    t0 = time.perf_counter()
    out = subprocess.run(cmd, env=_env(cache), capture_output=True, text=True)
    wall = round(time.perf_counter() - t0, 2)
    if out.returncode != 0:
        err = (out.stderr.strip().splitlines() or ["no output"])[-1]
        return {"error": err, "command": shlex.join(cmd[2:]), "wall_s": wall}
    return {**json.loads(out.stdout), "command": shlex.join(cmd[2:]), "wall_s": wall}


def folder_toml(folder: Path, base: Any, out: Path) -> Path:
    """The recipe `acache recipe DIR` prints, at the base recipe's context and prompt ids.

    A folder has no prompt ids (no tokenizer here), and bench needs some; [bench] is
    not a key factor, so the TOML keeps the folder's key.
    """
    from artifactcache.recipes import load_recipe, recipe_to_toml

    derived = load_recipe(str(folder)).with_shapes(max_seq_len=base.shapes.max_seq_len)
    bench = dataclasses.replace(derived.bench, prompt_ids=tuple(base.bench.prompt_ids))
    path = out / "folder-recipe.toml"
    path.write_text(recipe_to_toml(dataclasses.replace(derived, bench=bench)))
    return path


def phases(result: dict[str, Any], nbytes: int) -> dict[str, Any]:
    """A probe's phases as the segments a warm start spends its time in."""
    p, sub = result["phases"], result.get("subphases", {})
    device_ready = sub.get("device_ready", p["entry_ready"])
    # inductor imports Inductor before it creates the context (compiler_ready); aoti none.
    compiler_ready = sub.get("compiler_ready", p["entry_ready"])
    weights_s = p["weights_ready"] - device_ready
    checked, allocated = sub.get("weights_checked"), sub.get("weights_allocated")
    split = {}
    if checked is not None and allocated is not None:
        split = {
            "weights_meta_and_headers_s": checked - device_ready,
            "weights_allocate_s": allocated - checked,
            "weights_read_s": p["weights_ready"] - allocated,  # with the KV cache's setup
        }
    return {
        **split,
        "built": bool(result.get("built")),
        "imports_s": p["imports_done"],
        "lookup_s": p["entry_ready"] - p["imports_done"],
        "compiler_imports_s": compiler_ready - p["entry_ready"],
        "context_s": device_ready - compiler_ready,
        "weights_s": weights_s,
        "weights_gbps": nbytes / weights_s / 1e9 if weights_s > 0 else None,
        "artifact_s": p["artifact_ready"] - p["weights_ready"],
        "first_token_s": p["first_result"] - p["artifact_ready"],
        "ttft_s": p["first_result"],
        "ttft_over_imports_s": p["first_result"] - p["imports_done"],
    }


def run_probes(
    spec: Any, cache: Path, runs: int, nbytes: int, recipe: Any, dtype: str
) -> dict[str, Any]:
    from artifactcache.errors import MeasureError
    from artifactcache.measure import bench
    from artifactcache.measure.coldstart import fresh_framework_dirs, spawn_probe

    results, rows = [], []
    for i in range(runs):
        dirs = fresh_framework_dirs(Path(tempfile.mkdtemp(prefix="acache-ckpt-probe-")))
        try:
            r = spawn_probe(spec, cache, env_dirs=dirs, timeout=900)
        except MeasureError as e:
            return {"error": str(e), "runs": rows}
        results.append(r)
        row = phases(r, nbytes)
        row["decode_tok_s"] = bench.summarize(recipe, dtype, [r])["decode_tok_s"]
        row["run"] = i + 1
        rows.append(row)
    pooled = bench.summarize(recipe, dtype, results)
    return {
        "runs": rows,
        "decode_tok_s": pooled["decode_tok_s"],
        "request_median_s": pooled["request_median_s"],
        "environment": results[0].get("environment"),
        "runner_info": results[0].get("runner_info"),
        "backend_durations": [r.get("backend_durations") for r in results],
    }


# --------------------------------------------------------------------- report --


def _f(x: Any, fmt: str = ".2f", unit: str = " s") -> str:
    return "–" if x is None else f"{x:{fmt}}{unit}"


def render(report: dict[str, Any]) -> str:
    lines = [
        f"# A checkpoint on disk: the folder path with {report.get('backend', 'aoti')}",
        "",
        f"- date: {report['date']}; host: {report['host']}; command: `{report['command']}`",
        f"- checkpoint: {report['checkpoint']['folder']}, "
        f"{report['checkpoint']['tensor_bytes'] / 1e9:.2f} GB of tensors in "
        f"{report['checkpoint']['shards']} shards; page-cache read "
        f"{report['checkpoint']['page_cache_read']['gbps']} GB/s",
    ]
    env = report.get("environment") or {}
    if env:
        lines.append(
            f"- torch {env.get('torch')}, python {env.get('python')}, GPU {env.get('gpu')}, "
            f"CUDA {env.get('cuda')}"
        )
    if report.get("sweep"):
        lines += ["", "## Loader sweep (one process, page cache warm)", ""]
        lines += ["| loader | seconds | GB/s | best GB/s |", "|---|---|---|---:|"]
        for r in report["sweep"]:
            if "error" in r:
                lines.append(f"| {r['loader']} | error: {r['error']} | | |")
                continue
            secs = ", ".join(f"{s:.2f}" for s in r["seconds"])
            gbps = ", ".join(f"{g:.1f}" for g in r["gbps"])
            lines.append(f"| {r['loader']} | {secs} | {gbps} | {r['best_gbps']:.1f} |")
    if report.get("bit_identical"):
        lines.append(f"\nload_checkpoint vs safe_open, bit for bit: {report['bit_identical']}")
    if report.get("build"):
        b = report["build"]
        what = b.get("error") or f"{b.get('status')} in {b.get('seconds')} s, key {b.get('key')}"
        lines += ["", "## Build", "", f"- `{b['command']}`: {what}"]
    if report.get("keys"):
        lines += ["", "## Keys", "", "| spelling | key | arch key |", "|---|---|---|"]
        for name, k in report["keys"].items():
            if "error" in k:
                lines.append(f"| {name} | error: {k['error']} | |")
            else:
                lines.append(f"| {name} | {k['key'][:16]} | {(k.get('arch_key') or '–')[:16]} |")
        lines.append(f"\nAll spellings share one entry: **{report.get('keys_equal')}**")
    if report.get("probes"):
        lines += ["", "## Fresh processes (framework caches empty, weights in the page cache)", ""]
        lines += [
            "| path | run | built | imports | lookup | compiler imports | CUDA context | weights "
            "| weights GB/s | artifact | first token | TTFT | TTFT − imports | decode tok/s |",
            "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for path, res in report["probes"].items():
            if "error" in res and not res.get("runs"):
                lines.append(f"| {path} | – | error: {res['error']} |" + " |" * 11)
                continue
            for r in res["runs"]:
                lines.append(
                    f"| {path} | {r['run']} | {'yes' if r['built'] else 'no'} "
                    f"| {_f(r['imports_s'])} | {_f(r['lookup_s'])} "
                    f"| {_f(r.get('compiler_imports_s'))} | {_f(r['context_s'])} "
                    f"| {_f(r['weights_s'])} | {_f(r['weights_gbps'], '.1f', '')} "
                    f"| {_f(r['artifact_s'])} | {_f(r['first_token_s'])} | {_f(r['ttft_s'])} "
                    f"| {_f(r['ttft_over_imports_s'])} | {_f(r['decode_tok_s'], '.1f', '')} |"
                )
        split = [
            (path, r)
            for path, res in report["probes"].items()
            for r in res.get("runs", [])
            if "weights_read_s" in r
        ]
        if split:
            lines += [
                "",
                "The weights phase split (meta model + headers, device allocation, read + copies):",
                "",
                "| path | run | meta + headers | allocate | read + copies |",
                "|---|---:|---:|---:|---:|",
            ]
            for path, r in split:
                lines.append(
                    f"| {path} | {r['run']} | {_f(r['weights_meta_and_headers_s'], '.3f')} "
                    f"| {_f(r['weights_allocate_s'], '.3f')} | {_f(r['weights_read_s'], '.3f')} |"
                )
        lines.append("")
        for path, res in report["probes"].items():
            if res.get("decode_tok_s") is not None:
                lines.append(f"- {path}: decode {res['decode_tok_s']:.1f} tok/s (runs pooled)")
        lines.append(f"- target: TTFT − imports ≤ {TARGET_OVER_IMPORTS_S} s; weights ≥ 10 GB/s")
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------- main --


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--dir", type=Path, default=None, help="checkpoint folder (default OUT/ckpt)")
    p.add_argument("--cache-dir", type=Path, default=None, help="default OUT/acache")
    p.add_argument("--tiny", action="store_true", help="tiny-llama shapes (a CPU check)")
    p.add_argument("--layers", type=int, default=None, help="fewer layers (--loader-only)")
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default="bf16")
    p.add_argument("--backend", default="aoti")
    p.add_argument("--runs", type=int, default=2, help="fresh processes per path")
    p.add_argument("--iters", type=int, default=3, help="timed requests per process")
    p.add_argument("--sweep", default=None, help=f"threads x MiB (default {CUDA_SWEEP} on CUDA)")
    p.add_argument("--sweep-repeats", type=int, default=2)
    p.add_argument("--no-sweep", action="store_true")
    p.add_argument("--loader-only", action="store_true", help="write + sweep, no build/probes")
    p.add_argument(
        "--allow-build", action="store_true", help="let a probe build on a miss (else: refused)"
    )
    a = p.parse_args(argv)
    if a.layers is not None and not a.loader_only:
        p.error("--layers changes the architecture: use it with --loader-only")
    return a


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    folder = (args.dir or out / "ckpt").resolve()
    cache = (args.cache_dir or out / "acache").resolve()
    cache.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.environ["PYTHONPATH"] = os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])
    base = base_recipe(args.tiny, args.layers)
    report: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "host": platform.node(),
        "command": shlex.join([sys.executable, *sys.argv]),
        "base_recipe": base.name,
        "backend": args.backend,
    }

    def save() -> None:
        (out / "checkpoint_folder.json").write_text(json.dumps(report, indent=2) + "\n")
        (out / "checkpoint_folder.md").write_text(render(report))

    def say(msg: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)

    say(f"writing {folder}")
    written = write_checkpoint(folder, base)
    nbytes = checkpoint_bytes(folder)
    report["checkpoint"] = {
        "folder": str(folder), "shards": len(list(folder.glob("model-*.safetensors"))),
        "tensor_bytes": nbytes, **written,
        "page_cache_read": warm_page_cache(folder),
    }  # fmt: skip
    save()
    if not args.no_sweep:
        sweep = args.sweep or (CUDA_SWEEP if args.device.startswith("cuda") else CPU_SWEEP)
        say(f"loader sweep {sweep}")
        from artifactcache.recipes import load_recipe

        derived = load_recipe(str(folder))
        report["sweep"] = loader_sweep(
            derived, folder, args.device, parse_sweep(sweep), args.sweep_repeats
        )
        save()
        say("checking the loaded tensors against safe_open's")
        try:
            report["bit_identical"] = same_as_safe_open(derived, folder, args.device)
        except Exception as e:
            report["bit_identical"] = {"error": f"{type(e).__name__}: {e}"[:300]}
        save()
    if args.loader_only:
        return 0
    ctx_len = str(base.shapes.max_seq_len)
    common = ["--backend", args.backend, "--device", args.device, "--dtype", args.dtype]
    say("building through the folder path")
    report["build"] = cli(["build", str(folder), *common, "--max-seq-len", ctx_len], cache)
    save()
    toml = folder_toml(folder, base, out)
    report["keys"] = {
        "folder": cli(["key", str(folder), *common, "--max-seq-len", ctx_len], cache),
        "folder TOML": cli(["key", str(toml), *common], cache),
        f"{base.name} --weights DIR": cli(
            ["key", base.name, *common, "--weights", str(folder), "--max-seq-len", ctx_len], cache
        ),
    }
    keys = {k.get("key") for k in report["keys"].values()}
    report["keys_equal"] = len(keys) == 1 and None not in keys
    save()
    from artifactcache.choices import BuildChoices
    from artifactcache.measure.coldstart import ProbeSpec
    from artifactcache.recipes import load_recipe

    warm_page_cache(folder)  # the build's process and the sweep read it too, but be sure
    flags = [] if args.allow_build else ["--no-build"]
    paths = {
        "folder (TOML)": (
            ProbeSpec(str(toml), args.backend, BuildChoices(device=args.device, dtype=args.dtype)),
            load_recipe(str(toml)),
        ),
        f"{base.name} --weights DIR": (
            ProbeSpec(
                base.name,
                args.backend,
                BuildChoices(device=args.device, dtype=args.dtype, weights=str(folder)),
            ),
            base,
        ),
    }
    report["probes"] = {}
    for name, (spec, rec) in paths.items():
        spec.iters, spec.extra_flags = args.iters, flags
        say(f"probes: {name}")
        res = run_probes(spec, cache, args.runs, nbytes, rec, args.dtype)
        report["probes"][name] = res
        if res.get("environment") and not report.get("environment"):
            report["environment"] = res["environment"]
        save()
    say(f"wrote {out / 'checkpoint_folder.md'}")
    print(render(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
