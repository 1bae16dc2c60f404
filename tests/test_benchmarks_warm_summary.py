"""benchmarks/warm_summary.py: the table it makes of startup_diag.py warm's output."""

from __future__ import annotations

import json

from _bench_scripts import load_script


def test_each_process_is_a_row_of_seconds_after_its_imports(tmp_path, capsys):
    ws = load_script("warm_summary")
    inductor = {
        "run": "inductor",
        "phases": {"imports_done": 1.0, "entry_ready": 1.25, "weights_ready": 1.5,
                   "artifact_ready": 3.0, "first_result": 3.5},
        "subphases": {"compiler_ready": 2.0, "steps_opened": 2.75},
        "compile": {"triton_compiles": 0},
    }  # fmt: skip
    eager = {"run": "eager", "phases": {"imports_done": 1.0, "first_result": 1.5}}
    out = tmp_path / "warm.json"
    # As startup_diag writes it: one object per process, then the summary object.
    failed = {"run": "inductor", "phases": None, "error": "probe exited 1"}
    summary = {"what": "warm", "inductor": [inductor, failed]}  # written with indent=1
    out.write_text(
        "\n".join(
            [*(json.dumps(o) for o in (inductor, eager, failed)), json.dumps(summary, indent=1)]
        )
    )
    assert [p["run"] for p in ws.processes(out)] == ["inductor", "eager", "inductor"]
    assert ws.main([str(out)]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| warm")]
    cells = [c.strip() for c in rows[0].strip("|").split("|")]
    columns = ["file", "process", "imports", *(c for c, _ in ws.STAMPS), "Triton compiles"]
    got = dict(zip(columns, cells, strict=True))
    assert got["imports"] == "1.00" and got["key + lookup"] == "0.25"
    assert got["Inductor imported"] == "1.00" and got["decode deserialized"] == "1.75"
    assert got["first result"] == "2.50" and got["Triton compiles"] == "0"
    assert got["kernels installed"] == "–"  # a stamp this process did not make
    assert rows[1].split("|")[-2].strip() == "–"  # eager counts no Triton compiles
    assert "failed: probe exited 1" in rows[2]
