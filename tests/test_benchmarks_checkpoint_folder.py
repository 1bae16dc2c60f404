"""benchmarks/checkpoint_folder.py, the GPU evidence script, checked on CPU: the report
it derives from probe results. The whole script also runs end to end on CPU
(`--tiny --device cpu --allow-build`, its docstring)."""

from __future__ import annotations

import pytest
from _bench_scripts import load_script


@pytest.fixture(scope="module")
def cf():
    return load_script("checkpoint_folder")


def test_the_phases_of_a_probe_are_its_warm_start_segments(cf):
    result = {
        "built": False,
        "phases": {
            "imports_done": 3.0, "entry_ready": 3.2, "weights_ready": 4.6,
            "artifact_ready": 4.9, "first_result": 5.0,
        },
        "subphases": {"device_ready": 3.35, "weights_checked": 3.4, "weights_allocated": 3.5},
    }  # fmt: skip
    ph = cf.phases(result, nbytes=int(12.5e9))
    assert ph["lookup_s"] == pytest.approx(0.2) and ph["context_s"] == pytest.approx(0.15)
    assert ph["compiler_imports_s"] == pytest.approx(0.0)  # aoti: no compiler at load
    assert ph["weights_s"] == pytest.approx(1.25) and ph["weights_gbps"] == pytest.approx(10.0)
    assert ph["weights_read_s"] == pytest.approx(1.1)
    assert ph["ttft_over_imports_s"] == pytest.approx(2.0)
    # inductor imports Inductor (compiler_ready) before it creates the CUDA context.
    result["subphases"]["compiler_ready"] = 3.3
    ph = cf.phases(result, nbytes=int(12.5e9))
    assert ph["compiler_imports_s"] == pytest.approx(0.1) and ph["context_s"] == pytest.approx(0.05)


def test_the_report_renders_results_and_failures(cf):
    run = {
        "run": 1, "built": False, "imports_s": 3.0, "lookup_s": 0.2, "compiler_imports_s": 0.6,
        "context_s": 0.1,
        "weights_s": 1.0, "weights_gbps": 13.5, "artifact_s": 0.3, "first_token_s": 0.1,
        "ttft_s": 4.7, "ttft_over_imports_s": 1.7, "decode_tok_s": 180.0,
    }  # fmt: skip
    report = {
        "date": "d", "host": "h", "command": "c", "backend": "inductor",
        "checkpoint": {"folder": "/x", "tensor_bytes": 13.5e9, "shards": 4,
                       "page_cache_read": {"gbps": 9.0}},
        "sweep": [{"loader": "old", "seconds": [3.1], "gbps": [4.4], "best_gbps": 4.4},
                  {"loader": "new", "error": "RuntimeError: boom"}],
        "keys": {"folder": {"key": "a" * 64, "arch_key": "a" * 64}, "recipe": {"error": "no"}},
        "keys_equal": False,
        "probes": {"folder (TOML)": {"runs": [run], "decode_tok_s": 180.0},
                   "llama-7b --weights DIR": {"error": "probe failed: miss", "runs": []}},
    }  # fmt: skip
    md = cf.render(report)
    assert "| new | error: RuntimeError: boom |" in md
    assert "| folder (TOML) | 1 | no | 3.00 s | 0.20 s | 0.60 s | 0.10 s |" in md
    assert "| 13.5 |" in md and md.startswith(
        "# A checkpoint on disk: the folder path with inductor"
    )
    assert "llama-7b --weights DIR | – | error: probe failed: miss" in md
    assert "share one entry: **False**" in md
