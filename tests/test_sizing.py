"""Context length and batch rows chosen at build, sizes that do not fit, and what a
decode step reads.

Every byte count here is worked out by hand from tiny-llama's TOML (vocab 32000, dim 64,
2 layers, 4 heads of 16 dims, 2 kv heads, MLP 172, untied) so a change in the counting
shows as a wrong number, not as a different formula agreeing with itself.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from artifactcache import api, sizing
from artifactcache.choices import BuildChoices
from artifactcache.cli.app import app
from artifactcache.errors import ShapeError
from artifactcache.measure import bench, coldstart
from artifactcache.recipes import load_recipe

runner = CliRunner()

EMBED = 32000 * 64  # the input table; the untied LM head has as many weights
PER_LAYER = 2 * 64 + 64 * 64 + 2 * (64 * 32) + 64 * 64 + 3 * 64 * 172  # 2 norms, q, k+v, o, MLP
PARAMS = 2 * EMBED + 2 * PER_LAYER + 64  # and the final norm
KV_PER_POSITION = 2 * 2 * 2 * 16 * 4  # K and V, 2 layers, 2 kv heads, 16 dims, fp32


def key(recipe, **kw) -> str:
    b, ctx = api.make_context(recipe, "eager", check_memory=False, **kw)
    return api.key_for(b, ctx).key


# ------------------------------------------------------------ context length --


def test_max_seq_len_is_a_key_factor_and_the_recipes_own_is_the_default():
    rec = load_recipe("tiny-llama")
    assert rec.shapes.max_seq_len == 64
    assert key("tiny-llama", max_seq_len=64) == key("tiny-llama")
    k128 = key("tiny-llama", max_seq_len=128)
    assert k128 != key("tiny-llama") and k128 != key("tiny-llama", max_seq_len=32)
    b, ctx = api.make_context("tiny-llama", "eager", max_seq_len=128)
    assert ctx.recipe.shapes.max_seq_len == 128
    assert api.key_for(b, ctx).factors["recipe"]["shapes"]["max_seq_len"] == 128


def test_a_context_shorter_than_the_prefill_chunk_takes_shorter_chunks():
    from artifactcache.backends.shared.steps import example_inputs

    s = load_recipe("tiny-llama").with_shapes(max_seq_len=4).shapes  # prefill_len 8
    assert (s.max_seq_len, s.prefill_len, s.max_batch) == (4, 3, 1)
    for n in range(2, 11):  # up to and past the recipe's prefill_len
        rec = load_recipe("tiny-llama").with_shapes(max_seq_len=n)
        _, pos, _, kv_pos = example_inputs(rec, "cpu", "decode")
        # The steps are compiled at decode's example: its position must be a cache slot.
        assert int(pos[-1]) < n and kv_pos.shape[0] <= n, n


@pytest.mark.parametrize("backend", ["eager", pytest.param("inductor", marks=pytest.mark.slow)])
def test_a_context_shorter_than_the_prefill_chunk_builds_and_decodes(backend, tmp_path):
    # 2 prompt + 3 new tokens fill a 5-position context: prefill, then decode to the end.
    prompt = [1, 15043]
    want = api.load("tiny-llama", "eager", cache_dir=tmp_path / "ref").generate(prompt, 3)
    short = api.load("tiny-llama", backend, max_seq_len=5, cache_dir=tmp_path / "c")
    assert short.recipe.shapes.prefill_len == 4
    assert short.generate(prompt, 3) == want


def test_a_folder_recipe_defaults_to_its_positions_capped_at_4096(tmp_path: Path):
    from artifactcache.sources.hf import DEFAULT_MAX_SEQ_LEN, recipe_from_config

    assert DEFAULT_MAX_SEQ_LEN == 4096
    config = {
        "model_type": "llama", "vocab_size": 300, "hidden_size": 64, "num_hidden_layers": 1,
        "num_attention_heads": 4, "intermediate_size": 128,
    }  # fmt: skip
    for positions, want in ((131072, 4096), (4096, 4096), (1000, 1000)):
        data = {**config, "max_position_embeddings": positions}
        rec = recipe_from_config(data, "config.json", tmp_path)
        assert rec.shapes.max_seq_len == want


# ------------------------------------------------------------ batch rows --


def test_max_batch_is_a_key_factor_of_every_entry_and_the_export():
    assert load_recipe("tiny-llama").shapes.max_batch == 1
    assert key("tiny-llama", max_batch=1) == key("tiny-llama")
    k2 = key("tiny-llama", max_batch=2)
    assert k2 != key("tiny-llama") and k2 != key("tiny-llama", max_batch=8)
    b, ctx = api.make_context("tiny-llama", "eager", max_batch=2)
    assert ctx.recipe.shapes.max_batch == 2
    assert api.key_for(b, ctx).factors["recipe"]["shapes"]["max_batch"] == 2
    pytest.importorskip("onnxruntime")
    from artifactcache.backends.onnx import export as ox
    from artifactcache.store.keyformat import compute_key

    exports = {
        compute_key(ox.export_factors(c.recipe, "random:0", ox.ExportSpec()))
        for c in (api.make_context("tiny-llama", "ort", max_batch=m)[1] for m in (1, 2))
    }
    assert len(exports) == 2  # the graph's batch axis is static: another export


def test_the_kv_cache_and_the_bytes_a_step_reads_follow_the_rows():
    rec = load_recipe("tiny-llama").with_shapes(max_batch=4)
    assert sizing.memory_needed(rec, "fp32")["kv_cache"] == 4 * KV_PER_POSITION * 64
    one, four = (bench.bytes_per_token(rec, "fp32", b, prompt_len=6, new_tokens=10) for b in (1, 4))
    assert four["weights"] == one["weights"] == (PARAMS - EMBED) * 4  # read once per step
    assert four["kv_read"] == 4 * one["kv_read"] == 4 * KV_PER_POSITION * 11
    assert four["kv_allocated_bytes"] == one["kv_allocated_bytes"] == 4 * KV_PER_POSITION * 64
    need = PARAMS * 4 + 4 * KV_PER_POSITION * 64
    with pytest.raises(ShapeError) as e:
        sizing.check_fits_memory(rec, "fp32", "cpu", free_bytes=lambda _d: need)
    assert "max_batch 4" in str(e.value) and "--max-batch" in str(e.value)


def test_the_cli_key_and_the_probe_child_build_for_the_rows_asked(tmp_path: Path):
    r = runner.invoke(app, ["key", "tiny-llama", "-b", "eager", "--max-batch", "3"])
    assert r.exit_code == 0, r.stderr
    assert r.stdout.strip() == key("tiny-llama", max_batch=3)
    spec = coldstart.ProbeSpec(
        recipe="tiny-llama", backend="eager", choices=BuildChoices(max_batch=3),
        extra_flags=["--build-only"],
    )  # fmt: skip
    res = coldstart.spawn_probe(spec, tmp_path / "cache")
    assert (res["max_batch"], res["key"]) == (3, key("tiny-llama", max_batch=3))


@pytest.mark.parametrize(
    ("args", "want"),
    [
        (["bench", "tiny-llama", "--batch", "4,1"], ("4", "4")),  # its own artifact per size
        (["bench", "tiny-llama", "--batch", "1,2", "--max-batch", "8"], ("8", "1")),
        (["bench", "tiny-llama", "--max-batch", "2"], ("2", "1")),
        (["coldstart", "tiny-llama", "-b", "eager", "--max-batch", "2"], ("2", None)),
        (
            [
                "compare",
                "--recipes",
                "tiny-llama",
                "--backends",
                "eager",
                "--max-batch",
                "2",
                "--out",
                "OUT",
            ],
            ("2", None),
        ),
    ],  # fmt: skip
    ids=lambda a: " ".join(a) if isinstance(a, list) else None,
)
def test_max_batch_and_batch_reach_the_probe_children(args, want, monkeypatch, tmp_path):
    seen = _capture_probes(monkeypatch)
    monkeypatch.setenv("ACACHE_DIR", str(tmp_path / "cache"))
    runner.invoke(app, [str(tmp_path / "out") if a == "OUT" else a for a in args])
    assert seen, "no probe was asked for"
    argv = seen[0]
    got_batch = argv[argv.index("--batch") + 1] if "--batch" in argv else None
    chosen = BuildChoices.from_json(argv[argv.index("--choices-json") + 1])  # sent whole
    assert (str(chosen.max_batch), got_batch) == want


# ------------------------------------------------------------ memory fit --


def test_weights_and_kv_cache_counted_by_hand():
    rec = load_recipe("tiny-llama")
    need = sizing.memory_needed(rec, "fp32")
    assert need["weights"] == PARAMS * 4
    assert need["kv_cache"] == KV_PER_POSITION * 64
    need_bf16 = sizing.memory_needed(rec.with_shapes(max_seq_len=256), "bf16")
    assert need_bf16["kv_cache"] == KV_PER_POSITION // 2 * 256


def test_a_tied_head_is_counted_once():
    rec = load_recipe("tiny-llama")
    tied = dataclasses.replace(rec, model=dataclasses.replace(rec.model, tie_embeddings=True))
    assert sizing.memory_needed(tied, "fp32")["weights"] == (PARAMS - EMBED) * 4
    # A decode step reads the table as the head either way: the same bytes.
    assert bench.bytes_per_token(tied, "fp32")["weights"] == (PARAMS - EMBED) * 4
    assert bench.bytes_per_token(rec, "fp32")["weights"] == (PARAMS - EMBED) * 4


def test_a_context_that_does_not_fit_the_free_memory_is_refused():
    rec = load_recipe("tiny-llama")
    logits = 8 * rec.model.vocab_size * (4 + 4)  # prefill_len 8, fp32 twice
    assert sizing.memory_needed(rec, "fp32")["prefill_logits"] == logits
    need = PARAMS * 4 + KV_PER_POSITION * 64 + logits
    # 90% of the free memory may be asked for: exactly that passes, one byte less does not.
    sizing.check_fits_memory(rec, "fp32", "cpu", free_bytes=lambda _d: need * 10 // 9 + 1)
    with pytest.raises(ShapeError) as e:
        sizing.check_fits_memory(rec, "fp32", "cpu", free_bytes=lambda _d: need * 10 // 9 - 10)
    msg = str(e.value)
    assert "max_seq_len 64" in msg and "free on cpu" in msg and "--max-seq-len" in msg
    assert "\n" not in msg
    sizing.check_fits_memory(rec, "fp32", "cpu", free_bytes=lambda _d: None)  # unknown: no check


def test_free_memory_on_cpu_comes_from_meminfo(tmp_path: Path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:  1000 kB\nMemFree:  10 kB\nMemAvailable:  600 kB\n")
    assert sizing._meminfo_available(meminfo) == 600 * 1024
    assert sizing._meminfo_available(tmp_path / "absent") is None
    assert sizing.available_memory("cpu") > 0


def _tiny_memory(monkeypatch, free: int = 1 << 20) -> None:
    monkeypatch.setattr(sizing, "available_memory", lambda _device: free)


def test_library_build_refuses_before_the_store_is_touched(monkeypatch, tmp_path: Path):
    _tiny_memory(monkeypatch)  # 1 MiB: tiny-llama's 16 MiB of weights do not fit
    with pytest.raises(ShapeError, match="free on cpu"):
        api.build("tiny-llama", "eager", cache_dir=tmp_path / "cache")
    assert not (tmp_path / "cache").exists()
    with pytest.raises(ShapeError, match="free on cpu"):
        api.load("tiny-llama", "eager", cache_dir=tmp_path / "cache")
    assert not (tmp_path / "cache").exists()


@pytest.fixture
def no_spawn(monkeypatch):
    def boom(*a, **k):
        raise AssertionError("a probe was spawned before the arguments were checked")

    monkeypatch.setattr(coldstart, "spawn_probe", boom)


def _one_line_error(args: list[str]) -> str:
    r = runner.invoke(app, args)
    assert r.exit_code == 1, (r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    assert "Traceback" not in r.stdout + r.stderr
    return lines[0]


@pytest.mark.parametrize(
    "args",
    [
        ["build", "tiny-llama"],
        ["run", "tiny-llama", "--tokens", "1,2", "--max-new-tokens", "2"],
        ["bench", "tiny-llama"],
        ["coldstart", "tiny-llama", "-b", "eager"],
        ["compare", "--recipes", "tiny-llama", "--backends", "eager", "--out", "OUT"],
    ],
    ids=lambda a: a[0],
)
def test_cli_refuses_what_does_not_fit_with_one_line(args, monkeypatch, tmp_path, no_spawn):
    _tiny_memory(monkeypatch)
    cache = tmp_path / "cache"
    monkeypatch.setenv("ACACHE_DIR", str(cache))
    args = [str(tmp_path / "out") if a == "OUT" else a for a in args]
    assert "free on cpu" in _one_line_error(args)
    assert not cache.exists()
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_key_does_not_ask_whether_the_build_fits(monkeypatch, tmp_path):
    _tiny_memory(monkeypatch)
    monkeypatch.setenv("ACACHE_DIR", str(tmp_path / "cache"))
    r = runner.invoke(app, ["key", "tiny-llama", "-b", "eager", "--max-seq-len", "128"])
    assert r.exit_code == 0, r.stderr
    assert r.stdout.strip() == key("tiny-llama", max_seq_len=128)


# ------------------------------------------------------------ the option on the CLI --


def test_cli_key_and_build_take_max_seq_len(tmp_path, monkeypatch):
    monkeypatch.setenv("ACACHE_DIR", str(tmp_path / "cache"))
    keys = {}
    for n in ("32", "128"):
        r = runner.invoke(app, ["key", "tiny-llama", "-b", "eager", "--max-seq-len", n, "--json"])
        assert r.exit_code == 0, r.stderr
        keys[n] = json.loads(r.stdout)
        assert keys[n]["factors"]["recipe"]["shapes"]["max_seq_len"] == int(n)
    assert keys["32"]["key"] != keys["128"]["key"]
    r = runner.invoke(app, ["build", "tiny-llama", "--max-seq-len", "128", "--json"])
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout)["key"] == keys["128"]["key"]


def test_cli_run_generates_past_the_recipes_context_with_a_longer_one(tmp_path, monkeypatch):
    monkeypatch.setenv("ACACHE_DIR", str(tmp_path / "cache"))
    ids = ",".join(["1"] * 70)  # past tiny-llama's own 64
    assert "max_seq_len" in _one_line_error(["run", "tiny-llama", "--tokens", ids])
    r = runner.invoke(
        app, ["run", "tiny-llama", "--tokens", ids, "--max-new-tokens", "3",
              "--max-seq-len", "96", "--json"],
    )  # fmt: skip
    assert r.exit_code == 0, r.stderr
    assert len(json.loads(r.stdout)["new_ids"]) == 3


def _capture_probes(monkeypatch) -> list[list[str]]:
    from artifactcache.errors import MeasureError

    seen: list[list[str]] = []

    def record(spec, cache_dir, **_kw):
        seen.append(spec.argv(cache_dir))
        raise MeasureError("stopped by the test after recording the probe's argv")

    monkeypatch.setattr(coldstart, "spawn_probe", record)
    return seen


@pytest.mark.parametrize(
    "args",
    [
        ["bench", "tiny-llama", "--max-seq-len", "128"],
        ["coldstart", "tiny-llama", "-b", "eager", "--max-seq-len", "128"],
        [
            "compare",
            "--recipes",
            "tiny-llama",
            "--backends",
            "eager",
            "--max-seq-len",
            "128",
            "--out",
            "OUT",
        ],
    ],  # fmt: skip
    ids=lambda a: a[0],
)
def test_the_option_reaches_the_probe_children(args, monkeypatch, tmp_path):
    seen = _capture_probes(monkeypatch)
    monkeypatch.setenv("ACACHE_DIR", str(tmp_path / "cache"))
    args = [str(tmp_path / "out") if a == "OUT" else a for a in args]
    runner.invoke(app, args)
    assert seen, "no probe was asked for"
    for argv in seen:
        chosen = BuildChoices.from_json(argv[argv.index("--choices-json") + 1])
        assert chosen.max_seq_len == 128


def test_a_probe_child_builds_for_the_context_it_is_given(tmp_path: Path):
    spec = coldstart.ProbeSpec(
        recipe="tiny-llama", backend="eager", choices=BuildChoices(max_seq_len=128),
        extra_flags=["--build-only"],
    )  # fmt: skip
    res = coldstart.spawn_probe(spec, tmp_path / "cache")
    assert res["max_seq_len"] == 128
    assert res["key"] == key("tiny-llama", max_seq_len=128) != key("tiny-llama")


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["build", "tiny-llama", "--max-seq-len", "300"], "max_position_embeddings (256)"),
        (["bench", "tiny-llama", "--max-seq-len", "0"], "must be positive"),
        (["build", "tiny-llama", "--max-seq-len", "1"], "max_seq_len must be at least 2"),
        (["run", "tiny-llama", "--tokens", "1", "--max-seq-len", "1"], "must be at least 2"),
        (
            [
                "compare",
                "--recipes",
                "tiny-llama",
                "--backends",
                "eager",
                "--max-seq-len",
                "999",
                "--out",
                "OUT",
            ],
            "max_position_embeddings",
        ),
        (["bench", "tiny-llama", "--max-seq-len", "16", "--new-tokens", "20"], "max_seq_len 16"),
        (["build", "examples/vision.py:net", "--max-seq-len", "64"], "not a model spec"),
    ],  # fmt: skip
    ids=lambda a: " ".join(a) if isinstance(a, list) else None,
)
def test_bad_max_seq_len_is_one_line_and_writes_nothing(args, needle, monkeypatch, tmp_path,
                                                        no_spawn):  # fmt: skip
    cache = tmp_path / "cache"
    monkeypatch.setenv("ACACHE_DIR", str(cache))
    args = [str(tmp_path / "out") if a == "OUT" else a for a in args]
    assert needle in _one_line_error(args)
    assert not cache.exists()


# ------------------------------------------------------------ roofline --


def test_decode_steps_attend_to_the_filled_positions():
    # 6 prompt tokens, 4 new: decode steps at positions 6, 7, 8 attend 7, 8, 9 positions.
    assert bench.mean_attended_positions(6, 4) == 8
    assert bench.mean_attended_positions(6, 1) == 6  # no decode step: the prefill's
    # A 16-token window: 7..16 positions over the first 10 steps, then 16.
    assert bench.mean_attended_positions(6, 11, 16) == 11.5
    assert bench.mean_attended_positions(6, 13, 16) == (115 + 2 * 16) / 12


def test_int8wo_weights_are_a_byte_each_plus_a_scale_per_output_row():
    rec = load_recipe("tiny-llama")
    linear = 64 * 64 + 2 * (64 * 32) + 64 * 64 + 3 * 64 * 172  # q, k+v, o, MLP of a layer
    rows = 64 + 2 * 32 + 64 + 2 * 172 + 64  # their output channels: one bf16 scale each
    per_layer = linear + 2 * rows + 2 * 64 * 2  # + 2 norms in bf16
    want = 2 * per_layer + 64 * 2 + EMBED * 2  # + the final norm and the bf16 LM head
    assert sizing.weight_bytes(rec, "bf16", "int8wo") == (want, EMBED * 2)
    assert bench.bytes_per_token(rec, "bf16", quant="int8wo")["weights"] == want
    assert sizing.weight_bytes(rec, "bf16") == ((PARAMS - EMBED) * 2, EMBED * 2)


def test_bytes_per_token_counts_the_kv_that_is_filled_not_allocated():
    rec = load_recipe("tiny-llama")
    b = bench.bytes_per_token(rec, "fp32", prompt_len=6, new_tokens=10)
    assert b["weights"] == (PARAMS - EMBED) * 4
    assert b["embedding_excluded"] == EMBED * 4
    assert b["kv_mean_positions"] == 11  # 6 + 10 / 2
    assert b["kv_read"] == KV_PER_POSITION * 11
    assert b["kv_allocated_bytes"] == KV_PER_POSITION * 64
    assert b["total"] == (PARAMS - EMBED) * 4 + KV_PER_POSITION * 11
    # A larger allocation needs no more bytes per step: the roofline is the same.
    longer = bench.bytes_per_token(
        rec.with_shapes(max_seq_len=256), "fp32", prompt_len=6, new_tokens=10
    )
    assert longer["total"] == b["total"]
    assert longer["kv_allocated_bytes"] == KV_PER_POSITION * 256
    # The default request: the bench prompt (6 ids) and N = 64 - 6 = 58.
    assert bench.bytes_per_token(rec, "fp32")["kv_read"] == KV_PER_POSITION * (6 + 29)


def test_sliding_window_reads_at_most_its_window():
    rec = load_recipe("tiny-mistral")  # same sizes as tiny-llama, window 16
    b = bench.bytes_per_token(rec, "fp32", prompt_len=6, new_tokens=11)
    assert b["kv_read"] == KV_PER_POSITION * 23 // 2  # 11.5 positions


def test_a_kernel_reading_the_whole_cache_shows_a_lower_roofline():
    """The same tok/s is a smaller share of the copy bandwidth once only filled KV counts."""
    rec = load_recipe("tiny-llama")
    probe = {"prompt_len": 6, "copy_bandwidth": {"gbps": 100.0},
             "steady": {"new_tokens": 10, "prefill_s": [0.010], "request_s": [0.019]}}  # fmt: skip
    res = bench.summarize(rec, "fp32", [probe])
    assert res["decode_tok_s"] == pytest.approx(9 / 0.009)
    needed = (PARAMS - EMBED) * 4 + KV_PER_POSITION * 11
    assert res["bytes_per_token"]["total"] == needed
    assert res["roofline_pct"] == pytest.approx(100 * needed * (9 / 0.009) / 100e9)
    allocated = (PARAMS - EMBED) * 4 + KV_PER_POSITION * 64
    assert res["roofline_pct"] < 100 * allocated * (9 / 0.009) / 100e9


def test_weight_bytes_builds_a_recipes_meta_model_once(monkeypatch):
    """Asked again with the same recipe, dtype and quant, including a recipe whose
    rope_scaling is a dict (a checkpoint's; unhashable), it answers from its memo."""
    import artifactcache.models as models

    rec = load_recipe("tiny-llama")
    scaled = dataclasses.replace(rec, model=dataclasses.replace(
        rec.model, rope_scaling={"type": "linear", "factor": 2.0}))  # fmt: skip
    built: list[str] = []
    real = models.architecture
    monkeypatch.setattr(models, "architecture", lambda r: built.append(r.name) or real(r))
    monkeypatch.setattr(sizing, "_WEIGHT_BYTES", {})
    first = [sizing.weight_bytes(r, "fp32") for r in (rec, scaled, rec, scaled)]
    assert first[0] == first[2] and first[1] == first[3]
    assert sum(first[0]) == PARAMS * 4
    assert len(built) == 2
    sizing.weight_bytes(rec, "bf16")
    assert len(built) == 3
