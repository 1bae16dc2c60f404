"""Decode speed of build variants side by side, and where one decode step's time goes.

Part 1, ``--variants``: each variant is ``backend[:mode][+key=value,...]`` (the ``+`` part
becomes ``--extra key=value``, but ``quant=NAME`` becomes ``--quant NAME``), e.g.
``aoti+fuse_projections=0`` (aoti as before fused projections became its CUDA default) or
``aoti+quant=int8wo``, or ``aoti+max_batch=32`` (built for 32 rows, measured and
profiled with 32 copies of the prompt: ``--max-batch 32 --batch 32``), or
``aoti+max_seq_len=4096`` (``--max-seq-len 4096``). Every variant
runs ``acache bench --json`` in a fresh process against one shared cache dir (building
on a miss, the build outside the timed loop), so all variants are measured back to back
on one machine, each with its own copy bandwidth and % of roofline from the same process.

Part 2, ``--profile VARIANT``: a child process loads that variant with
``ACACHE_CUDA_GRAPHS=0`` (the profiler cannot see into a replayed graph) and profiles
``generate(prompt, 1)`` and ``generate(prompt, 1 + N)`` with torch.profiler. The
difference, divided by N, is one decode step's kernel time, grouped by kind (matmul,
attention, elementwise/fused Triton, copies, other), with the matmuls' achieved GB/s
computed from the weight bytes each step must read.

    python benchmarks/decode_step.py llama-7b --out OUT \
        --variants aoti aoti+fuse_projections=0 aoti+quant=int8wo inductor:reduce-overhead \
        --profile aoti aoti+quant=int8wo

Writes ``OUT/decode_step.json`` and prints a markdown table last. ``--build-only`` runs
``acache build`` for each variant instead (``OUT/builds.json``), so that a caller
(decode_call.sh) can build several side by side before measuring them one at a time.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]

PROFILE_CHILD = r"""
import json, os, sys, time
import torch
from torch.profiler import ProfilerActivity, profile
import artifactcache
from artifactcache.recipes import load_recipe
from artifactcache.measure.bench import bytes_per_token

recipe, backend, mode, extra, quant, cache_dir, n, batch, max_seq_len, dtype = sys.argv[1:11]
n, batch, max_seq_len = int(n), int(batch), int(max_seq_len)
extra = json.loads(extra)
# The shapes the artifact is built for, once: the bytes below count the KV it allocated
# and its rows (bytes_per_token refuses a batch over the recipe's max_batch).
shapes = dict(max_batch=batch if batch > 1 else None, max_seq_len=max_seq_len or None)
runner = artifactcache.load(recipe, backend=backend, device="cuda", dtype=dtype,
                            mode=mode or None, extra=extra, quant=quant or None,
                            cache_dir=cache_dir, **shapes)
rec = load_recipe(recipe).with_shapes(**shapes)
prompt = list(rec.bench.prompt_ids)

def run(new):
    if batch > 1:
        runner.generate_batch([prompt] * batch, new)
    else:
        runner.generate(prompt, new)

for _ in range(2):
    run(1 + n)  # warm-up, outside the profile
torch.cuda.synchronize()

def kernels(new):
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        run(new)
        torch.cuda.synchronize()
    out = {}
    for e in prof.events():
        if e.device_type.name != "CUDA":
            continue
        k = out.setdefault(e.name, [0, 0.0])
        k[0] += 1
        k[1] += e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total
    return out

one, many = kernels(1), kernels(1 + n)
per_step = {}
for name, (count, us) in many.items():
    c0, us0 = one.get(name, [0, 0.0])
    if count - c0 > 0:
        per_step[name] = [(count - c0) / n, (us - us0) / n]
print(json.dumps({"per_step": per_step,
                  "bytes": bytes_per_token(rec, dtype, quant=quant or None, batch=batch)}))
"""


def kind_of(name: str) -> str:
    n = name.lower()
    if any(s in n for s in ("gemm", "gemv", "nvjet", "cutlass", "splitk", "mm_", "_mm", "matmul")):
        return "matmul"
    if any(s in n for s in ("flash", "attention", "fmha", "sdpa", "cudnn")):
        return "attention"
    if n.startswith("triton") or "fused" in n:
        return "triton/fused"
    if "copy" in n or "memcpy" in n or "memset" in n:
        return "copy/memset"
    return "other"


def parse_variant(text: str) -> dict[str, Any]:
    head, _, extras = text.partition("+")
    backend, _, mode = head.partition(":")
    extra = dict(kv.split("=", 1) for kv in extras.split(",") if kv)
    quant = extra.pop("quant", None)  # options of their own, not --extra
    batch = int(extra.pop("max_batch", 1))
    max_seq_len = int(extra.pop("max_seq_len", 0))  # 0: the recipe's
    return {"variant": text, "backend": backend, "mode": mode or None, "extra": extra,
            "quant": quant, "batch": batch, "max_seq_len": max_seq_len}  # fmt: skip


def env(out: Path) -> dict[str, str]:
    e = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    e.setdefault("TORCHINDUCTOR_CACHE_DIR", str(out / "inductor-cache"))
    return e


def run_child(
    cmd: list[str], e: dict[str, str], args: argparse.Namespace
) -> subprocess.CompletedProcess[str]:
    """A child process of this script, in REPO: ``python -m`` and ``-c`` put the working
    directory ahead of PYTHONPATH, so a copy of an older tree (an A/B's) runs its own
    artifactcache, not the one of the directory it was started from."""
    return subprocess.run(cmd, capture_output=True, text=True, env=e, cwd=REPO,
                          timeout=args.timeout_s)  # fmt: skip


def variant_args(v: dict[str, Any], args: argparse.Namespace, cache: Path) -> list[str]:
    """The options one variant passes to `acache build` and `acache bench` alike (bench
    adds the rows it runs)."""
    cmd = [args.recipe, "--backend", v["backend"], "--device", args.device, "--dtype",
           args.dtype, "--json", "--cache-dir", str(cache)]  # fmt: skip
    if v["mode"]:
        cmd += ["--mode", v["mode"]]
    for k, val in v["extra"].items():
        cmd += ["--extra", f"{k}={val}"]
    if v["quant"]:
        cmd += ["--quant", v["quant"]]
    if v["batch"] > 1:
        cmd += ["--max-batch", str(v["batch"])]
    if v["max_seq_len"]:
        cmd += ["--max-seq-len", str(v["max_seq_len"])]
    return cmd


def _failure(stderr: str) -> dict[str, Any]:
    """A failed child's last line (the table's "error"), and its last 60 lines: a compiler
    diagnostic's last line alone named only `int_array_63`."""
    lines = stderr.strip().splitlines() or ["?"]
    return {"error": lines[-1], "stderr_tail": lines[-60:]}


def build(v: dict[str, Any], args: argparse.Namespace, cache: Path) -> dict[str, Any]:
    """`acache build` of one variant (a cache hit if it is built already)."""
    cmd = [sys.executable, "-m", "artifactcache.cli", "build", *variant_args(v, args, cache)]
    t0 = time.perf_counter()
    p = run_child(cmd, env(args.out), args)
    wall = round(time.perf_counter() - t0, 1)
    if p.returncode != 0:
        return {**v, **_failure(p.stderr), "wall_s": wall}
    return {**v, "wall_s": wall, "build": json.loads(p.stdout)}


def bench(v: dict[str, Any], args: argparse.Namespace, cache: Path) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "artifactcache.cli", "bench", *variant_args(v, args, cache),
           "--iters", str(args.iters)]  # fmt: skip
    if v["batch"] > 1:
        cmd += ["--batch", str(v["batch"])]
    t0 = time.perf_counter()
    p = run_child(cmd, env(args.out), args)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        return {**v, **_failure(p.stderr), "wall_s": wall}
    r = json.loads(p.stdout)
    if "batches" in r:  # one row per batch size
        r = next(b for b in r["batches"] if b["batch"] == v["batch"])
    return {**v, "wall_s": round(wall, 1), "decode_tok_s": r["decode_tok_s"],
            "roofline_pct": r["roofline_pct"], "copy_gbps": r["copy_gbps"],
            "roofline_tok_s": r["roofline_tok_s"], "runner_info": r.get("runner_info"),
            "aggregate_decode_tok_s": r.get("aggregate_decode_tok_s"),
            "environment": r.get("environment")}  # fmt: skip


def profile_step(v: dict[str, Any], args: argparse.Namespace, cache: Path) -> dict[str, Any]:
    e = {**env(args.out), "ACACHE_CUDA_GRAPHS": "0"}
    cmd = [sys.executable, "-c", PROFILE_CHILD, args.recipe, v["backend"], v["mode"] or "",
           json.dumps(v["extra"]), v["quant"] or "", str(cache), str(args.profile_tokens),
           str(v["batch"]), str(v["max_seq_len"]), args.dtype]  # fmt: skip
    p = run_child(cmd, e, args)
    if p.returncode != 0:
        return {"variant": v["variant"], "error": p.stderr.strip()[-2000:]}
    r = json.loads(p.stdout.strip().splitlines()[-1])
    kinds: dict[str, dict[str, float]] = {}
    for name, (count, us) in r["per_step"].items():
        k = kinds.setdefault(kind_of(name), {"kernels": 0.0, "us": 0.0})
        k["kernels"] += count
        k["us"] += us
    total_us = sum(k["us"] for k in kinds.values())
    mm = kinds.get("matmul", {}).get("us", 0.0)
    weights = r["bytes"]["weights"]
    top = sorted(r["per_step"].items(), key=lambda kv: -kv[1][1])[:25]
    return {"variant": v["variant"], "kernel_us_per_step": total_us, "by_kind": kinds,
            "matmul_gbps": weights / (mm * 1e-6) / 1e9 if mm else None,
            "bytes_per_token": r["bytes"], "top_kernels": top}  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("recipe")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--variants", nargs="*", default=["aoti", "inductor:reduce-overhead"])
    ap.add_argument("--profile", nargs="*", default=[], help="variants to profile")
    ap.add_argument("--profile-tokens", type=int, default=32)
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--device", default="cuda", help="cpu: a smoke test of part 1 only")
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--cache-dir", type=Path, help="default: OUT/cache")
    ap.add_argument("--timeout-s", type=float, default=540)
    ap.add_argument("--build-only", action="store_true",
                    help="only `acache build` each variant (OUT/builds.json), to build "
                    "several side by side before they are measured one at a time")  # fmt: skip
    args = ap.parse_args()
    if Path(args.recipe).exists():  # a TOML or checkpoint folder: the children run in REPO
        args.recipe = str(Path(args.recipe).resolve())
    args.out = args.out.resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    cache = (args.cache_dir or args.out / "cache").resolve()
    report: dict[str, Any] = {
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "host": platform.node(), "rows": [], "profiles": [],
    }  # fmt: skip
    if args.build_only:
        builds = [build(parse_variant(text), args, cache) for text in args.variants]
        (args.out / "builds.json").write_text(json.dumps({**report, "rows": builds}, indent=2))
        for b in builds:
            print(json.dumps({k: b.get(k) for k in ("variant", "wall_s", "error")}), flush=True)
        return int(any("error" in b for b in builds))
    path = args.out / "decode_step.json"
    for text in args.variants:
        row = bench(parse_variant(text), args, cache)
        report["rows"].append(row)
        path.write_text(json.dumps(report, indent=2))
        print(json.dumps({k: row.get(k) for k in ("variant", "decode_tok_s", "roofline_pct",
                                                 "wall_s", "error")}), flush=True)  # fmt: skip
    for text in args.profile:
        prof = profile_step(parse_variant(text), args, cache)
        report["profiles"].append(prof)
        path.write_text(json.dumps(report, indent=2))
    where = f"{args.recipe}, {args.dtype}, {args.device}, batch 1, seed prompt"
    print(f"\n{where} ({report['date']})\n")
    print("| variant | decode tok/s | % of copy roofline | roofline tok/s | wall s |")
    print("|---|---:|---:|---:|---:|")
    for r in report["rows"]:
        if "error" in r:
            print(f"| {r['variant']} | error: {r['error']} | | | {r['wall_s']:.0f} |")
        else:
            print(f"| {r['variant']} | {r['decode_tok_s']:.1f} | {r['roofline_pct']:.1f} | "
                  f"{r['roofline_tok_s']:.1f} | {r['wall_s']:.0f} |")  # fmt: skip
    for p in report["profiles"]:
        if "error" in p:
            print(f"\nprofile {p['variant']}: error\n{p['error']}")
            continue
        print(f"\nprofile {p['variant']}: {p['kernel_us_per_step']:.0f} us of kernels per step; "
              f"matmuls {p['matmul_gbps'] or 0:.0f} GB/s of weights")  # fmt: skip
        for kind, k in sorted(p["by_kind"].items(), key=lambda kv: -kv[1]["us"]):
            print(f"  {kind:14s} {k['us']:8.1f} us  {k['kernels']:6.1f} kernels")
    return 0


if __name__ == "__main__":
    sys.exit(main())
