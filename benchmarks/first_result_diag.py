"""What a warm process's first result pays once, and whether it can be paid earlier.

A warm aoti start of llama-7b spends ~1.1 s on its first generated token after the load
(the pass step's first run) and ~1 s opening its steps; a second request's first token
takes milliseconds. This script separates the process-wide first-use costs of the
libraries the steps call (cuBLAS, attention) from the steps' own, in fresh processes
against one built entry, alternating the variants:

- ``plain``: load, first result, second result (the coldstart probe's order).
- ``libs``: before the load, a one-layer eager model of the same recipe (random weights,
  a temporary cache) generates two tokens of the seed prompt on the main thread: the
  same GEMM and attention library calls at the pass's and decode's shapes. Its seconds
  are reported; the first result after the load then shows what it took away.
- ``libs-thread``: the same warm-up on a thread with its own CUDA stream, started before
  the load and joined after it: what overlapping it with the load would give.
- ``profile`` (one process, last): ``plain`` with torch.profiler (CPU and CUDA) around
  the first result; the top ops and runtime calls by self CPU time.

    python benchmarks/first_result_diag.py llama-7b --backend aoti --cache-dir C --runs 2 --out OUT

The entry must be in ``--cache-dir`` (``acache build`` it first). Writes
``OUT/first_result_diag.json`` and ``OUT/profile-BACKEND.txt``; prints a table of medians.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
VARIANTS = ("plain", "libs", "libs-thread")
NEW_LEN = 40  # tokens of the prompt of another length


def _warm_libraries(recipe: Any, choices: Any, prompt: list[int], tmp: str) -> float:
    """A one-layer eager copy of ``recipe`` generates 2 tokens; its seconds."""
    import dataclasses

    import torch

    from artifactcache import api

    t = time.perf_counter()
    one = dataclasses.replace(
        recipe, name=recipe.name + "-one-layer", model=dataclasses.replace(recipe.model, n_layers=1)
    )
    from artifactcache.backends.shared.model_options import MODEL_EXTRA_KEYS

    # The model's options only: eager refuses a compiler's (aoti's wrapper_opt).
    model_extra = {k: v for k, v in choices.extra.items() if k in MODEL_EXTRA_KEYS}
    choices = dataclasses.replace(choices, extra=model_extra)
    runner = api.load(one, "eager", choices, cache_dir=tmp)
    runner.generate(prompt, 2)
    if torch.cuda.is_available():
        torch.cuda.current_stream().synchronize()
    del runner
    return time.perf_counter() - t


def child(args: argparse.Namespace) -> dict[str, Any]:
    t_start = time.perf_counter()
    import tempfile
    import threading

    import torch

    from artifactcache import api
    from artifactcache.backends.base import BuildContext, get_backend
    from artifactcache.choices import BuildChoices
    from artifactcache.measure import bench, prefill
    from artifactcache.recipes import load_recipe

    get_backend(args.backend)
    t_imports = time.perf_counter()
    extra = dict(kv.split("=", 1) for kv in args.extra)
    choices = BuildChoices(device=args.device, dtype=args.dtype, extra=extra)
    recipe = bench.with_bench_prompt(load_recipe(args.recipe))
    prompt = list(recipe.bench.prompt_ids)
    dev = torch.device(args.device)
    torch.zeros(1, device=dev)  # the CUDA context, as the probe's load has it

    def sync() -> None:
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    t_context = time.perf_counter()
    out: dict[str, Any] = {"variant": args.child}
    tmp = tempfile.mkdtemp(prefix="acache-libwarm-")
    warm_thread = None
    if args.child == "libs":
        out["warmup_s"] = _warm_libraries(recipe, choices, prompt, tmp)
    elif args.child == "libs-thread":
        side = torch.cuda.Stream(dev) if dev.type == "cuda" else None

        def work() -> None:
            with torch.cuda.stream(side):  # None: a no-op
                out["warmup_s"] = _warm_libraries(recipe, choices, prompt, tmp)

        warm_thread = threading.Thread(target=work, daemon=True)
        warm_thread.start()
    ctx = BuildContext(recipe=recipe, opts=None, weights=None)  # type: ignore[arg-type]
    t_load = time.perf_counter()
    runner = api.load(
        args.recipe, args.backend, choices, cache_dir=args.cache_dir, context=ctx,
        build_on_miss=False,
    )  # fmt: skip
    sync()
    t_loaded = time.perf_counter()
    if warm_thread is not None:
        warm_thread.join()
        t_joined = time.perf_counter()
        out["join_wait_s"] = t_joined - t_loaded
    else:
        t_joined = t_loaded
    prof = None
    if args.child == "profile":
        from torch.profiler import ProfilerActivity, profile

        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
        prof = profile(activities=acts)
        prof.__enter__()
    first = runner.generate(prompt, 1)
    sync()
    t_first = time.perf_counter()
    if prof is not None:
        prof.__exit__(None, None, None)
        table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=45)
        (args.out / f"profile-{args.backend}.txt").write_text(table)
        events = prof.events()
        out["profile_kernels"] = len({e.name for e in events if e.device_type.name == "CUDA"})
    second = runner.generate(prompt, 1)
    sync()
    t_second = time.perf_counter()
    # A prompt of another length: a pass of new shapes (cuDNN builds attention graphs
    # per shape), then the same length again.
    new_len = []
    for n in (NEW_LEN, NEW_LEN, NEW_LEN + 1):
        t = time.perf_counter()
        runner.generate(prefill.prompt_of_length(recipe, n), 1)
        sync()
        new_len.append(time.perf_counter() - t)
    phases = {k: v - t_load for k, v in ctx.phases.items() if not k.endswith(("_seconds", "_s"))}
    out.update(
        imports_s=t_imports - t_start,
        context_s=t_context - t_imports,
        load_s=t_loaded - t_load,
        first_after_load_s=t_first - t_joined,
        first_after_context_s=t_first - t_context,
        second_s=t_second - t_first,
        new_len_first_s=new_len[0],
        new_len_again_s=new_len[1],
        new_len_plus_one_s=new_len[2],
        same_token=first == second,
        load_phases=phases,
        runner_info={
            k: v
            for k, v in dict(getattr(runner, "info", {}) or {}).items()
            if isinstance(v, (bool, int, float, str))
        },  # fmt: skip
    )
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("recipe")
    ap.add_argument("--backend", default="aoti")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--cache-dir", type=Path, required=True)
    ap.add_argument("--extra", action="append", default=[], help="KEY=VALUE, as the build's")
    ap.add_argument("--runs", type=int, default=2, help="processes per variant")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--child", choices=(*VARIANTS, "profile"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.child:
        print("RESULT " + json.dumps(child(args)), flush=True)
        return 0
    rows: list[dict[str, Any]] = []
    order = [v for _ in range(args.runs) for v in VARIANTS] + ["profile"]
    for i, variant in enumerate(order):
        cmd = [sys.executable, __file__, args.recipe, "--backend", args.backend, "--device",
               args.device, "--dtype", args.dtype, "--cache-dir", str(args.cache_dir),
               "--out", str(args.out), "--child", variant]  # fmt: skip
        cmd += [f"--extra={kv}" for kv in args.extra]
        log = args.out / f"{args.backend}-{i}-{variant}.log"
        with open(log, "w") as f:
            p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=f, text=True, cwd=REPO,
                               env=dict(os.environ), timeout=600)  # fmt: skip
        line = next((x for x in p.stdout.splitlines() if x.startswith("RESULT ")), None)
        if p.returncode != 0 or line is None:
            rows.append({"variant": variant, "failed": p.returncode, "log": log.name})
            print(f"{variant}: failed ({log})", flush=True)
            continue
        row = json.loads(line[len("RESULT ") :])
        rows.append(row)
        shown = ("variant", "warmup_s", "load_s", "first_after_load_s", "second_s",
                 "new_len_first_s", "new_len_again_s", "new_len_plus_one_s")  # fmt: skip
        print(json.dumps({k: row.get(k) for k in shown}), flush=True)
    summary: dict[str, Any] = {}
    for v in (*VARIANTS, "profile"):
        got = [r for r in rows if r.get("variant") == v and "failed" not in r]
        summary[v] = {
            k: statistics.median(r[k] for r in got) if got and all(k in r for r in got) else None
            for k in ("warmup_s", "join_wait_s", "load_s", "first_after_load_s",
                      "first_after_context_s", "second_s", "new_len_first_s", "new_len_again_s",
                      "new_len_plus_one_s")
        }  # fmt: skip
    (args.out / "first_result_diag.json").write_text(
        json.dumps(
            {
                "argv": sys.argv,
                "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
                "rows": rows,
                "medians": summary,
            },
            indent=1,
        )  # fmt: skip
    )
    print(
        "| variant | warm-up | join wait | load | first after load | after context | 2nd |"
        f" {NEW_LEN} tokens | again | {NEW_LEN + 1} tokens |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for v, m in summary.items():
        cells = [f"{m[k]:.3f}" if m[k] is not None else "–" for k in m]
        print(f"| {v} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
