"""benchmarks/gpt_fast_peer.py: its refusals, and its plumbing on CPU (--tiny).

gpt-fast's files are never in the repository. The tiny run uses them from
$GPT_FAST_DIR, or from .gpucache/gpt-fast/ at the repository root, and is skipped
when neither has them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "gpt_fast_peer.py"
GPT_FAST = Path(os.environ.get("GPT_FAST_DIR", REPO / ".gpucache" / "gpt-fast"))
needs_gpt_fast = pytest.mark.skipif(
    not all((GPT_FAST / f).is_file() for f in ("model.py", "generate.py")),
    reason=f"gpt-fast's model.py and generate.py are not in {GPT_FAST} (set GPT_FAST_DIR)",
)


def _script(*args: str | Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True, env=env
    )


def test_missing_gpt_fast_files_is_one_line_that_says_where_to_put_them(tmp_path: Path) -> None:
    (tmp_path / "model.py").write_text("")
    out = tmp_path / "out"
    p = _script("--tiny", "--out", out, "--gpt-fast-dir", tmp_path)
    assert p.returncode == 1
    assert p.stderr.count("\n") == 1 and p.stderr.startswith("error: gpt-fast's generate.py")
    assert str(tmp_path) in p.stderr and ".gpucache/gpt-fast" in p.stderr
    assert not out.exists()


@needs_gpt_fast
def test_a_config_that_does_not_match_the_recipe_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "out"
    p = _script("--out", out, "--recipe", "tiny-llama", "--gpt-fast-config", "7B",
                "--gpt-fast-dir", GPT_FAST)  # fmt: skip
    assert p.returncode == 1
    assert p.stderr == (
        "error: gpt-fast's ModelArgs '7B' do not match recipe tiny-llama: "
        "n_layer is 32, the recipe's n_layers is 2\n"
    )
    assert not out.exists()


@needs_gpt_fast
def test_tiny_run_times_both_loops_and_reports_the_ratios(tmp_path: Path) -> None:
    out = tmp_path / "out"
    p = _script("--tiny", "--out", out, "--gpt-fast-dir", GPT_FAST)
    assert p.returncode == 0, p.stderr
    report = json.loads((out / "gpt_fast_peer.json").read_text())
    g = report["gpt_fast"]
    assert "error" not in g
    assert len(g["tokens_per_sec"]) == 2 and g["compiled"] is False and g["compile_s"] is None
    assert g["average_tokens_per_sec"] == pytest.approx(sum(g["tokens_per_sec"]) / 2)
    # gpt-fast's figure: new tokens over each generate() call's wall time
    assert g["tokens_per_sec"] == pytest.approx([32 / t for t in g["request_s"]])
    assert len(g["first_tokens"]) == 8 and g["kv_slots"] == 40  # 6 + 32 rounded up to 8s
    # importing its generate.py applied its own Inductor settings
    assert g["inductor_settings"]["coordinate_descent_tuning"] is True
    (row,) = report["acache"]
    assert row["backend"] == "eager" and "error" not in row
    assert row["command"].startswith("acache bench tiny-llama --backend eager --device cpu")
    assert row["ratio_incl_prefill"] == pytest.approx(
        row["request_tok_s"] / g["average_tokens_per_sec"]
    )
    # A decode rate is None when timing noise leaves no time after the prefill.
    if row["decode_tok_s"] and g["decode_tok_s"]:
        assert row["ratio_decode"] == pytest.approx(row["decode_tok_s"] / g["decode_tok_s"])
    else:
        assert row["ratio_decode"] is None
    md = (out / "gpt_fast_peer.md").read_text()
    assert "| gpt-fast generate.py (eager) |" in md and "| acache eager |" in md
    assert p.stdout == md
