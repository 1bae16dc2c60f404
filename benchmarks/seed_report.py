"""Assemble one seed-table report from units saved by several GPU calls, running nothing.

Each device call is a fresh machine, so `benchmarks/seed_table.py` is run once per
call on a subset of recipes and its finished units (OUT/units/*.json) are carried
back into this repository. This script rebuilds report.json / report.md / charts
over all of them. A pair with no unit is reported as "not run" with the reason
given by --not-run (e.g. why a backend could not be measured on the GPU).

    python benchmarks/seed_report.py --out benchmarks/results/seed-h200 \
        --calls "python benchmarks/seed_table.py ... (call 1)" "..." \
        --not-run "aoti=..." "trt=..."
"""

from __future__ import annotations

import argparse
import platform
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def main(argv: list[str] | None = None) -> int:
    from artifactcache.choices import BuildChoices
    from artifactcache.measure import compare
    from artifactcache.measure.report import write_report

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--recipes", default="llama-7b,llama-3-8b,mistral-7b,phi-2,phi-3-mini")
    p.add_argument("--backends", default="eager,inductor,aoti,trt")
    p.add_argument("--modes", default="", help="backend=mode,... as the units were built")
    p.add_argument("--calls", nargs="*", default=[], help="device commands behind the units")
    p.add_argument("--not-run", nargs="*", default=[], help="backend=reason (no units)")
    p.add_argument("--runs", type=int, default=1, help="processes per scenario, as run")
    p.add_argument("--builds", type=int, default=None, help="cold processes, as run")
    args = p.parse_args(argv)

    reasons = dict(item.split("=", 1) for item in args.not_run)
    spec = compare.CompareSpec(
        recipes=compare.parse_list(args.recipes, "recipes"),
        backends=compare.parse_list(args.backends, "backends"),
        choices=BuildChoices(device="cuda", dtype="bf16"),
        runs=args.runs,
        builds=args.builds,
        new_tokens=200,
        iters=2,
        modes=compare.parse_modes([args.modes]),
    )
    # The GPU is not here: availability comes from what the units and --not-run say.
    compare.availability = lambda s: {  # type: ignore[assignment]
        b: (b not in reasons, reasons.get(b, "")) for b in dict.fromkeys(["eager", *s.backends])
    }
    command = " ; ".join([*args.calls, "python benchmarks/seed_report.py (assembly, no runs)"])
    report = compare.run_compare(
        spec, args.out, command=command, resume=True, keep_going=lambda r, b: False
    )
    # The units hold what each probe recorded (GPU, torch, CUDA); the host, its CPU, the
    # driver and the bytecode state are this assembling process's, not the GPU host's.
    env = report["environment"]
    for key in ("host", "machine", "cpu", "cpu_count", "driver", "bytecode"):
        env.pop(key, None)
    env["assembled_on"] = platform.node()
    for key, pair in report["pairs"].items():
        if pair.get("reason", "").startswith("left for a later call"):
            pair["reason"] = "GPU time ran out before this pair"
        backend = key.split("/", 1)[1]
        if backend in reasons:
            pair["reason"] = reasons[backend]
    write_report(report, args.out)
    print((args.out / "report.md").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
