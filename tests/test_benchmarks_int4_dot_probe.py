"""benchmarks/int4_dot_probe.py: its kernel compiles for sm_90 here (Triton's own ptxas and
nvdisasm, no GPU) and its loop is counted; a GPU run without --out is one line."""

from __future__ import annotations

import pytest
from _bench_scripts import load_script


def test_the_probe_compiles_for_hopper_and_counts_its_loop():
    pytest.importorskip("triton.backends.nvidia")
    probe = load_script("int4_dot_probe")
    try:
        (row,) = probe.sass_counts([(64, 4)])
    except (FileNotFoundError, RuntimeError) as e:  # a Triton without its CUDA tools
        pytest.skip(f"Triton cannot compile for sm_90 here: {e}")
    assert row["tile"] == "64x128" and row["warps"] == 4
    assert row["ops"].get("HMMA", 0) > 0  # the tensor-core dot is in the loop
    assert 0 < row["per_weight"] < 20


def test_the_split_k_form_compiles_with_its_dot_too():
    pytest.importorskip("triton.backends.nvidia")
    probe = load_script("int4_dot_probe")
    try:
        (row,) = probe.split_sass_counts([(32, 4)], stages=3)
    except (FileNotFoundError, RuntimeError) as e:  # a Triton without its CUDA tools
        pytest.skip(f"Triton cannot compile for sm_90 here: {e}")
    assert row["form"] == "split" and row["stages"] == 3 and row["tile"] == "32x128"
    assert row["ops"].get("HMMA", 0) > 0
    assert 0 < row["per_weight"] < 20


def test_acache_s_own_int4_loop_is_counted_beside_it():
    pytest.importorskip("triton.backends.nvidia")
    probe = load_script("int4_dot_probe")
    try:
        (row,) = probe.acache_sass_counts([(8, 256, 4)], int8=False)
    except (FileNotFoundError, RuntimeError) as e:  # a Triton without its CUDA tools
        pytest.skip(f"Triton cannot compile for sm_90 here: {e}")
    assert row["tile"] == "8x256" and "HMMA" not in row["ops"]  # CUDA cores
    assert 0 < row["per_weight"] < 20


def test_acache_s_int8_loop_loads_whole_words_and_casts_in_fewer_instructions():
    """As launched (K a multiple of 16), the int8 loop reads its weights in wide loads,
    not a byte at a time, and the inline PTX cast makes it shorter than the byte-at-a-
    time form compiled beside it."""
    pytest.importorskip("triton.backends.nvidia")
    probe = load_script("int4_dot_probe")
    try:
        (ptx,) = probe.acache_sass_counts([(8, 1024, 4)], int8=True)
        (bytewise,) = probe.acache_sass_counts([(8, 1024, 4)], int8=True, int8_ptx=False)
    except (FileNotFoundError, RuntimeError) as e:  # a Triton without its CUDA tools
        pytest.skip(f"Triton cannot compile for sm_90 here: {e}")
    assert ptx["ops"].get("LDG", 0) < 10  # 64 weights a thread in 16-byte loads
    assert ptx["per_weight"] < bytewise["per_weight"]


def test_a_gpu_run_without_out_is_one_line(monkeypatch, capsys):
    pytest.importorskip("triton")
    probe = load_script("int4_dot_probe")
    monkeypatch.setattr("sys.argv", ["int4_dot_probe.py"])
    assert probe.main() == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--out" in err
