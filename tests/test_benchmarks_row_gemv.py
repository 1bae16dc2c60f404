"""benchmarks/row_gemv.py's tile summary: the fastest swept tile of each shape against
the default tile, from a run's rows (the summary needs no GPU; the timings do)."""

from __future__ import annotations

import json

import pytest
from _bench_scripts import load_script


def _rows() -> list[dict]:
    return [
        {"shape": "a", "kernel": "cublas", "us": 9.0, "pct_copy": 90.0},
        {"shape": "a", "kernel": "acache", "us": 12.0, "pct_copy": 70.0},
        {"shape": "a", "kernel": "acache@8x1024w4", "us": 10.0, "pct_copy": 84.0},
        {"shape": "a", "kernel": "acache@4x512w4", "us": 11.0, "pct_copy": 77.0},
        {"shape": "a", "kernel": "acache@1x2048w8", "error": "OutOfResources: smem"},
        {"shape": "b", "kernel": "acache", "us": 5.0, "pct_copy": 60.0},  # no sweep
        {"shape": "c", "kernel": "acache", "us": 4.0, "pct_copy": 80.0},
        {"shape": "c", "kernel": "acache@2x1024w4", "us": 4.4, "pct_copy": 72.0},
        {"shape": "c", "kernel": "int8_acache", "us": 3.0, "pct_copy": 70.0},
        {"shape": "c", "kernel": "int8_acache@4x1024w4", "us": 2.0, "pct_copy": 95.0},
    ]


def test_each_swept_shape_gets_its_fastest_tile_against_the_default():
    summary = load_script("row_gemv").tile_summary(_rows())
    assert summary == [
        {"shape": "a", "default_us": 12.0, "best": "8x1024w4", "best_us": 10.0,
         "speedup": 1.2, "best_pct_copy": 84.0},
        {"shape": "c", "default_us": 4.0, "best": "2x1024w4", "best_us": 4.4,
         "speedup": 0.909, "best_pct_copy": 72.0},
    ]  # fmt: skip


def test_int8_rows_are_summarized_apart_from_the_float_ones():
    summary = load_script("row_gemv").tile_summary(_rows(), "int8_acache")
    assert [(r["shape"], r["best"], r["speedup"]) for r in summary] == [("c", "4x1024w4", 1.5)]


def test_summary_of_a_saved_run_prints_without_a_gpu(tmp_path, capsys, monkeypatch):
    saved = tmp_path / "row_gemv.json"
    saved.write_text(json.dumps({"env": {}, "args": {}, "results": _rows()}))
    monkeypatch.setattr("sys.argv", ["row_gemv.py", "--summary", str(saved)])
    assert load_script("row_gemv").main() == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3 and "1.200x" in lines[0] and "1.500x" in lines[2]


@pytest.mark.parametrize("text", [None, "{not json", '{"env": {}}'])
def test_a_summary_of_what_is_no_run_is_one_line_and_exit_2(tmp_path, capsys, monkeypatch, text):
    saved = tmp_path / "row_gemv.json"
    if text is not None:
        saved.write_text(text)
    monkeypatch.setattr("sys.argv", ["row_gemv.py", "--summary", str(saved)])
    with pytest.raises(SystemExit) as exit_:
        load_script("row_gemv").main()
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "is no row_gemv.json" in err[-1] and "Traceback" not in "".join(err)


def test_out_or_summary_is_required_and_not_both(monkeypatch):
    script = load_script("row_gemv")
    for argv in ([], ["--out", "o", "--summary", "s"]):
        monkeypatch.setattr("sys.argv", ["row_gemv.py", *argv])
        with pytest.raises(SystemExit) as exit_:
            script.main()
        assert exit_.value.code == 2
