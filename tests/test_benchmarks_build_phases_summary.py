"""benchmarks/build_phases_summary.py's table."""

from __future__ import annotations

import json
from pathlib import Path

from _bench_scripts import load_script


def test_the_table_has_a_row_per_record_with_its_bench(tmp_path: Path):
    summary = load_script("build_phases_summary")
    d = tmp_path / "call1"
    d.mkdir()
    secs = {"wall": 29.04, "prefill": 20.1, "extend": 20.2, "decode": 23.7}
    (d / "record-1-inductor.json").write_text(json.dumps({"compile_seconds": secs}))
    bench = {"decode_tok_s": 242.9, "roofline_pct": 75.43, "prefill_median_s": 0.0068}
    (d / "bench-1-inductor.json").write_text(json.dumps(bench))
    (d / "record-2-aoti.json").write_text(json.dumps({"compile_seconds": {"wall": 38.0}}))
    rows = summary.table([str(d)]).splitlines()
    assert rows[2] == "| call1 | 1-inductor | 29.0 | 20.1 | 20.2 | 23.7 | 242.9 | 75.4 | 6.8 |"
    assert rows[3] == "| call1 | 2-aoti | 38.0 | 0.0 | 0.0 | 0.0 | – | – | – |"  # no bench
