"""benchmarks/decode_table.py: issue 32's table from decode_step.py's results."""

from __future__ import annotations

import json
from pathlib import Path

from _bench_scripts import load_script


def _row(variant: str, tok_s: float | None, pct: float | None, **kw) -> dict:
    backend = variant.split("+")[0]
    row = {"variant": variant, "backend": backend, "mode": None, "extra": {}, "quant": None,
           "batch": 1, "max_seq_len": 0, "wall_s": 10.0}  # fmt: skip
    row.update(kw)
    if tok_s is None:
        row["error"] = "error: the build failed\nmore"
    else:
        row.update(
            decode_tok_s=tok_s, roofline_pct=pct, aggregate_decode_tok_s=tok_s * row["batch"]
        )
    return row


def _write(folder: Path, recipe: str, rows: list[dict]) -> None:
    path = folder / recipe / "decode_step.json"
    path.parent.mkdir(parents=True)
    command = f"decode_step.py {recipe} --out {path.parent} --variants x"
    path.write_text(json.dumps({"command": command, "date": "d", "host": "h", "rows": rows}))


def _table(out: str, title: str) -> dict[str, list[str]]:
    """The rows of one printed table, by their first cell."""
    part = out.split(f"### {title}")[1].split("###")[0]
    rows = [line for line in part.splitlines() if line.startswith("| ") and "---" not in line]
    return {r.split("|")[1].strip(): [c.strip() for c in r.strip("|").split("|")] for r in rows[1:]}


def test_targets_gaps_and_same_run_ratios(tmp_path, capsys):
    dt = load_script("decode_table")
    one, two = tmp_path / "one", tmp_path / "two"
    _write(one, "llama-7b", [
        _row("aoti", 200.0, 86.0), _row("inductor", 199.0, 85.5),
        _row("inductor+quant=int8wo", 330.0, 73.0, quant="int8wo"),
        _row("inductor+max_batch=8", 170.0, 76.8, batch=8),
        _row("inductor+split_kv_rope=1", 201.0, 86.1, extra={"split_kv_rope": "1"}),
        # Neither is a default build, nor the int8wo row's twin.
        _row("inductor+max_seq_len=4096", 150.0, 60.0, max_seq_len=4096),
        _row("aoti:max-autotune", 180.0, 78.0, mode="max-autotune"),
    ])  # fmt: skip
    _write(one, "phi-2", [_row("aoti", 429.0, 75.2), _row("inductor", None, None)])
    # Another run's int4wo: its bf16 row is in another file, so no ratio is made.
    _write(two, "llama-7b", [_row("inductor+quant=int4wo", 380.0, 60.0, quant="int4wo")])
    _write(two, "phi-3-mini", [_row("aoti", 320.0, 79.0), _row("inductor", 311.0, 76.6)])
    assert dt.main([str(one), str(two)]) == 0
    out = capsys.readouterr().out
    seed = _table(out, "Seed models")
    assert seed["llama-7b"][1:] == ["200.0 (86.0%)", "199.0 (85.5%)", "0.5", "85%", "met"]
    assert seed["phi-3-mini"][3:] == ["2.4", "80%", "**missed**"]  # 76.6% < 80%
    assert seed["phi-2"][2] == "error: the build failed"
    assert seed["phi-2"][5] == "**missed** (a build or run failed)"
    assert seed["mistral-7b"][1] == "not measured"
    batches = _table(out, "Batches")
    assert batches["llama-7b, inductor+max_batch=8"][1:] == ["8", "1360.0", "76.8", "met"]
    quant = _table(out, "Quantized")
    assert quant["llama-7b, inductor+quant=int8wo"][1:] == [
        "330.0", "199.0", "1.658x", "1.6x", "met"
    ]  # fmt: skip
    assert quant["llama-7b, inductor+quant=int4wo"][1] == "no unquantized row in its run"
    assert f"- {one / 'llama-7b' / 'decode_step.json'}: d, host h" in out


def test_an_empty_table_says_so(tmp_path, capsys):
    dt = load_script("decode_table")
    _write(tmp_path, "phi-2", [_row("aoti", 429.0, 75.2)])
    assert dt.main([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.split("### Batches")[1].split("###")[0].strip() == "none in these folders"


def test_a_missing_or_empty_folder_is_one_line(tmp_path, capsys):
    dt = load_script("decode_table")
    assert dt.main([str(tmp_path / "nowhere")]) == 1
    assert capsys.readouterr().err.strip() == f"error: not a folder: {tmp_path / 'nowhere'}"
    assert dt.main([str(tmp_path)]) == 1
    assert "no decode_step.json" in capsys.readouterr().err
