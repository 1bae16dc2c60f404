"""Cold vs warm start and call latency for the example models through artifactcache.compile.

For each model x backend x batch size, fresh probe processes (measure/coldstart.py):
``cold`` (empty acache dir and framework caches: builds) and ``warm`` (the entry the cold
run built, framework caches empty again); eager runs once per cell as the baseline.
Latency p50/p99 and items/s come from the warm run's timed calls. Writes
``OUT/anymodel.json`` and ``OUT/anymodel.md``.

    # the H200 report (docs/benchmarks.md):
    python benchmarks/anymodel_report.py --models full --device cuda --out OUT
    # the CPU check with the tiny variants:
    python benchmarks/anymodel_report.py --models tiny --device cpu --out OUT

On cuda, inductor runs in reduce-overhead mode (CUDA graphs) and eager/inductor/aoti in
``--dtype`` (default fp16); ort always runs fp32 on the CPU execution provider, and its
rows say so.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

MODELS = {
    "full": {
        "resnet50": "examples/vision.py:resnet50",
        "vit_b_16": "examples/vision.py:vit_b_16",
        "bert_base": "examples/text.py:bert_base",
    },
    "tiny": {
        "tiny_convnet": "examples/vision.py:tiny_convnet",
        "tiny_vit": "examples/vision.py:tiny_vit",
        "tiny_bert": "examples/text.py:tiny_bert",
    },
}
BACKENDS = ("eager", "inductor", "aoti", "ort")


def cell_settings(backend: str, device: str, dtype: str) -> tuple[str, str, str | None, str]:
    """(device, dtype, mode, label) a backend runs with in this report."""
    if backend == "ort":
        return "cpu", "fp32", None, "ort (CPU EP, fp32)"
    if backend == "inductor" and device.startswith("cuda"):
        return device, dtype, "reduce-overhead", "inductor (reduce-overhead)"
    return device, dtype, None, backend


def run_cell(
    spec: str, backend: str, batch: int, args: argparse.Namespace, work: Path
) -> dict[str, Any]:
    from artifactcache.errors import AcacheError
    from artifactcache.measure import bench as measure_bench
    from artifactcache.measure import coldstart

    device, dtype, mode, label = cell_settings(backend, args.device, args.dtype)
    from artifactcache.choices import BuildChoices

    ps = coldstart.ProbeSpec(
        recipe=str(REPO / spec), backend=backend,
        choices=BuildChoices(device=device, dtype=dtype, mode=mode),
        iters=args.iters, warmup=args.warmup, batch=batch,
    )  # fmt: skip
    row: dict[str, Any] = {
        "backend": backend, "label": label, "device": device, "dtype": dtype, "mode": mode,
        "batch": batch,
    }  # fmt: skip
    scenarios = ("eager",) if backend == "eager" else ("cold", "warm")
    t0 = time.perf_counter()
    try:
        runs = coldstart.run_scenarios(
            ps, 1, scenarios, work_dir=work, timeout=args.timeout, progress=print
        )
    except AcacheError as e:
        return {**row, "status": "failed", "reason": str(e)}
    row["wall_s"] = round(time.perf_counter() - t0, 1)
    steady = runs["eager"] if backend == "eager" else runs["warm"]
    bench = measure_bench.summarize_module(steady)
    first = {s: r[0]["phases"]["first_result"] for s, r in runs.items()}
    row.update(
        status="ok",
        inputs=bench["inputs"],
        cold_first_result_s=first.get("cold", first.get("eager")),
        warm_first_result_s=first.get("warm", first.get("eager")),
        built={s: bool(r[0].get("built")) for s, r in runs.items()},
        compiled={s: bool(r[0]["compile"]["compiled"]) for s, r in runs.items()},
        entry_bytes=steady[0].get("entry_bytes"),
        p50_ms=bench["latency"]["p50"] * 1e3,
        p99_ms=bench["latency"]["p99"] * 1e3,
        items_per_s=bench["items_per_s"],
        environment=steady[0].get("environment"),
    )
    return row


def markdown(report: dict[str, Any]) -> str:
    lines = [
        f"# any-model report ({report['settings']['device']}, {report['created']})",
        "",
        f"`{report['command']}`",
        "",
        "First result is seconds from process start to the first output (cold: builds; "
        "warm: the entry alone, framework caches empty). Latency over "
        f"{report['settings']['iters']} timed calls of the warm process.",
        "",
        "| model | backend | batch | cold first result | warm first result | p50 | p99 | items/s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in report["rows"]:
        if r["status"] != "ok":
            lines.append(f"| {r['model']} | {r['label']} | {r['batch']} | {r['reason']} |||||")
            continue
        lines.append(
            f"| {r['model']} | {r['label']} | {r['batch']} | {r['cold_first_result_s']:.2f} s "
            f"| {r['warm_first_result_s']:.2f} s | {r['p50_ms']:.2f} ms | {r['p99_ms']:.2f} ms "
            f"| {r['items_per_s']:.1f} |"
        )
    env = next((r["environment"] for r in report["rows"] if r.get("environment")), {})
    lines += ["", f"Environment: {json.dumps(env, sort_keys=True)}", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    import shutil
    import tempfile

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--models", choices=sorted(MODELS), default="full")
    p.add_argument("--only", default=None, help="comma-separated model names of --models")
    p.add_argument("--backends", default=",".join(BACKENDS))
    p.add_argument("--batches", default="1,32")
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default=None, help="default: fp16 on cuda, fp32 on cpu")
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds per probe")
    args = p.parse_args(argv)
    args.dtype = args.dtype or ("fp16" if args.device.startswith("cuda") else "fp32")
    models = MODELS[args.models]
    if args.only:
        models = {k: v for k, v in models.items() if k in args.only.split(",")}
    backends = [b for b in args.backends.split(",") if b]
    unknown = sorted(set(backends) - set(BACKENDS))
    if unknown:
        p.error(f"unknown backends {unknown}: choose from {', '.join(BACKENDS)}")
    batches = [int(b) for b in args.batches.split(",")]
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    work_root = Path(tempfile.mkdtemp(prefix="acache-anymodel-"))
    try:
        for name, spec in models.items():
            for backend in backends:
                for batch in batches:
                    print(f"== {name} / {backend} / batch {batch}", flush=True)
                    work = work_root / f"{name}-{backend}-{batch}"
                    row = run_cell(spec, backend, batch, args, work)
                    rows.append({"model": name, "spec": spec, **row})
                    shutil.rmtree(work, ignore_errors=True)
                    print(json.dumps({k: v for k, v in rows[-1].items() if k != "environment"}))
    finally:
        shutil.rmtree(work_root, ignore_errors=True)
    report = {
        "schema": 1,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": "python " + " ".join(sys.argv),
        "settings": {
            "device": args.device,
            "dtype": args.dtype,
            "iters": args.iters,
            "warmup": args.warmup,
            "batches": batches,
            "models": args.models,
        },  # fmt: skip
        "rows": rows,
        "ok": sum(r["status"] == "ok" for r in rows),
    }
    (args.out / "anymodel.json").write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    (args.out / "anymodel.md").write_text(markdown(report))
    print(f"wrote {args.out / 'anymodel.json'} and {args.out / 'anymodel.md'}")
    return 0 if report["ok"] == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
