"""benchmarks/user_kernel_analysis.py: Inductor's analysis of the row GEMV's phi-2 call
sites runs here (Triton's target set to sm_90, no GPU) and finds the kernel writing its
output alone (anything more would make Inductor copy those inputs first)."""

from __future__ import annotations

import json

import pytest
from _bench_scripts import load_script


def test_each_phi2_call_site_is_analysed_and_writes_only_its_output(monkeypatch, capsys):
    pytest.importorskip("triton.backends.nvidia")
    script = load_script("user_kernel_analysis")
    monkeypatch.setattr(
        "sys.argv", ["user_kernel_analysis.py", "--repeat", "2", "--compile", "--json"]
    )
    try:
        assert script.main() == 0
    except (RuntimeError, ImportError) as e:  # a Triton that cannot make TTIR for sm_90
        pytest.skip(f"Triton cannot analyse for sm_90 here: {e}")
    doc = json.loads(capsys.readouterr().out)
    assert [s["site"].split()[0] for s in doc["sites"]] == ["phi2_in", "phi2_out", "phi2_head"]
    for site in doc["sites"]:
        assert site["writes"] == ["Y"]
        assert site["first_ms"] > 0 and site["median_after_ms"] > 0
    in_proj, out_proj, head = (site["compile_s"] for site in doc["sites"])
    assert in_proj > 0 and out_proj > 0
    assert head < in_proj  # the LM head is the in-projection's kernel: found compiled
