"""One line per build record or bench result, for build_phases_call.sh's log.

    python benchmarks/build_phases_summary.py record RECORD.json   # a build's phases
    python benchmarks/build_phases_summary.py bench BENCH.json     # acache bench --json
    python benchmarks/build_phases_summary.py table DIR...          # a markdown table

``table`` has one row per build in each build_phases_call.sh results folder: the build's
wall and each step's seconds (its record), then its entry's bench where there is one.
"""

from __future__ import annotations

import json
import sys
from typing import Any

BENCH_KEYS = ("entry", "decode_tok_s", "roofline_pct", "copy_gbps", "prefill_median_s")
PHASES = ("imports_done", "entry_ready", "weights_ready", "artifact_ready", "first_result")


def record_line(d: dict[str, Any]) -> str:
    secs = d.get("compile_seconds", {})
    return str({k: round(v, 1) for k, v in secs.items() if isinstance(v, (int, float))})


def bench_line(d: dict[str, Any]) -> str:
    out: dict[str, Any] = {k: d.get(k) for k in BENCH_KEYS}
    phases = d.get("phases", {})
    out.update({k: round(phases[k], 2) for k in PHASES if k in phases})
    return str({k: round(v, 4) if isinstance(v, float) else v for k, v in out.items()})


def table(folders: list[str]) -> str:
    from pathlib import Path

    rows = [
        "| folder | build | wall s | prefill s | extend s | decode s | decode tok/s "
        "| % roofline | first pass ms |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for folder in map(Path, folders):
        for rec in sorted(folder.glob("record-*.json")):
            name = rec.stem.removeprefix("record-")
            secs = json.loads(rec.read_text()).get("compile_seconds", {})
            bench_path = folder / f"bench-{name}.json"
            try:
                b = json.loads(bench_path.read_text())
            except (OSError, ValueError):
                b = {}
            tok = b.get("decode_tok_s")
            pct = b.get("roofline_pct")
            first = b.get("prefill_median_s")
            rows.append(
                f"| {folder.name} | {name} | {secs.get('wall', 0):.1f} "
                f"| {secs.get('prefill', 0):.1f} | {secs.get('extend', 0):.1f} "
                f"| {secs.get('decode', 0):.1f} | {f'{tok:.1f}' if tok else '–'} "
                f"| {f'{pct:.1f}' if pct else '–'} | {f'{first * 1e3:.1f}' if first else '–'} |"
            )
    return "\n".join(rows)


def main() -> None:
    kind = sys.argv[1]
    if kind == "table":
        print(table(sys.argv[2:]))
        return
    path = sys.argv[2]
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError) as e:
        sys.exit(f"{path}: {e}")
    print(record_line(data) if kind == "record" else bench_line(data))


if __name__ == "__main__":
    main()
