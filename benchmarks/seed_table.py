"""The seed comparison table (docs/benchmarks.md) on one GPU, resumable across calls.

Runs `acache compare` for the five seed models in bf16 with random weights, for
eager, inductor (reduce-overhead) and aoti, into ``--out``. Every finished unit
(one recipe's eager baseline, or one recipe x backend's cold + warm runs) is
saved under OUT/units at once, and each probe run is journaled, so a call that
hits the machine's time limit loses at most the run in flight: run the same
command again and it continues where it stopped. Entries built by a cold run
persist under OUT/work until that unit's warm runs are done.

Each call first fills ``PYTHONPYCACHEPREFIX``, where it is set, with the bytecode of the
packages a build imports (``_bytecode.py``, untimed), so that the first cold run of a
call on a fresh machine does not compile their sources.

``--budget-s`` keeps a call inside the machine's per-call limit: a unit is only
started when its estimated cost fits in what is left; the rest is reported as
"not run: left for a later call". Each call rewrites report.json, report.md and
the charts from everything finished so far, with the date, GPU, driver,
torch/triton versions and this exact command.

Example (on the GPU machine, repo root, ~9-minute calls):

    python benchmarks/seed_table.py --out OUT --budget-s 540
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
from pathlib import Path

from _bytecode import prime

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

SEED_RECIPES = ("llama-7b", "llama-3-8b", "mistral-7b", "phi-2", "phi-3-mini")
SEED_BACKENDS = ("eager", "inductor", "aoti")
# Rough seconds per unit at runs=1: a build that does not depend on the model's size
# (Inductor compiles one block's kernels whatever the width: phi-2's cold inductor
# start was 72 s against llama-7b's 75 s on 2026-12-01) plus processes and requests
# that scale with the parameter count. Builds from the H200 and H100 calls of
# 2026-12-05/06 (inductor 29-53 s, aoti ~90 s, plus the cold process's start and
# requests); runs from 2026-12-04's (a bytecode warm start ~6 s). Only used to decide
# whether a unit still fits in this call.
UNIT_BUILD_S = {"eager": 0.0, "inductor": 70.0, "aoti": 110.0, "ort": 250.0, "trt": 250.0}
UNIT_RUNS_7B_S = {"eager": 35.0, "inductor": 25.0, "aoti": 25.0, "ort": 50.0, "trt": 50.0}


def _estimate(recipe: str, backend: str, runs: int, builds: int) -> float:
    import torch

    from artifactcache.models import architecture
    from artifactcache.recipes import load_recipe

    with torch.device("meta"):
        n = sum(p.numel() for p in architecture(load_recipe(recipe)).parameters())
    per_run = UNIT_RUNS_7B_S.get(backend, 50.0) * n / 6.74e9
    return UNIT_BUILD_S.get(backend, 250.0) * builds + per_run * runs


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, required=True, help="results folder (resumable)")
    p.add_argument("--recipes", default=",".join(SEED_RECIPES))
    p.add_argument("--backends", default=",".join(SEED_BACKENDS) + ",trt")
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default="bf16")
    p.add_argument("--runs", type=int, default=1, help="fresh processes per scenario")
    p.add_argument(
        "--builds", type=int, default=None, help="cold (building) processes (default --runs)"
    )
    p.add_argument("--new-tokens", type=int, default=200)
    p.add_argument("--iters", type=int, default=2, help="timed requests per process")
    p.add_argument("--modes", default="", help="backend=mode,...; default: each backend's own")
    p.add_argument("--budget-s", type=float, default=540.0, help="stop starting units after")
    p.add_argument("--probe-timeout-s", type=float, default=560.0)
    args = p.parse_args(argv)
    args.out = args.out.expanduser().resolve()  # children's cache dirs must not depend on their cwd
    t_start = time.monotonic()

    from artifactcache.choices import BuildChoices
    from artifactcache.errors import AcacheError
    from artifactcache.measure import compare
    from artifactcache.measure.report import seed_table, write_report

    # Children import artifactcache from this checkout even when it is not installed.
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]
    )
    # Untimed, before the first cold run: what a pip install would have written (_bytecode.py).
    primed = prime(dict(os.environ))
    print(f"[seed_table] bytecode: {primed}", file=sys.stderr, flush=True)
    command = "python benchmarks/seed_table.py " + " ".join(
        shlex.quote(a) for a in (sys.argv[1:] if argv is None else argv)
    )
    try:
        spec = compare.CompareSpec(
            recipes=compare.parse_list(args.recipes, "recipes"),
            backends=compare.parse_list(args.backends, "backends"),
            choices=BuildChoices(device=args.device, dtype=args.dtype),
            runs=args.runs,
            builds=args.builds,
            new_tokens=args.new_tokens,
            iters=args.iters,
            modes=compare.parse_modes([args.modes] if args.modes else []),
            timeout=args.probe_timeout_s,
        )

        def keep_going(recipe: str, backend: str) -> bool:
            left = args.budget_s - (time.monotonic() - t_start)
            need = _estimate(recipe, backend, args.runs, args.builds or args.runs)
            fits = need <= left
            print(
                f"[seed_table] {recipe}/{backend}: ~{need:.0f} s needed, {left:.0f} s left"
                + ("" if fits else ": left for a later call"),
                file=sys.stderr,
                flush=True,
            )
            return fits

        def progress(msg: str, done: int, total: int) -> None:
            t = time.monotonic() - t_start
            print(f"[seed_table {t:6.0f} s] ({done}/{total}) {msg}", file=sys.stderr, flush=True)

        report = compare.run_compare(
            spec,
            args.out,
            command=command,
            resume=True,
            work_root=args.out / "work",
            progress=progress,
            keep_going=keep_going,
        )
        report["bytecode"] = primed  # this call's primer: whether its cold runs compiled sources
        write_report(report, args.out)
    except AcacheError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print("\n".join(seed_table(report)))
    left = [k for k, v in report["pairs"].items() if "later call" in v.get("reason", "")]
    left += [
        f"{r}/eager (baseline)"
        for r, v in report["baselines"].items()
        if "later call" in v.get("reason", "") and f"{r}/eager" not in report["pairs"]
    ]
    if left:
        print(f"not finished in this call: {', '.join(left)}; run the same command again")
    print(f"report: {args.out / 'report.md'} ({time.monotonic() - t_start:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
