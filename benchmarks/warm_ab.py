"""Warm starts of one entry, two ways, in alternating fresh processes.

A comparison (``--compare``) names two sides of a load-time choice that is not a key
factor, so one entry serves both: per backend, the entry is built once, one untimed
warm process runs (``--prime``), then ``--runs`` pairs of fresh warm processes (the
coldstart probe, empty framework caches, one request) alternate the sides, so drift
hits both alike. Per process: the probe's phases, and what it compiled (nothing).

- ``lazy``: ``ACACHE_LAZY_STEPS=1`` (inductor's prompt-pass steps opened at their
  first call) against ``=0`` (all at load); backends/shared/steps.py.
- ``isa-memo``: Inductor's CPU ISA verdicts read from the cache root's memo against
  the memo removed before each process (every candidate probed, as before the memo);
  backends/shared/cpu_isa.py. CPU only.

    python benchmarks/warm_ab.py llama-7b --compare lazy --backends inductor --runs 3 --out OUT
    python benchmarks/warm_ab.py tiny-llama --compare lazy --device cpu --dtype fp32 --out OUT
    python benchmarks/warm_ab.py tiny-llama --compare isa-memo --backends inductor \\
        --device cpu --dtype fp32 --out OUT

Writes ``OUT/warm_ab.json`` and prints a Markdown table of medians.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from _provenance import provenance  # noqa: E402

from artifactcache.backends.shared.cpu_isa import MEMO as ISA_MEMO  # noqa: E402
from artifactcache.choices import BuildChoices  # noqa: E402
from artifactcache.measure.coldstart import ProbeSpec, fresh_framework_dirs, spawn_probe  # noqa: E402

# comparison -> {side: (environment, cache-root memo removed before the process)}
COMPARISONS: dict[str, dict[str, tuple[dict[str, str], str | None]]] = {
    "lazy": {
        "lazy": ({"ACACHE_LAZY_STEPS": "1"}, None),
        "at_load": ({"ACACHE_LAZY_STEPS": "0"}, None),
    },
    "isa-memo": {
        "memo": ({}, None),
        "no_memo": ({}, ISA_MEMO),
    },
}
# (name, later phase, earlier phase): the spans the table shows, in seconds.
SPANS = (
    ("imports", "imports_done", None),
    ("load", "artifact_ready", "load_called"),
    ("first result after load", "first_result", "artifact_ready"),
    ("first result after imports", "first_result", "imports_done"),
    ("first request after imports", "first_request", "imports_done"),
)


def span(phases: dict[str, float], later: str, earlier: str | None) -> float | None:
    if later not in phases or (earlier is not None and earlier not in phases):
        return None
    return phases[later] - (phases[earlier] if earlier else 0.0)


def build(recipe: str, backend: str, choices: BuildChoices, cache: Path, log: Path) -> None:
    cmd = [
        sys.executable, "-m", "artifactcache.cli", "build", recipe, "--backend", backend,
        "--device", choices.device, "--dtype", choices.dtype, "--cache-dir", str(cache), "--json",
    ]  # fmt: skip
    with open(log, "wb") as f:
        subprocess.run(cmd, check=True, stdout=f, stderr=subprocess.STDOUT, cwd=REPO)


def probe(
    args: argparse.Namespace, backend: str, choices: BuildChoices, cache: Path, side: str,
    i: int,
) -> dict[str, Any]:  # fmt: skip
    """One fresh warm process on ``side`` of the comparison: its phases and compiles."""
    env, removed = COMPARISONS[args.compare][side]
    if removed is not None:
        (cache / "v1" / removed).unlink(missing_ok=True)
    dirs = fresh_framework_dirs(Path(tempfile.mkdtemp(prefix="acache-warm-ab-fw-")))
    spec = ProbeSpec(args.recipe, backend, choices, iters=1, warmup=1)
    r = spawn_probe(
        spec, cache, env_dirs=dirs, extra_env=env,
        log_path=args.out / f"{backend}-{side}-{i}.log",
    )  # fmt: skip
    row = {k: r.get(k) for k in ("phases", "subphases", "compile", "first_token")}
    print(json.dumps({"backend": backend, "side": side, "run": i, "phases": row["phases"]}),
          flush=True)  # fmt: skip
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("recipe")
    ap.add_argument("--compare", choices=sorted(COMPARISONS), required=True)
    # Both comparisons concern inductor alone (aoti opens its steps at load).
    ap.add_argument("--backends", default="inductor")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--runs", type=int, default=3, help="pairs of warm processes per backend")
    ap.add_argument("--prime", type=int, default=1, help="untimed warm processes first")
    ap.add_argument("--cache-dir", type=Path, default=None, help="default: a fresh temp dir")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    cache = args.cache_dir or Path(tempfile.mkdtemp(prefix="acache-warm-ab-"))
    choices = BuildChoices(device=args.device, dtype=args.dtype)
    report: dict[str, Any] = {
        **provenance(), "recipe": args.recipe, "compare": args.compare, "runs": {},
    }  # fmt: skip
    for backend in args.backends.split(","):
        build(args.recipe, backend, choices, cache, args.out / f"build-{backend}.log")
        sides = list(COMPARISONS[args.compare])
        rows: dict[str, list[dict[str, Any]]] = {side: [] for side in sides}
        # Untimed first: it writes bytecode where Python may, and reads the entry into
        # the page cache, so the first timed pair starts where the others do.
        primes = [probe(args, backend, choices, cache, sides[0], -1) for _ in range(args.prime)]
        for i in range(args.runs):
            for side in sides:
                rows[side].append(probe(args, backend, choices, cache, side, i))
        report["runs"][backend] = rows
        report.setdefault("primes", {})[backend] = primes
    report["medians"] = medians(report["runs"])
    (args.out / "warm_ab.json").write_text(json.dumps(report, indent=1) + "\n")
    print(table(report["medians"]))
    return 0


def medians(runs: dict[str, dict[str, list[dict[str, Any]]]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for backend, sides in runs.items():
        for side, rows in sides.items():
            cell = out.setdefault(backend, {}).setdefault(side, {})
            for name, later, earlier in SPANS:
                values = [span(r["phases"], later, earlier) for r in rows]
                values = [v for v in values if v is not None]
                cell[name] = round(statistics.median(values), 3) if values else None
            cell["first tokens"] = sorted({str(r.get("first_token")) for r in rows})
    return out


def table(med: dict[str, Any]) -> str:
    names = [name for name, _, _ in SPANS]
    lines = [
        "| backend | steps | " + " | ".join(f"{n} (s)" for n in names) + " |",
        "|---|---|" + "---:|" * len(names),
    ]
    for backend, sides in med.items():
        for side, cell in sides.items():
            values = " | ".join("–" if cell[n] is None else f"{cell[n]:.2f}" for n in names)
            lines.append(f"| {backend} | {side} | {values} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
