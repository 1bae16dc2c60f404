"""Decode speed at several KV positions, for artifacts allocated at several context lengths.

Does a decode step cost what the *filled* KV needs, whatever was allocated? For each
backend and each ``--max-seq-lens`` value this builds the artifact (``acache build``,
``--jobs`` builds at a time, each in its own process with its own fresh Inductor cache
dir), then, one artifact at a time, a fresh process loads it (no build on a miss) and
measures on the GPU alone:

* ``seed``: the seed benchmark as ``acache bench`` runs it (prompt, up to 200 new
  tokens, greedy; decode tok/s = (N - 1) / (request - prefill));
* each ``--positions`` P: a prefill of ``P - tokens/2`` prompt tokens, then ``--tokens``
  greedy decode steps timed back to back (the runner's own decode step and inputs, so
  CUDA graphs and KV-length buckets as in ``generate``), after one untimed pass over
  the same positions; the median of ``--iters`` passes. Windows that do not fit an
  artifact's context are skipped.

bytes/token = weights without the embedding + the KV the steps attend to (the mean over
the window), as ``acache bench`` counts them; % of roofline is against the device copy
bandwidth measured in the same process.

    python benchmarks/kv_positions.py --out OUT                     # H200: llama-7b bf16
    python benchmarks/kv_positions.py --out OUT --recipe tiny-llama --device cpu \\
        --dtype fp32 --max-seq-lens 256,64 --positions 40,200 --tokens 16   # CPU smoke run

Writes ``OUT/kv_positions.json`` (after every step) and prints a markdown table last.
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

MEASURE_CHILD = r"""
import json, statistics, sys, time
import torch
import artifactcache
from artifactcache.recipes import load_recipe
from artifactcache.measure.bench import bytes_per_token, resolve_new_tokens, roofline
from artifactcache.measure.child.timing import copy_bandwidth, measure_requests, sync

name, backend, device, dtype, max_seq_len, cache_dir, windows, iters = sys.argv[1:9]
max_seq_len, windows, iters = int(max_seq_len), json.loads(windows), int(iters)
t0 = time.perf_counter()
runner = artifactcache.load(name, backend=backend, device=device, dtype=dtype,
                            max_seq_len=max_seq_len, cache_dir=cache_dir, build_on_miss=False)
load_s = time.perf_counter() - t0
recipe = load_recipe(name).with_shapes(max_seq_len=max_seq_len)
dev = runner.device
gbps = copy_bandwidth(dev)["gbps"]
out = {"load_s": round(load_s, 3), "copy_gbps": gbps, "windows": []}

seed = list(recipe.bench.prompt_ids)
n = resolve_new_tokens(recipe, None)
r = measure_requests(runner, [seed], n, iters=iters, warmup=1, device=dev)
bpt = bytes_per_token(recipe, dtype, prompt_len=len(seed), new_tokens=n)
out["seed"] = {"start": len(seed), "tokens": n - 1, "tok_s": r["decode_tok_s"],
               "bytes_per_token": bpt["total"], **roofline(bpt["total"], r["decode_tok_s"], gbps)}

rows = recipe.shapes.max_batch  # every step runs them all; row 0 is the request
row_start = torch.zeros(rows, dtype=torch.int64, device=dev)

def decode_pass(start, tokens):
    tok = torch.ones(rows, 1, dtype=torch.int64, device=dev)
    ipos = torch.tensor([start], dtype=torch.int64, device=dev)
    sync(dev)
    t = time.perf_counter()
    with torch.no_grad():
        for k in range(tokens):
            inputs = runner.decode_inputs(tok, ipos, row_start, start + k)
            logits = runner.decode_step(*inputs)
            logits = logits[0] if isinstance(logits, (list, tuple)) else logits
            tok = logits[:, -1].argmax(-1, keepdim=True)
            ipos = ipos + 1
    sync(dev)
    return time.perf_counter() - t

vocab = recipe.model.vocab_size
for position, start, tokens in windows:
    prompt = [(7 * i + 11) % vocab for i in range(start)]
    runner.generate(prompt, 1, eos_token_ids=())  # fills the cache up to start
    decode_pass(start, tokens)  # untimed: first use of a bucket may capture a CUDA graph
    times = [decode_pass(start, tokens) for _ in range(iters)]
    tok_s = tokens / statistics.median(times)
    # A step at position q attends q + 1 positions: bench's count for a request of
    # start prompt tokens and tokens + 1 new ones.
    bpt = bytes_per_token(recipe, dtype, prompt_len=start, new_tokens=tokens + 1)
    out["windows"].append({"position": position, "start": start, "tokens": tokens,
                           "tok_s": tok_s, "seconds": times, "bytes_per_token": bpt["total"],
                           "kv_mean_positions": bpt["kv_mean_positions"],
                           **roofline(bpt["total"], tok_s, gbps)})
out["runner_info"] = dict(getattr(runner, "info", {}) or {})
print(json.dumps(out))
"""


def parse_ints(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        msg = f"expected comma-separated integers, got {text!r}"
        raise argparse.ArgumentTypeError(msg) from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def windows_for(positions: list[int], tokens: int, max_seq_len: int) -> list[list[int]]:
    """[position, start, tokens] for each window centred on a position that fits the context.

    The window's steps write positions start .. start + tokens - 1, so it fits when
    start + tokens <= max_seq_len; start >= 1 since a prefill needs a token.
    """
    out = []
    for p in positions:
        start = max(1, p - tokens // 2)
        if start + tokens <= max_seq_len:
            out.append([p, start, tokens])
    return out


def env_for(args: argparse.Namespace, inductor_dir: Path) -> dict[str, str]:
    e = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    # A fresh Inductor cache dir per process: builds are cold, and a measuring process
    # is warm from the entry alone.
    e["TORCHINDUCTOR_CACHE_DIR"] = str(inductor_dir)
    return e


def build_cmd(args: argparse.Namespace, backend: str, max_seq_len: int) -> list[str]:
    return [sys.executable, "-m", "artifactcache.cli", "build", args.recipe, "--backend",
            backend, "--device", args.device, "--dtype", args.dtype, "--max-seq-len",
            str(max_seq_len), "--cache-dir", str(args.cache), "--json"]  # fmt: skip


def run_builds(args: argparse.Namespace, jobs: list[tuple[str, int]]) -> list[dict[str, Any]]:
    """Every (backend, max_seq_len) built, ``args.jobs`` processes at a time, longest first."""
    logs = args.out / "logs"
    logs.mkdir(exist_ok=True)
    pending = sorted(jobs, key=lambda j: (j[0] != "aoti", -j[1]))  # aoti builds take longest
    running: list[tuple[dict[str, Any], subprocess.Popen, Any]] = []
    done: list[dict[str, Any]] = []
    while pending or running:
        while pending and len(running) < args.jobs:
            backend, s = pending.pop(0)
            name = f"{backend}-{s}"
            log = open(logs / f"build-{name}.log", "w")  # closed when the build ends
            env = env_for(args, args.out / "inductor-cache" / f"build-{name}")
            proc = subprocess.Popen(build_cmd(args, backend, s), stdout=subprocess.PIPE,
                                    stderr=log, text=True, env=env)  # fmt: skip
            row = {"backend": backend, "max_seq_len": s, "t0": time.perf_counter()}
            running.append((row, proc, log))
        time.sleep(0.5)
        for item in list(running):
            row, proc, log = item
            elapsed = time.perf_counter() - row["t0"]
            if proc.poll() is None and elapsed < args.timeout_s:
                continue
            if proc.poll() is None:
                proc.kill()
            stdout = proc.communicate()[0]
            log.close()
            row["wall_s"] = round(time.perf_counter() - row.pop("t0"), 1)
            row["ok"] = proc.returncode == 0
            if row["ok"]:
                res = json.loads(stdout)
                row.update(key=res.get("key"), status=res.get("status"), build_s=res.get("seconds"))
            else:
                tail = (logs / f"build-{row['backend']}-{row['max_seq_len']}.log").read_text()
                row["error"] = (tail.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
            running.remove(item)
            done.append(row)
            print(json.dumps({"build": row}), flush=True)
    return done


def measure(args: argparse.Namespace, backend: str, max_seq_len: int) -> dict[str, Any]:
    windows = windows_for(args.positions, args.tokens, max_seq_len)
    cmd = [sys.executable, "-c", MEASURE_CHILD, args.recipe, backend, args.device, args.dtype,
           str(max_seq_len), str(args.cache), json.dumps(windows), str(args.iters)]  # fmt: skip
    env = env_for(args, args.out / "inductor-cache" / f"measure-{backend}-{max_seq_len}")
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=args.timeout_s)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {args.timeout_s:.0f} s"}
    wall = round(time.perf_counter() - t0, 1)
    # Kept whole: the AOTI runtime writes a failed run's CUDA error only to stderr.
    (args.out / "logs").mkdir(exist_ok=True)
    (args.out / "logs" / f"measure-{backend}-{max_seq_len}.log").write_text(p.stderr)
    if p.returncode != 0:
        return {"error": (p.stderr.strip().splitlines() or ["?"])[-1], "wall_s": wall}
    return {**json.loads(p.stdout.strip().splitlines()[-1]), "wall_s": wall}


def table(report: dict[str, Any]) -> list[str]:
    """One row per backend and window; a column of tok/s per allocated length."""
    sizes = report["settings"]["max_seq_lens"]
    head = ["backend", "decode positions"] + [f"tok/s @{s}" for s in sizes]
    if len(sizes) > 1:
        head.append(f"@{sizes[0]} vs @{sizes[-1]}")
    head.append(f"% roofline @{sizes[0]}")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * 2 + "---:|" * (len(head) - 2)]
    for backend in report["settings"]["backends"]:
        res = {r["max_seq_len"]: r for r in report["results"] if r["backend"] == backend}
        labels: dict[str, dict[int, dict[str, Any]]] = {}
        for s, r in res.items():
            for w in ([r["seed"]] if "seed" in r else []) + r.get("windows", []):
                label = f"{w['start']}-{w['start'] + w['tokens'] - 1}"
                if "position" not in w:
                    label += " (seed)"
                labels.setdefault(label, {})[s] = w
        for s, r in res.items():
            if "error" in r:
                lines.append(f"| {backend} | @{s}: error: {r['error']} |" + " |" * (len(head) - 2))
        for label, by_size in labels.items():
            cells = [backend, label]
            for s in sizes:
                w = by_size.get(s)
                cells.append(f"{w['tok_s']:.1f}" if w and w.get("tok_s") else "")
            if len(sizes) > 1:
                a, b = by_size.get(sizes[0]), by_size.get(sizes[-1])
                ok = a and b and a.get("tok_s") and b.get("tok_s")
                cells.append(f"{100 * (a['tok_s'] / b['tok_s'] - 1):+.1f}%" if ok else "")
            first = by_size.get(sizes[0])
            pct = first.get("roofline_pct") if first else None
            cells.append(f"{pct:.1f}" if pct is not None else "")
            lines.append("| " + " | ".join(cells) + " |")
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--recipe", default="llama-7b")
    ap.add_argument("--backends", default="aoti,inductor")
    ap.add_argument("--max-seq-lens", type=parse_ints, default=[4096, 256],
                    help="contexts to allocate, the first compared with the last")  # fmt: skip
    ap.add_argument("--positions", type=parse_ints, default=[200, 1000, 4000])
    ap.add_argument("--tokens", type=int, default=64, help="decode steps per window")
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--jobs", type=int, default=2, help="builds at a time")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--cache-dir", type=Path, help="default: OUT/cache")
    ap.add_argument("--timeout-s", type=float, default=540, help="per build or measurement")
    args = ap.parse_args()
    if args.tokens < 1 or args.iters < 1 or args.jobs < 1:
        ap.error("--tokens, --iters and --jobs must be at least 1")
    args.out = args.out.resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    args.cache = (args.cache_dir or args.out / "cache").resolve()
    args.cache.mkdir(mode=0o700, parents=True, exist_ok=True)
    backends = [b for b in args.backends.split(",") if b]
    report: dict[str, Any] = {
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "host": platform.node(),
        "settings": {"recipe": args.recipe, "device": args.device, "dtype": args.dtype,
                     "backends": backends, "max_seq_lens": args.max_seq_lens,
                     "positions": args.positions, "tokens": args.tokens,
                     "iters": args.iters, "jobs": args.jobs},
        "builds": [], "results": [],
    }  # fmt: skip
    path = args.out / "kv_positions.json"
    t0 = time.perf_counter()
    report["builds"] = run_builds(args, [(b, s) for b in backends for s in args.max_seq_lens])
    path.write_text(json.dumps(report, indent=2))
    built = {(r["backend"], r["max_seq_len"]): r for r in report["builds"]}
    for backend in backends:
        for s in args.max_seq_lens:
            if not built[(backend, s)]["ok"]:
                row = {"error": "build failed: " + built[(backend, s)]["error"]}
            else:
                row = measure(args, backend, s)
            report["results"].append({"backend": backend, "max_seq_len": s, **row})
            path.write_text(json.dumps(report, indent=2))
            print(json.dumps({"measured": [backend, s], "error": row.get("error")}), flush=True)
    report["wall_s"] = round(time.perf_counter() - t0, 1)
    path.write_text(json.dumps(report, indent=2))
    st = report["settings"]
    print(f"\n{st['recipe']}, {st['dtype']}, {st['device']}, batch 1, greedy; "
          f"{report['date']}, {report['wall_s']:.0f} s with builds\n")  # fmt: skip
    print("\n".join(table(report)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
