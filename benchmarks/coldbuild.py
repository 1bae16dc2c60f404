"""A cold aoti build with its steps (prefill, extend, decode) compiled concurrently, against
the same build done serially, on one GPU.

Each build runs in its own ``acache build`` process with empty acache, Inductor and
Triton caches (fresh folders under ``--work-dir``): first with the default (concurrent
steps on CUDA), then with ``ACACHE_BUILD_JOBS=1``. ``acache bench`` runs on each entry
after its build, so a faster build is not bought with a slower artifact: Inductor's
tuning times kernels while the other steps' compiles time theirs on the same GPU.
``--pairs N`` repeats the pair, alternating, to see how much decode varies from build
to build (names get a ``-1``, ``-2``, ... suffix). Run it alone on the machine: build
seconds are wall-clock.

    python benchmarks/coldbuild.py --out OUT --work-dir /tmp/coldbuild     # llama-7b, cuda, bf16

Before the first build, where ``PYTHONPYCACHEPREFIX`` is set, the bytecode of the
packages a build imports is written to that prefix (``_bytecode.py``), untimed, as a
``pip install`` would have: otherwise the first build of a call on a fresh machine
compiles their sources in every worker (``--no-prime-bytecode`` to measure that).

``--backend inductor`` builds and benches one inductor entry the same way, for the
build's own phase record and its decode; with ``--pairs 3``, three of them, to see the
spread of decode over builds of one key:

    python benchmarks/coldbuild.py --backend inductor --pairs 3 \
        --out OUT --work-dir /tmp/coldbuild

``--bytecode-ab`` makes the pair a build with the bytecode prefix primed (below) and one
with an empty prefix of its own, what the first build of a call on a fresh machine
meets; ``--jobs N`` sets ACACHE_BUILD_JOBS for every build (steps at once on a CPU
host), ``--no-bench`` skips the benches:

    python benchmarks/coldbuild.py --backend aoti --recipe tiny-llama --device cpu \
        --dtype fp32 --bytecode-ab --jobs 3 --pairs 2 --no-bench --out OUT --work-dir W

With ``--against RECIPE`` the second build is that recipe's, built the default way like
the first, and both entries are benched: a same-run A/B of two recipes' build time and
decode (issue 30: llama-7b against benchmarks/recipes/llama-7b-p16.toml, the same model
with the 16-token passes it had before prompt-sized prefill). ``--prompt-lens`` adds
time to first token at those lengths to each bench.

    python benchmarks/coldbuild.py --out OUT --work-dir /tmp/coldbuild \
        --against benchmarks/recipes/llama-7b-p16.toml --prompt-lens 16,128,512

Writes ``OUT/build-{concurrent,serial}.json`` (``acache build --json``; ``build-{a,b}``
with ``--against``, and likewise below),
``OUT/timings-{concurrent,serial}.json`` (the entry's own ``build_jobs`` and
``compile_seconds`` from its ``aoti.json``), ``OUT/bench-{concurrent,serial}.json``,
each step's stderr as ``OUT/*.log``, and ``OUT/coldbuild.json`` (command, date, machine,
every result, each entry's decode tok/s and % of the roofline, and what the bytecode
primer did) last.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from _bytecode import prime
from _provenance import provenance

REPO = Path(__file__).resolve().parents[1]
JOBS = "ACACHE_BUILD_JOBS"


def _acache(args: list[str], out: Path, name: str, env: dict[str, str]) -> tuple[int, float, Any]:
    """Runs ``acache ARGS`` in a fresh process; stdout to OUT/NAME.json, stderr to .log."""
    start = time.perf_counter()
    with open(out / f"{name}.json", "w") as so, open(out / f"{name}.log", "w") as se:
        rc = subprocess.call(
            [sys.executable, "-m", "artifactcache.cli", *args],
            stdout=so,
            stderr=se,
            env=env,
            cwd=REPO,
        )
    seconds = time.perf_counter() - start
    try:
        result = json.loads((out / f"{name}.json").read_text())
    except ValueError:
        result = None
    print(f"{name}: rc {rc}, {seconds:.1f} s", flush=True)
    return rc, seconds, result


def _fresh_env(work: Path, name: str, settings: dict[str, str]) -> tuple[dict[str, str], Path]:
    """Empty acache, Inductor and Triton caches for one build, with ``settings`` (ACACHE_*
    variables; ``{root}`` in a value is this build's folder) in its environment."""
    root = work / name
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    env = dict(
        os.environ,
        TORCHINDUCTOR_CACHE_DIR=str(root / "inductor"),
        TRITON_CACHE_DIR=str(root / "triton"),
    )
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env.pop(JOBS, None)
    env.update({k: v.format(root=root) for k, v in settings.items()})
    return env, root / "acache"


def _timings(result: Any, backend: str) -> dict[str, Any] | None:
    """The entry's own record of where the build's time went."""
    if not isinstance(result, dict) or "path" not in result:
        return None
    meta = json.loads((Path(result["path"]) / f"{backend}.json").read_text())
    return {"build_jobs": meta.get("build_jobs"), "compile_seconds": meta.get("compile_seconds")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="results folder")
    ap.add_argument(
        "--work-dir",
        type=Path,
        required=True,
        help="scratch folder for the empty caches (emptied per build)",
    )
    ap.add_argument("--recipe", default="llama-7b")
    ap.add_argument(
        "--backend",
        default="aoti",
        choices=("aoti", "inductor"),
        help="aoti: the pair below; inductor: its default build alone, benched",
    )
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--iters", type=int, default=3, help="timed requests of the bench")
    ap.add_argument("--against", default=None, help="a second recipe instead of the serial build")
    ap.add_argument("--prompt-lens", default=None, help="bench's --prompt-len, e.g. 16,128,512")
    ap.add_argument("--pairs", type=int, default=1, help="the pair of builds, this many times")
    ap.add_argument(
        "--bytecode-ab",
        action="store_true",
        help="the pair: the bytecode prefix filled (primed) and an empty one per build",
    )
    ap.add_argument("--jobs", default=None, help=f"{JOBS} for every build of the pair")
    ap.add_argument("--no-bench", action="store_true", help="builds only")
    ap.add_argument(
        "--no-prime-bytecode",
        action="store_true",
        help="leave PYTHONPYCACHEPREFIX as it is: the first build compiles module sources",
    )
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    options = [
        "--backend",
        args.backend,
        "--device",
        args.device,
        "--dtype",
        args.dtype,
        "--json",
    ]
    report: dict[str, Any] = {**provenance(), "runs": {}}
    if not args.no_prime_bytecode:
        report["bytecode"] = prime(_fresh_env(args.work_dir, "prime", {})[0])
        print(f"bytecode: {report['bytecode']}", flush=True)
    if args.bytecode_ab and not report.get("bytecode", {}).get("prefix"):
        ap.error("--bytecode-ab needs PYTHONPYCACHEPREFIX set and the prefix primed")
    pair = [("concurrent", args.recipe, {}), ("serial", args.recipe, {JOBS: "1"})]
    if args.against:
        pair = [("a", args.recipe, {}), ("b", args.against, {})]
    elif args.bytecode_ab:  # the primed prefix, then an empty one of the build's own
        pair = [("pyc-filled", args.recipe, {}),
                ("pyc-empty", args.recipe, {"PYTHONPYCACHEPREFIX": "{root}/pyc"})]  # fmt: skip
    elif args.backend != "aoti":
        pair = [(args.backend, args.recipe, {})]
    runs = pair
    if args.pairs > 1:
        runs = [(f"{n}-{i}", r, s) for i in range(1, args.pairs + 1) for n, r, s in pair]
    report["decode"] = {}
    for name, recipe, settings in runs:
        if args.jobs and JOBS not in settings:
            settings = {**settings, JOBS: args.jobs}
        env, cache = _fresh_env(args.work_dir, name, settings)
        common = [recipe, *options]
        rc, seconds, result = _acache(
            ["build", *common, "--cache-dir", str(cache)], args.out, f"build-{name}", env
        )
        timings = _timings(result, args.backend) if rc == 0 else None
        (args.out / f"timings-{name}.json").write_text(json.dumps(timings, indent=1) + "\n")
        report["runs"][f"build-{name}"] = {
            "recipe": recipe,
            "settings": settings,
            "rc": rc,
            "wall_seconds": round(seconds, 1),
            "timings": timings,
        }
        if rc != 0 or args.no_bench:
            continue
        lens = ["--prompt-len", args.prompt_lens] if args.prompt_lens else []
        bench = ["bench", *common, "--cache-dir", str(cache), "--iters", str(args.iters)]
        rc, seconds, result = _acache(
            [*bench, "--warmup", "1", *lens], args.out, f"bench-{name}", env
        )
        report["runs"][f"bench-{name}"] = {"rc": rc, "wall_seconds": round(seconds, 1)}
        if isinstance(result, dict):  # one batch: bench's flat summary
            report["decode"][name] = {k: result.get(k) for k in ("decode_tok_s", "roofline_pct")}
    (args.out / "coldbuild.json").write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps({"runs": report["runs"], "decode": report["decode"]}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
