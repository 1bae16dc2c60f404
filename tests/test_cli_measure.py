"""acache coldstart / bench / compare: bad arguments fail fast; compare writes a report."""

from __future__ import annotations

import json

import pytest
from PIL import Image
from typer.testing import CliRunner

from artifactcache.choices import BuildChoices
from artifactcache.cli import app
from artifactcache.measure import coldstart

runner = CliRunner()


@pytest.fixture
def no_spawn(monkeypatch):
    def boom(*a, **k):
        raise AssertionError("a probe was spawned before the arguments were checked")

    monkeypatch.setattr(coldstart, "spawn_probe", boom)


COMPARE_EAGER = ["compare", "--recipes", "tiny-llama", "--backends", "eager", "--out", "X"]


def one_line_error(*args: str) -> str:
    r = runner.invoke(app, list(args))
    assert r.exit_code == 1, (r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    return lines[0]


@pytest.mark.parametrize(
    "args, needle",
    [
        (["coldstart", "no-such-recipe", "--backend", "eager"], "unknown recipe"),
        (["coldstart", "tiny-llama", "--backend", "nope"], "unknown backend"),
        (["coldstart", "tiny-llama", "--backend", "eager", "--runs", "0"], "--runs"),
        (["coldstart", "tiny-llama", "--runs", "2", "--builds", "3"], "--builds must be"),
        ([*COMPARE_EAGER, "--builds", "0"], "--builds must be"),
        (["coldstart", "tiny-llama", "--cache-dir", "/tmp/c"], "fresh temporary caches"),
        ([*COMPARE_EAGER, "--cache-dir", "/tmp/c"], "use `acache bench --cache-dir DIR`"),
        (["bench", "tiny-llama", "-b", "eager", "--batch", "2", "--max-batch", "1"], "max_batch"),
        (["bench", "tiny-llama", "--new-tokens", "500"], "max_seq_len"),
        (
            ["compare", "--recipes", "tiny-llama,nope", "--backends", "eager", "--out", "X"],
            "unknown recipe",
        ),
        (
            ["compare", "--recipes", "tiny-llama", "--backends", "eager,bogus", "--out", "X"],
            "unknown backend",
        ),
        (
            [
                "compare",
                "--recipes",
                "tiny-llama",
                "--backends",
                "eager",
                "--runs",
                "0",
                "--out",
                "X",
            ],
            "--runs",
        ),
        (["bench", "tiny-llama", "--quant", "int4"], "unknown --quant"),
        (["coldstart", "tiny-llama", "-b", "ort", "--quant", "int8wo"], "constant folding"),
        (["bench", "tiny-phi-3", "--extra", "fuse_projections=0"], "cannot split them"),
        (
            [
                "compare",
                "--recipes",
                "tiny-llama",
                "--backends",
                "aoti",
                "--quant",
                "int4",
                "--out",
                "X",
            ],
            "unknown --quant",
        ),  # fmt: skip
    ],
)
def test_bad_arguments_exit_1_one_line(args, needle, no_spawn, tmp_path):
    args = [str(tmp_path / "out") if a == "X" else a for a in args]
    assert needle in one_line_error(*args)
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_unwritable_out_dir(no_spawn, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a dir")
    line = one_line_error(
        "compare", "--recipes", "tiny-llama", "--backends", "eager", "--out", str(blocker / "sub")
    )
    assert "cannot write to --out" in line
    line = one_line_error("coldstart", "tiny-llama", "-b", "eager", "--out", str(blocker))
    assert "cannot write to --out" in line


@pytest.fixture(scope="module")
def compared(tmp_path_factory):
    out = tmp_path_factory.mktemp("compare")
    r = runner.invoke(
        app,
        [
            "compare",
            "--recipes",
            "tiny-llama,tiny-phi-2",
            "--backends",
            "eager,inductor,trt",
            "--runs",
            "1",
            "--new-tokens",
            "3",
            "--iters",
            "1",
            "--out",
            str(out),
        ],
    )
    assert r.exit_code == 0, r.stderr
    return out, r


@pytest.mark.slow
def test_compare_writes_report_and_png(compared):
    out, r = compared
    md = (out / "report.md").read_text()
    for recipe in ("tiny-llama", "tiny-phi-2"):
        assert f"| {recipe} |" in md
    assert "| model | eager | inductor | trt |" in md
    assert "not run: trt unavailable here" in md  # said why, and the rest still ran
    with Image.open(out / "tokens_per_s.png") as im:
        im.verify()
    with Image.open(out / "phases.png") as im:
        im.verify()


@pytest.mark.slow
def test_compare_cold_compiles_warm_does_not(compared):
    out, _ = compared
    rep = json.loads((out / "report.json").read_text())
    for recipe in ("tiny-llama", "tiny-phi-2"):
        pair = rep["pairs"][f"{recipe}/inductor"]
        assert pair["status"] == "ok", pair
        sc = pair["coldstart"]["scenarios"]
        assert sc["cold"]["compiled"] == [True] and sc["warm"]["compiled"] == [False]
        bench = pair["bench"]
        assert bench["request_tok_s"] > 0 and bench["copy_gbps"] > 0
        # One timed 3-token request on a busy CI machine: the decode share (request less
        # a 1-token request) can be lost in noise, which the report shows as no rate.
        assert bench["decode_tok_s"] is None or bench["decode_tok_s"] > 0
        assert pair["coldstart"]["break_even_warm"]["verdict"] in (
            "after",
            "never",
            "immediately",
            "ahead-then-behind",
        )
        # Same artifact semantics: compiled greedy tokens match eager's.
        eager_tokens = rep["baselines"][recipe]["runs"]["eager"][0]["steady"]["tokens"]
        assert pair["runs"]["warm"][0]["steady"]["tokens"] == eager_tokens


def test_bench_measures_each_batch_size_and_says_how_the_artifact_was_found(tmp_path):
    cache = ["--cache-dir", str(tmp_path / "c")]
    args = ["bench", "tiny-llama", "--batch", "1,2", "--max-batch", "2", "--new-tokens", "4",
            "--iters", "1", "--warmup", "1", *cache]  # fmt: skip
    r = runner.invoke(app, [*args, "--json"])
    assert r.exit_code == 0, r.stderr
    one, two = json.loads(r.stdout)["batches"]
    assert [(x["batch"], x["max_batch"], x["entry"]) for x in (one, two)] == [
        (1, 2, "built"),  # both sizes on the --max-batch 2 artifact: built once
        (2, 2, "hit"),
    ]
    for x in (one, two):
        assert x["aggregate_request_tok_s"] == pytest.approx(x["batch"] * x["request_tok_s"])
        assert x["step"]["p50"] > 0 and x["matmul_tflops"] > 0 and x["copy_gbps"] > 0
        assert x["flops_per_step"]["total"] > 0 and x["roofline_bound"] in ("bandwidth", "compute")
    assert two["bytes_per_token"]["kv_read"] == 2 * one["bytes_per_token"]["kv_read"]
    r = runner.invoke(app, args)  # a table now
    assert r.exit_code == 0, r.stderr
    assert "batch 1" in r.stdout and "batch 2" in r.stdout and "% of FLOP roofline" in r.stdout


def test_probe_spec_carries_extra_options_with_their_types():
    from artifactcache.measure.child import probe

    extra = {"opset": 19, "flag": True, "exporter": "x"}
    spec = coldstart.ProbeSpec(
        recipe="tiny-llama", backend="ort", choices=BuildChoices(extra=extra, max_batch=2)
    )
    argv = spec.argv(None)
    args = probe._parse(argv[argv.index("--recipe") :])
    assert args.choices == spec.choices and args.choices.extra == extra  # whole, typed
    assert probe._parse(["--recipe", "r", "--backend", "eager"]).choices == BuildChoices()


def test_probe_child_applies_the_extra_options():
    # eager takes no extra options: the child refuses them, so they reached its api.load().
    spec = coldstart.ProbeSpec(
        recipe="tiny-llama", backend="eager", choices=BuildChoices(extra={"foo": 1}), iters=1
    )
    with pytest.raises(coldstart.MeasureError, match="takes no extra options"):
        coldstart.spawn_probe(spec, None)


def test_bench_passes_extra_to_its_probe(monkeypatch):
    pytest.importorskip("onnxruntime")
    seen = []

    def capture(spec, *a, **k):
        seen.append(spec)
        raise coldstart.MeasureError("captured")

    monkeypatch.setattr(coldstart, "spawn_probe", capture)
    r = runner.invoke(app, ["bench", "tiny-llama", "-b", "ort", "--extra", "opset=19"])
    assert r.exit_code == 1 and r.stderr.strip().endswith("error: captured"), r.stderr
    assert [s.choices.extra for s in seen] == [{"opset": 19}]


@pytest.mark.parametrize(
    "args",
    [
        [
            "coldstart",
            "tiny-llama",
            "-b",
            "ort",
            "--extra",
            "opset=19",
            "--extra",
            "exporter=dynamo",
        ],
        [
            "compare",
            "--recipes",
            "tiny-llama",
            "--backends",
            "ort",
            "--extra",
            "ort:opset=19",
            "--extra",
            "ort:exporter=dynamo",
            "--out",
            "X",
        ],
    ],
    ids=["coldstart", "compare"],
)
def test_coldstart_and_compare_pass_extra_to_the_backend_probes(args, monkeypatch, tmp_path):
    pytest.importorskip("onnxruntime")
    from artifactcache.measure import compare

    seen = []

    def capture(spec, *a, **k):
        seen.append(spec)
        raise coldstart.MeasureError("captured")

    monkeypatch.setattr(compare, "run_compare", capture)
    one_line_error(*[str(tmp_path / "out") if a == "X" else a for a in args])
    (spec,) = seen
    assert spec.extras == {"ort": {"opset": 19, "exporter": "dynamo"}}
    assert compare.probe_spec(spec, "ort").choices.extra == {"opset": 19, "exporter": "dynamo"}
    assert compare.probe_spec(spec, "eager").choices.extra == {}  # the baseline: plain eager


def test_probe_spec_and_child_carry_quant():
    from artifactcache.measure.child import probe

    chosen = BuildChoices(quant="int8wo")
    argv = coldstart.ProbeSpec(recipe="tiny-llama", backend="aoti", choices=chosen).argv(None)
    assert probe._parse(argv[argv.index("--recipe") :]).choices.quant == "int8wo"
    assert probe._parse(["--recipe", "r", "--backend", "eager"]).choices.quant is None
    # The child refuses a bad name: it reached its api.load().
    spec = coldstart.ProbeSpec(
        recipe="tiny-llama", backend="eager", choices=BuildChoices(quant="int4"), iters=1
    )
    with pytest.raises(coldstart.MeasureError, match="unknown --quant"):
        coldstart.spawn_probe(spec, None)


def test_bench_counts_the_int8_bytes_in_its_roofline(tmp_path):
    from artifactcache import sizing
    from artifactcache.recipes import load_recipe

    args = ["bench", "tiny-llama", "--iters", "1", "--warmup", "1", "--new-tokens", "4"]
    r = runner.invoke(app, [*args, "--quant", "int8wo", "--json", "--cache-dir", str(tmp_path)])
    assert r.exit_code == 0, r.stderr
    res = json.loads(r.stdout)
    int8, _ = sizing.weight_bytes(load_recipe("tiny-llama"), "fp32", "int8wo")
    assert res["quant"] == "int8wo" and res["bytes_per_token"]["weights"] == int8
    assert int8 < sizing.weight_bytes(load_recipe("tiny-llama"), "fp32")[0]


def test_compare_gives_quant_to_every_backend_eager_too(monkeypatch, tmp_path):
    from artifactcache.measure import compare

    seen = []

    def capture(spec, *a, **k):
        seen.append(spec)
        raise coldstart.MeasureError("captured")

    monkeypatch.setattr(compare, "run_compare", capture)
    one_line_error("compare", "--recipes", "tiny-llama", "--backends", "aoti",
                   "--quant", "int8wo", "--out", str(tmp_path / "out"))  # fmt: skip
    (spec,) = seen
    assert compare.probe_spec(spec, "aoti").choices.quant == "int8wo"
    assert compare.probe_spec(spec, "eager").choices.quant == "int8wo"
    assert compare.build_options(spec, "eager").quant == "int8wo"


def test_a_mixed_compare_gives_each_unit_only_the_choices_of_its_kind(monkeypatch, tmp_path):
    """--input goes to the model specs' probes, --tag and --max-seq-len to the recipes'."""
    from artifactcache.measure import compare

    seen = {}

    def capture(ps, *a, **k):
        seen[ps.recipe] = ps.choices
        raise coldstart.MeasureError("captured")

    monkeypatch.setattr(coldstart, "run_scenarios", capture)
    spec = compare.CompareSpec(
        recipes=["tiny-llama", "examples/vision.py:tiny_convnet"], backends=["eager"],
        choices=BuildChoices(inputs=("2x3x32x32",), tag="t1", max_seq_len=128),
    )  # fmt: skip
    compare.validate(spec)
    for recipe in spec.recipes:
        compare.run_unit(spec, recipe, "eager", tmp_path, resume=False, work_root=None,
                         say=lambda m: None)  # fmt: skip
    assert seen["tiny-llama"] == BuildChoices(tag="t1", max_seq_len=128)
    assert seen["examples/vision.py:tiny_convnet"] == BuildChoices(inputs=("2x3x32x32",))
    only_specs = compare.CompareSpec(
        recipes=["examples/vision.py:tiny_convnet"], backends=["eager"],
        choices=BuildChoices(tag="t1"),
    )  # fmt: skip
    with pytest.raises(coldstart.MeasureError, match="--tag is for a recipe"):
        compare.validate(only_specs)


def test_compare_refuses_what_the_backend_refuses_for_the_recipe_before_any_probe(
    monkeypatch, tmp_path
):
    """Layer regions on phi-2's inductor build (its default rope kernel cannot run in a
    region) are refused by the backend's recipe check in compare's validation, not by a
    probe's process after it starts."""
    from artifactcache.backends.base import get_backend
    from artifactcache.errors import BackendError
    from artifactcache.measure import compare

    def spawned(*a, **k):
        raise AssertionError("validation spawned a probe")

    monkeypatch.setattr(coldstart, "run_scenarios", spawned)
    regions = {"inductor": {"layer_regions": "1"}}
    spec = compare.CompareSpec(recipes=["tiny-phi-2"], backends=["inductor"],
                               choices=BuildChoices(device="cuda"), extras=regions)  # fmt: skip
    with pytest.raises(BackendError, match="add --extra split_kv_rope=0"):
        compare.validate(spec)
    out = tmp_path / "out"  # the CLI: one line, exit 1, nothing written
    line = one_line_error("compare", "--recipes", "tiny-phi-2", "--backends", "inductor",
                          "--device", "cuda", "--extra", "inductor:layer_regions=1",
                          "--out", str(out))  # fmt: skip
    assert "add --extra split_kv_rope=0" in line and not out.exists()
    get_backend("inductor").check_options(compare.build_options(spec, "inductor"))  # the recipe's
    spec.extras = {"inductor": {"layer_regions": "1", "split_kv_rope": "0"}}
    compare.validate(spec)
    spec.recipes = ["tiny-llama"]  # the llama families take regions
    spec.extras = regions
    compare.validate(spec)


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["bench", "tiny-llama", "--prompt-len", "16,x"], "separated by commas"),
        (["bench", "tiny-llama", "--prompt-len=0,16"], "at least 1, got 0"),
        (["bench", "tiny-llama", "--prompt-len", "16,16"], "names a length twice"),
        (["bench", "tiny-llama", "--prompt-len", "16,2000"], "--prompt-len 2000 does not fit"),
        (["bench", "tiny-llama", "--prompt-len", "64"], "64 prompt tokens + 1 new token = 65"),
        (["bench", "tiny-llama", "--prompt-len", "200", "--max-seq-len", "128"], "max_seq_len 128"),
        (["bench", "examples/vision.py:tiny_convnet", "--prompt-len", "4"], "is for a recipe"),
        (["coldstart", "tiny-llama", "-b", "eager", "--prompt-len", "64"], "does not fit"),
        (["compare", "--recipes", "tiny-llama", "--backends", "eager", "--out", "X",
          "--prompt-len", "4,100"], "--prompt-len 100 does not fit"),
    ],
)  # fmt: skip
def test_bad_prompt_lengths_exit_1_in_one_line_and_nothing_is_built(args, needle, no_spawn,
                                                                   tmp_path):  # fmt: skip
    cache = tmp_path / "cache"
    args = [str(tmp_path / "out") if a == "X" else a for a in args]
    assert needle in one_line_error(*args, *(["--cache-dir", str(cache)] if args[0] == "bench"
                                             else []))  # fmt: skip
    assert not cache.exists()


def test_bench_times_the_first_token_of_each_prompt_length(tmp_path):
    from artifactcache.measure import prefill
    from artifactcache.recipes import load_recipe

    args = ["bench", "tiny-llama", "-b", "eager", "--prompt-len", "4,16", "--new-tokens", "4",
            "--iters", "2", "--warmup", "1", "--cache-dir", str(tmp_path / "c")]  # fmt: skip
    r = runner.invoke(app, [*args, "--json"])
    assert r.exit_code == 0, r.stderr
    res = json.loads(r.stdout)
    assert res["gemm_tflops"] > 0 and res["gemm_n"] == 1024  # measured in the probe, on CPU
    assert [x["prompt_len"] for x in res["prompt_lengths"]] == [4, 16]  # one per length
    rec = load_recipe("tiny-llama")
    for x in res["prompt_lengths"]:
        n = x["prompt_len"]
        assert len(x["ttft_s"]) == 2 and all(t > 0 for t in x["ttft_s"])
        assert x["ttft_first_s"] > 0  # the length's first request, timed apart
        assert x["ttft"]["min"] <= x["ttft_p50_s"] <= x["ttft"]["max"]
        assert x["prefill_tok_s"] == pytest.approx(n / x["ttft_p50_s"])
        assert x["prefill_flops"] == prefill.recipe_prefill_flops(rec, "fp32", n)
        pct = 100 * x["prefill_flops"]["total"] / x["ttft_p50_s"] / 1e12 / res["gemm_tflops"]
        assert x["flop_roofline_pct"] == pytest.approx(pct)
    assert res["decode_tok_s"] is None or res["decode_tok_s"] > 0  # the bench prompt's, beside
    # A table now, the entry a hit; wide enough that no header folds (CI's COLUMNS may be 80).
    r = runner.invoke(app, args, env={"COLUMNS": "250"})
    assert r.exit_code == 0, r.stderr
    assert "time to first token by prompt length" in r.stdout and "% FLOP" in r.stdout
    assert "first at this length ms" in r.stdout  # the column of each length's first request
