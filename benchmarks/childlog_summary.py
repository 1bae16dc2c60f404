"""Sums the child processes that childlog/sitecustomize.py logged, by program and by
the process that started them, longest first.

    python benchmarks/childlog_summary.py LOGDIR [--json]
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path


def summarize(folder: Path) -> dict[str, dict[str, float]]:
    by_prog: dict[str, dict[str, float]] = defaultdict(
        lambda: {"count": 0, "wall": 0.0, "max": 0.0}
    )
    for path in sorted(folder.glob("*.jsonl")):
        for line in path.read_text().splitlines():
            rec = json.loads(line)
            row = by_prog[f"{path.stem}:{rec['prog']}"]
            row["count"] += 1
            row["wall"] += rec["wall"]
            row["max"] = max(row["max"], rec["wall"])
    return dict(sorted(by_prog.items(), key=lambda kv: -kv[1]["wall"]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folder", type=Path)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rows = summarize(args.folder)
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    print("| pid:program | count | wall s | longest s |\n|---|---:|---:|---:|")
    for name, r in rows.items():
        print(f"| {name} | {r['count']:.0f} | {r['wall']:.1f} | {r['max']:.1f} |")


if __name__ == "__main__":
    main()
