"""benchmarks/kv_positions.py: its windows and table, and one end-to-end CPU run (eager)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from _bench_scripts import load_script

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "kv_positions.py"


@pytest.fixture(scope="module")
def kvp():
    return load_script("kv_positions")


def test_windows_are_centred_and_must_fit_the_context(kvp):
    assert kvp.windows_for([200, 1000, 4000], 64, 4096) == [
        [200, 168, 64], [1000, 968, 64], [4000, 3968, 64],
    ]  # fmt: skip
    assert kvp.windows_for([200, 1000, 4000], 64, 256) == [[200, 168, 64]]
    assert kvp.windows_for([10], 64, 256) == [[10, 1, 64]]  # a prefill needs a token
    assert kvp.windows_for([250], 16, 256) == []  # 242 + 16 > 256


def test_the_table_compares_the_first_context_with_the_last(kvp):
    def window(start, tok_s, pct=None):
        return {"position": start + 8, "start": start, "tokens": 16, "tok_s": tok_s,
                "roofline_pct": pct}  # fmt: skip

    seed = {"start": 6, "tokens": 199, "tok_s": 90.0, "roofline_pct": 60.0}
    report = {
        "settings": {"backends": ["aoti"], "max_seq_lens": [4096, 256]},
        "results": [
            {"backend": "aoti", "max_seq_len": 4096, "seed": seed,
             "windows": [window(168, 99.0, 66.0), window(3968, 80.0, 70.0)]},
            {"backend": "aoti", "max_seq_len": 256, "seed": {**seed, "tok_s": 100.0},
             "windows": [window(168, 100.0)]},
        ],
    }  # fmt: skip
    lines = kvp.table(report)
    assert lines[0] == (
        "| backend | decode positions | tok/s @4096 | tok/s @256 | @4096 vs @256 "
        "| % roofline @4096 |"
    )
    assert "| aoti | 6-204 (seed) | 90.0 | 100.0 | -10.0% | 60.0 |" in lines
    assert "| aoti | 168-183 | 99.0 | 100.0 | -1.0% | 66.0 |" in lines
    assert "| aoti | 3968-3983 | 80.0 |  |  | 70.0 |" in lines


def test_bad_lists_are_refused(kvp):
    for text in ("4096,x", "0,256", ""):
        with pytest.raises(Exception, match="expected"):
            kvp.parse_ints(text)


def test_a_cpu_run_builds_measures_and_reports(tmp_path: Path):
    """eager on tiny-llama: every step of the script but a compile."""
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    p = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(out), "--recipe", "tiny-llama", "--device",
         "cpu", "--dtype", "fp32", "--backends", "eager", "--max-seq-lens", "64,32",
         "--positions", "20,40", "--tokens", "4", "--iters", "1"],
        capture_output=True, text=True, env=env, timeout=600,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr[-3000:]
    report = json.loads((out / "kv_positions.json").read_text())
    assert [b["ok"] for b in report["builds"]] == [True, True]
    by_len = {r["max_seq_len"]: r for r in report["results"]}
    assert [w["start"] for w in by_len[64]["windows"]] == [18, 38]
    assert [w["start"] for w in by_len[32]["windows"]] == [18]  # 38 + 4 > 32
    for r in by_len.values():
        # The seed's rate is its requests' time after the prefill over 3 new tokens: on a
        # busy machine timing noise can leave no time after the prefill, and the rate is
        # then None (measure_requests), never a wrong number. The windows time decode alone.
        assert r["seed"]["tok_s"] is None or r["seed"]["tok_s"] > 0
        assert all(w["tok_s"] > 0 for w in r["windows"])
    assert "| eager | 18-21 |" in p.stdout
