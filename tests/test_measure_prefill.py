"""measure/prefill.py: --prompt-len parsing and fit, the prompts, the prefill FLOP count
(worked out by hand for Llama-2-7B, so a change in the counting shows as a wrong number)
and the pooled per-length results. The timed loop is in test_measure_child_timing.py; a
real run in test_cli_measure.py."""

from __future__ import annotations

import pytest

from artifactcache.errors import AcacheError, MeasureError, ShapeError
from artifactcache.measure import prefill
from artifactcache.recipes import load_recipe

PARAMS_7B = 6_738_415_616 - 32000 * 4096  # Llama-2-7B without its input embedding table


def test_prefill_flops_llama_7b_by_hand():
    # 2000 tokens: every weight is a multiply-add per token; QK^T and PV over the
    # 2000^2 / 2 (query, key) pairs a causal mask keeps, per head and layer.
    # The LM head (32000 x 4096) is one multiply-add for the last position only.
    n, head = 2000, 32000 * 4096
    linear = 2 * (PARAMS_7B - head) * n + 2 * head
    attention = 4 * 32 * n * n * 32 * 128 // 2  # 4 x layers x L^2 x heads x head_dim / 2
    got = prefill.prefill_flops(PARAMS_7B, 32, 32, 128, n, lm_head=head)
    assert got == {"parameters": PARAMS_7B, "linear": linear, "attention": attention,
                   "total": linear + attention}  # fmt: skip
    assert got["total"] == 26_429_374_464_000 - 2 * head * (n - 1) + 1_048_576_000_000
    # The recipe's own count: its parameters, layers and heads from llama-7b.toml.
    assert prefill.recipe_prefill_flops(load_recipe("llama-7b"), "bf16", n) == got


def test_a_sliding_window_caps_the_pairs_a_query_sees():
    # 8 tokens, window 4: 4 x 8 - 4^2 / 2 = 24 pairs (the causal 8^2 / 2 = 32 without it).
    assert prefill.prefill_flops(10, 1, 1, 1, 8, sliding_window=4)["attention"] == 4 * 24
    assert prefill.prefill_flops(10, 1, 1, 1, 8)["attention"] == 4 * 32
    assert prefill.prefill_flops(10, 1, 1, 1, 8, sliding_window=100)["attention"] == 4 * 32
    assert prefill.prefill_flops(10, 1, 1, 1, 8)["linear"] == 2 * 10 * 8


@pytest.mark.parametrize(
    ("text", "needle"),
    [("16,x", "separated by commas"), ("1.5", "separated by commas"), (",", "at least one"),
     ("0,16", "at least 1, got 0"), ("-3", "at least 1, got -3"),
     ("16,16", "names a length twice")],
)  # fmt: skip
def test_prompt_lens_parse_or_fail_in_one_line(text, needle):
    with pytest.raises(MeasureError, match=needle) as ei:
        prefill.parse_prompt_lens(text)
    assert "\n" not in str(ei.value)
    assert prefill.parse_prompt_lens(" 16, 128,512 ") == [16, 128, 512]
    assert prefill.parse_prompt_lens("512,16") == [512, 16]  # the order given


def test_a_length_must_leave_the_first_new_token_a_position():
    tiny = load_recipe("tiny-llama")  # max_seq_len 64
    prefill.check_prompt_lens(tiny, [1, 16, 63])
    with pytest.raises(ShapeError, match="--prompt-len 64 does not fit.*max_seq_len 64"):
        prefill.check_prompt_lens(tiny, [16, 64])
    with pytest.raises(AcacheError, match="at least 1, got 0"):
        prefill.check_prompt_lens(tiny, [0])
    prefill.check_prompt_lens(tiny.with_shapes(max_seq_len=128), [127])  # --max-seq-len


def test_the_prompt_of_a_length_is_the_bench_prompt_tiled():
    rec = load_recipe("tiny-llama")
    ids = list(rec.bench.prompt_ids)  # 6 ids
    assert prefill.prompt_of_length(rec, 4) == ids[:4]
    assert prefill.prompt_of_length(rec, 16) == ids + ids + ids[:4]
    long = prefill.prompt_of_length(rec, 4000)
    assert len(long) == 4000 and all(0 <= t < rec.model.vocab_size for t in long)
    assert prefill.prompt_of_length(rec, 4000) == long  # deterministic


def test_results_pool_the_probes_per_length():
    rec = load_recipe("tiny-llama")
    probes = [
        {"ttft": [{"prompt_len": 4, "ttft_s": [0.1, 0.3]}, {"prompt_len": 16, "ttft_s": [0.4]}]},
        {"ttft": [{"prompt_len": 4, "ttft_s": [0.2]}, {"prompt_len": 16, "ttft_s": [0.5]}]},
    ]
    four, sixteen = prefill.summarize_prompt_lens(rec, "fp32", probes, gemm_tflops=0.5)
    assert (four["prompt_len"], four["iterations"], four["ttft_s"]) == (4, 3, [0.1, 0.3, 0.2])
    assert four["ttft_p50_s"] == four["ttft"]["p50"] == pytest.approx(0.2)
    assert (four["ttft"]["min"], four["ttft"]["max"]) == (0.1, 0.3)
    assert four["prefill_tok_s"] == pytest.approx(4 / 0.2)
    flops = prefill.recipe_prefill_flops(rec, "fp32", 4)["total"]
    assert four["prefill_flops"]["total"] == flops
    assert four["achieved_tflops"] == pytest.approx(flops / 0.2 / 1e12)
    assert four["flop_roofline_pct"] == pytest.approx(100 * flops / 0.2 / 1e12 / 0.5)
    assert sixteen["ttft_p50_s"] == pytest.approx(0.45)
    # No GEMM rate measured: no % (never a guessed peak); no lengths measured: no rows.
    assert prefill.summarize_prompt_lens(rec, "fp32", probes, None)[0]["flop_roofline_pct"] is None
    assert prefill.summarize_prompt_lens(rec, "fp32", [{}], 0.5) == []


def test_each_lengths_first_request_is_the_median_over_the_probes():
    rec = load_recipe("tiny-llama")
    probes = [{"ttft": [{"prompt_len": 4, "ttft_s": [0.1], "first_s": f}]} for f in (0.9, 0.3, 0.5)]
    probes.append({"ttft": [{"prompt_len": 4, "ttft_s": [0.1]}]})  # an older probe: none
    (four,) = prefill.summarize_prompt_lens(rec, "fp32", probes, gemm_tflops=None)
    assert four["ttft_first_s"] == pytest.approx(0.5)
    old = [{"ttft": [{"prompt_len": 4, "ttft_s": [0.1]}]}]
    assert prefill.summarize_prompt_lens(rec, "fp32", old, None)[0]["ttft_first_s"] is None
