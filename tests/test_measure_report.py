"""Report rendering from constructed results; bench arithmetic."""

from __future__ import annotations

import pytest
from PIL import Image

from artifactcache.measure import bench, charts, coldstart, report, report_rows, stats
from artifactcache.recipes import load_recipe


def _probe(first: float, req: float, pre: float, compiled: bool, gbps: float = 10.0) -> dict:
    names = coldstart.PHASE_ORDER
    phases = {k: first * (i + 1) / (len(names) - 1) for i, k in enumerate(names)}
    phases["first_result"] = first
    return {
        "phases": phases,
        "steady": {"request_s": [req, req * 1.1], "prefill_s": [pre, pre], "new_tokens": 8},
        "compile": {"compiled": compiled},
        "built": compiled,
        "memory": {"peak_rss_bytes": 1 << 30},
        "copy_bandwidth": {"gbps": gbps},
    }


def _pair(recipe, runs):
    return {
        "status": "ok",
        "runs": runs,
        "coldstart": coldstart.summarize(runs),
        "bench": bench.summarize(recipe, "fp32", runs.get("warm") or runs["eager"]),
    }


@pytest.fixture
def constructed():
    rec = load_recipe("tiny-llama")
    eager = {"eager": [_probe(4.0, 0.3, 0.05, False)]}
    ind = {"cold": [_probe(60.0, 0.1, 0.01, True)], "warm": [_probe(8.0, 0.1, 0.01, False)]}
    with_eager = dict(ind, eager=eager["eager"])
    ind_pair = _pair(rec, with_eager)
    ind_pair["runs"] = ind
    return {
        "created": "2026-01-01T00:00:00+00:00",
        "command": "acache compare ...",
        "recipes": ["tiny-llama"],
        "backends": ["eager", "inductor", "trt"],
        "settings": {
            "device": "cpu",
            "dtype": "fp32",
            "seed": 0,
            "runs": 1,
            "iters": 2,
            "warmup": 1,
            "new_tokens_label": "8",
            "modes": {},
        },
        "environment": {"python": "3.11", "torch": "2.13"},
        "pairs": {
            "tiny-llama/eager": _pair(rec, eager),
            "tiny-llama/inductor": ind_pair,
            "tiny-llama/trt": {
                "status": "skipped",
                "reason": "TensorRT unavailable on this machine",
            },
        },
        "baselines": {
            "tiny-llama": {"status": "ok", "runs": eager, "coldstart": coldstart.summarize(eager)}
        },
    }


def test_markdown_has_seed_table_and_reasons(constructed):
    md = report.render_markdown(constructed, [])
    assert "| model | eager | inductor | trt |" in md
    assert "not run: TensorRT unavailable on this machine" in md
    # decode tok/s = (N - 1) / (median request - median prefill) = 7 / (0.105 - 0.01)
    assert f"{7 / (0.105 - 0.01):.1f} tok/s" in md
    be = constructed["pairs"]["tiny-llama/inductor"]["coldstart"]["break_even_warm"]
    assert be["verdict"] == "after" and f"{be['requests']:.1f} req" in md
    assert "8.0x" not in md and "7.5x" in md  # cold/warm = 60 / 8


def test_write_report_pngs_open(constructed, tmp_path):
    paths = report.write_report(constructed, tmp_path)
    names = {p.name for p in paths}
    assert {"report.json", "report.md", "tokens_per_s.png", "phases.png"} <= names
    for png in ("tokens_per_s.png", "phases.png"):
        with Image.open(tmp_path / png) as im:
            im.verify()
            assert im.format == "PNG"


def test_findings_flag_a_warm_run_that_compiled(constructed):
    pair = constructed["pairs"]["tiny-llama/inductor"]
    pair["coldstart"]["scenarios"]["warm"]["compiled"] = [True]
    assert any("a warm run compiled" in f for f in report.findings(constructed))


def test_percentiles_match_numpy():
    np = pytest.importorskip("numpy")
    xs = [0.3, 0.1, 0.7, 0.2, 0.9, 0.4, 0.15]
    for q in (0, 50, 90, 99, 100):
        assert stats.percentile(xs, q) == pytest.approx(float(np.percentile(xs, q)))


def test_bytes_per_token_llama_7b():
    rec = load_recipe("llama-7b")
    b = bench.bytes_per_token(rec, "bf16")
    params = 6_738_415_616  # Llama-2-7B's published parameter count
    embed = 32000 * 4096
    assert b["weights"] == (params - embed) * 2
    per_position = 2 * 32 * 32 * 128 * 2  # K and V, 32 layers, 32 kv heads, head_dim 128, bf16
    # 6 prompt tokens, 200 new: decode steps attend to 7 .. 205 positions, 106 on average.
    assert b["kv_mean_positions"] == 106
    assert b["kv_read"] == per_position * 106
    assert b["kv_allocated_bytes"] == per_position * 256
    assert b["total"] == b["weights"] + b["kv_read"]
    rl = bench.roofline(b["total"], 200.0, 4271.0)
    assert rl["roofline_tok_s"] == pytest.approx(4271e9 / b["total"])
    assert rl["roofline_pct"] == pytest.approx(100 * 200 / rl["roofline_tok_s"])


def test_new_tokens_default_caps_to_kv_cache_and_explicit_must_fit():
    from artifactcache.errors import ShapeError

    rec = load_recipe("tiny-llama")  # max_seq_len 64, 6 prompt tokens
    assert bench.resolve_new_tokens(rec, None) == 58
    assert bench.resolve_new_tokens(load_recipe("llama-7b"), None) == 200
    with pytest.raises(ShapeError):
        bench.resolve_new_tokens(rec, 100)
    with pytest.raises(ShapeError):
        bench.check_batch(rec, 2)


def test_peak_gpu_shows_cold_and_warm_apart_and_cpu_runs_render(constructed):
    lines = report.detail_table(constructed)
    ind = next(ln for ln in lines if ln.startswith("| tiny-llama | inductor |"))
    assert ind.endswith("| – / – |")  # CPU probes have no device memory
    eager = next(ln for ln in lines if ln.startswith("| tiny-llama | eager |"))
    assert eager.endswith("| – |")
    sc = constructed["pairs"]["tiny-llama/inductor"]["coldstart"]["scenarios"]
    sc["cold"]["peak_device_allocated_bytes"] = 2 * 2**30
    sc["warm"]["peak_device_allocated_bytes"] = 2**30
    ind = next(
        ln for ln in report.detail_table(constructed) if ln.startswith("| tiny-llama | inductor |")
    )
    assert ind.endswith("| 2.0 GiB / 1.0 GiB |")


def test_prompt_lengths_get_a_table_and_a_ttft_chart(constructed, tmp_path):
    assert report.prompt_len_table(constructed) == []  # none measured: no section, no chart
    assert not charts.chart_ttft(constructed, tmp_path / "none.png")
    rec = load_recipe("tiny-llama")
    warm = _probe(8.0, 0.1, 0.01, False)
    warm["ttft"] = [
        {"prompt_len": 4, "ttft_s": [0.002]},  # a probe of an older report: no first_s
        {"prompt_len": 16, "ttft_s": [0.008], "first_s": 0.25},
    ]
    warm["matmul_flops"] = {"tflops": 0.5, "n": 1024}
    pair = constructed["pairs"]["tiny-llama/inductor"]
    pair["bench"] = bench.summarize(rec, "fp32", [warm])
    rows = report.prompt_len_table(constructed)
    assert len(rows) == 2 + 2  # header, rule, one row per length
    assert "| tiny-llama | inductor | 4 | 2.00 ms (2.00–2.00) | – | 2000 |" in rows[-2]
    assert "| tiny-llama | inductor | 16 | 8.00 ms (8.00–8.00) | 250.00 ms | 2000 |" in rows[-1]
    paths = report.write_report(constructed, tmp_path)
    assert tmp_path / "ttft_by_prompt_len.png" in paths
    with Image.open(tmp_path / "ttft_by_prompt_len.png") as im:
        im.verify()
    assert "## Time to first token by prompt length" in (tmp_path / "report.md").read_text()


def test_a_recipe_given_as_a_path_keeps_its_bars(constructed, tmp_path):
    """A pair's key is "recipe/backend"; a recipe path has slashes of its own."""
    path = "recipes/tiny-llama.toml"
    constructed["recipes"] = [path]
    constructed["pairs"] = {
        k.replace("tiny-llama", path, 1): v for k, v in constructed["pairs"].items()
    }
    pairs = report_rows.ok_pairs(constructed)
    assert {(r, b) for r, b, _ in pairs} >= {(path, "eager"), (path, "inductor")}
    assert charts.chart_tokens(constructed, tmp_path / "tokens.png")


def test_findings_say_what_a_warm_run_compiled_and_when_warm_outputs_differ(constructed):
    rec = load_recipe("tiny-llama")
    warm = [_probe(8.0, 0.1, 0.01, False), _probe(8.2, 0.1, 0.01, True)]
    warm[1]["compile"].update(triton_compiles=13, kernel_benchmarks=4)
    for p, toks in zip(warm, ([1, 2, 3], [1, 2, 4]), strict=True):
        p["first_token"], p["steady"]["tokens"] = toks[0], toks
    runs = {"cold": [_probe(60.0, 0.1, 0.01, True)], "warm": warm}
    constructed["pairs"]["tiny-llama/inductor"] = _pair(rec, runs)
    sc = constructed["pairs"]["tiny-llama/inductor"]["coldstart"]["scenarios"]["warm"]
    assert sc["outputs_agree"] is False
    found = "\n".join(report.findings(constructed))
    assert "nothing counted; 13 Triton kernels, 4 kernel timings for tuning" in found
    assert "greedy tokens differ" in found
    warm[1]["steady"]["tokens"] = [1, 2, 3]
    assert coldstart.outputs_agree(warm) is True
    assert coldstart.outputs_agree(warm[:1]) is None  # one process agrees with nothing


def test_warm_runs_are_checked_against_the_build_that_made_their_entry(constructed):
    """Warm run i loads cold run i's entry: differing from it is a broken warm start;
    differing only from the other warm runs is two builds that tuned differently."""
    rec = load_recipe("tiny-llama")
    cold = [_probe(60.0, 0.1, 0.01, True), _probe(61.0, 0.1, 0.01, True)]
    warm = [_probe(8.0, 0.1, 0.01, False), _probe(8.2, 0.1, 0.01, False)]
    for p, toks in zip(cold + warm, ([1, 2, 3], [1, 2, 4]) * 2, strict=True):
        p["first_token"], p["steady"]["tokens"] = toks[0], list(toks)
    constructed["pairs"]["tiny-llama/inductor"] = _pair(rec, {"cold": cold, "warm": warm})
    sc = constructed["pairs"]["tiny-llama/inductor"]["coldstart"]["scenarios"]["warm"]
    assert sc["matches_build"] == [True, True] and sc["outputs_agree"] is False
    found = "\n".join(report.findings(constructed))
    assert "builds of this key gave different greedy tokens" in found
    assert "differ from one another" not in found and "does not reproduce" not in found
    warm[1]["entry_primed"] = True  # a resumed run's warm 2 loaded an entry built for it
    assert coldstart.matches_build(cold, warm) == [True, None]
    del warm[1]["entry_primed"]
    warm[1]["steady"]["tokens"] = [1, 2, 5]  # warm 2 is not what cold 2 built
    constructed["pairs"]["tiny-llama/inductor"] = _pair(rec, {"cold": cold, "warm": warm})
    found = "\n".join(report.findings(constructed))
    assert "warm run 2 gave other greedy tokens than the cold run" in found
    assert "differ from one another" in found


def test_break_even_is_shown_with_its_interval_and_an_uncertain_one_is_named(constructed):
    be = constructed["pairs"]["tiny-llama/inductor"]["coldstart"]["break_even_warm"]
    assert be["interval"] is not None
    shown = report.break_even_with_interval(be)
    assert shown.startswith(report.break_even_verdict(be)) and "95% interval" in shown
    be["interval"].update(low=2.0, high=None)
    assert report.break_even_is_uncertain(be)
    assert any("break-even is uncertain" in f for f in report.findings(constructed))
    be["interval"].update(low=None, high=None, processes=[3, 3])
    assert report.break_even_with_interval(be).endswith("95% interval: never level")
    assert not report.break_even_is_uncertain(be)
    # With one process a scenario the resamples cannot vary the start: said so.
    be["interval"].update(low=2.0, high=3.0, processes=[1, 3])
    assert report.break_even_with_interval(be).endswith(
        "95% interval 2.0–3.0 req (requests' spread only: one process in a scenario; "
        "--runs 3 or more, and as many --builds for a cold start)"
    )
    be["interval"]["processes"] = [3, 3]
    assert report.break_even_with_interval(be).endswith("95% interval 2.0–3.0 req")


def test_a_roofline_above_100_percent_is_flagged_with_why():
    assert bench.roofline_note(99.0, "cpu") is None
    assert "CPU" in bench.roofline_note(109.0, "cpu")
    assert "L2" in bench.roofline_note(130.0, "cuda:0")


def test_a_chart_not_drawn_is_named_with_why(constructed, tmp_path):
    paths = report.write_report(constructed, tmp_path)  # no --prompt-len: not expected
    assert charts.skipped_charts(constructed, paths) == []
    constructed["settings"]["prompt_lens"] = [16, 128]  # asked, yet no probe timed one
    paths = report.write_report(constructed, tmp_path)
    assert charts.skipped_charts(constructed, paths) == [
        ("ttft_by_prompt_len.png", "no prompt length was timed (--prompt-len)")
    ]
    md = (tmp_path / "report.md").read_text()
    assert "Charts not drawn: ttft_by_prompt_len.png (no prompt length was timed" in md


def test_a_run_without_cached_bytecode_says_so_in_the_header(constructed):
    assert "- bytecode: not recorded" in report.render_markdown(constructed, [])
    constructed["environment"]["bytecode"] = {"torch_bytecode": False, "writes_bytecode": False}
    assert "every process compiled each module" in report.render_markdown(constructed, [])
    constructed["environment"]["bytecode"] = {"torch_bytecode": True, "writes_bytecode": False}
    assert "- bytecode: cached" in report.render_markdown(constructed, [])


def test_setup_line_gives_process_counts_as_run(constructed):
    text = report.render_markdown(constructed, [])
    assert "; 1 fresh process(es) per scenario;" in text
    assert "driver not recorded" in text  # the constructed environment has none
    # A report assembled from units of calls with other counts says what ran.
    rec = load_recipe("tiny-llama")
    three = {
        "cold": [_probe(60.0, 0.1, 0.01, True)],
        "warm": [_probe(8.0, 0.1, 0.01, False) for _ in range(3)],
    }
    constructed["pairs"]["tiny-llama/inductor"] = _pair(rec, three)
    constructed["pairs"]["tiny-llama/inductor"]["runs"] = three
    text = report.render_markdown(constructed, [])
    assert "fresh processes per scenario, as run: tiny-llama 1/3 (cold 1)" in text
    # As asked (--runs 3 --builds 1): the settings line, with the cold count.
    constructed["settings"].update(runs=3, builds=1)
    for unit in (constructed["pairs"]["tiny-llama/eager"], constructed["baselines"]["tiny-llama"]):
        unit["coldstart"]["scenarios"]["eager"]["runs"] = 3
    text = report.render_markdown(constructed, [])
    assert "; 3 fresh process(es) per scenario (cold: 1, --builds);" in text
