"""measure/bench.py: batch summaries, and the FLOP roofline beside the bandwidth one.
Counts are worked out by hand for Llama-2-7B, so a change in the counting shows as a
wrong number. The timed loops' tests are in test_measure_child_timing.py."""

from __future__ import annotations

import pytest

from artifactcache.errors import MeasureError
from artifactcache.measure import bench
from artifactcache.recipes import load_recipe

PARAMS_7B = 6_738_415_616 - 32000 * 4096  # Llama-2-7B without its input embedding table


def test_flops_per_step_llama_7b():
    rec = load_recipe("llama-7b")
    # 6 prompt tokens, 200 new: decode steps attend to 7 .. 205 positions, 106 on average.
    f = bench.flops_per_step(rec, "bf16", prompt_len=6, new_tokens=200)
    attention = 4 * 32 * 32 * 128 * 106  # QK^T and PV: layers x heads x head_dim x positions
    assert f["parameters"] == PARAMS_7B
    assert f["attention_per_row"] == attention
    assert f["total"] == 2 * PARAMS_7B + attention
    f32 = bench.flops_per_step(rec, "bf16", 32, prompt_len=6, new_tokens=200)
    assert f32["total"] == 32 * (2 * PARAMS_7B + attention)


def test_bandwidth_binds_batch_1_and_compute_a_large_batch():
    rec = load_recipe("llama-7b")
    bw, peak = 4000.0, 900.0  # GB/s and dense TFLOP/s of an H200-class GPU
    # A short context, so the weights dominate the bytes: each row adds 2 FLOPs per
    # parameter but few bytes, and a large enough batch turns the step compute-bound.
    for batch, want in ((1, "bandwidth"), (32, "bandwidth"), (512, "compute")):
        b = bench.bytes_per_token(rec, "bf16", batch, prompt_len=6, new_tokens=2)
        f = bench.flops_per_step(rec, "bf16", batch, prompt_len=6, new_tokens=2)
        assert bench.roofline_bound(b["total"], f["total"], bw, peak) == want, batch
    assert bench.roofline_bound(1, 1, None, peak) is None  # nothing measured: not guessed
    got = bench.flop_roofline(2 * 10**12, 50.0, 400.0)
    assert got == {"achieved_tflops": pytest.approx(100.0), "flop_roofline_pct": pytest.approx(25)}
    assert bench.flop_roofline(10, None, 400.0)["flop_roofline_pct"] is None


def _probe(batch: int, step_s: list[float] | None) -> dict:
    return {
        "prompt_len": 6,
        "steady": {"request_s": [1.0, 1.2], "prefill_s": [0.1, 0.1], "new_tokens": 11,
                   "batch": batch, "step_s": step_s},
        "copy_bandwidth": {"gbps": 10.0},
        "matmul_flops": {"tflops": 0.5},
    }  # fmt: skip


def test_a_batch_summary_counts_per_request_and_aggregate():
    rec = load_recipe("tiny-llama").with_shapes(max_batch=4)
    one = bench.summarize(rec, "fp32", [_probe(1, None)])
    four = bench.summarize(rec, "fp32", [_probe(4, [0.01, 0.02, 0.03])])
    # The same timings: per request the same, four times the tokens in aggregate.
    assert four["decode_tok_s"] == one["decode_tok_s"] == pytest.approx(10 / 1.0)
    assert four["aggregate_decode_tok_s"] == pytest.approx(4 * four["decode_tok_s"])
    assert (four["batch"], four["max_batch"], one["batch"]) == (4, 4, 1)
    assert four["step"]["p50"] == pytest.approx(0.02) and one["step"] is None
    kv_one = one["bytes_per_token"]["kv_read"]
    assert four["bytes_per_token"]["kv_read"] == 4 * kv_one
    assert four["achieved_gbps"] == pytest.approx(four["bytes_per_token"]["total"] * 10 / 1e9)
    flops = four["flops_per_step"]["total"]
    assert four["flop_roofline_pct"] == pytest.approx(100 * flops * 10 / 1e12 / 0.5)
    assert four["roofline_bound"] in ("bandwidth", "compute")


@pytest.mark.parametrize(
    ("text", "needle"),
    [("1,x", "batch sizes separated by commas"), ("", "at least one batch size"),
     ("0", "at least 1, got 0"), ("8,8", "names a size twice")],
)  # fmt: skip
def test_batch_lists_parse_or_fail_in_one_line(text, needle):
    with pytest.raises(MeasureError, match=needle):
        bench.parse_batches(text)
    assert bench.parse_batches(" 1, 8,32 ") == [1, 8, 32]


def test_a_model_specs_batches_parse_or_fail_in_one_line():
    assert bench.parse_module_batches(None) == [None]  # the inputs' own batch
    assert bench.parse_module_batches("1, 32,1") == [1, 32]
    for text, needle in (("1,x", "integers like 1,32"), ("0", "at least 1"), (",", "at least 1")):
        with pytest.raises(MeasureError, match=needle):
            bench.parse_module_batches(text)
