"""One line per build record or bench result, for build_phases_call.sh's log.

    python benchmarks/build_phases_summary.py record RECORD.json   # a build's phases
    python benchmarks/build_phases_summary.py bench BENCH.json     # acache bench --json
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


def main() -> None:
    kind, path = sys.argv[1], sys.argv[2]
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError) as e:
        sys.exit(f"{path}: {e}")
    print(record_line(data) if kind == "record" else bench_line(data))


if __name__ == "__main__":
    main()
