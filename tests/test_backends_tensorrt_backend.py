"""trt backend: everything around the TensorRT calls, runnable without TensorRT.

The TensorRT and TensorRT-LLM calls themselves are unverified here (neither can
be installed on our machines); the tests that need them skip with the reason
"tensorrt not importable". The build and load paths run against a recording
stand-in in tests/test_backends_tensorrt_standin.py.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from artifactcache import api
from artifactcache.backends.base import BuildContext, BuildOptions
from artifactcache.backends.onnx_export import ExportSpec
from artifactcache.backends.tensorrt import BACKEND as TRT
from artifactcache.backends.tensorrt import loader, options, util
from artifactcache.backends.tensorrt import runner as trt_runner
from artifactcache.backends.tensorrt.llm import (
    hf_config,
    write_hf_checkpoint,
)
from artifactcache.backends.tensorrt.loader import TIMING_CACHE_FILE
from artifactcache.errors import BackendError, BackendUnavailable, ShapeError
from artifactcache.keys import compute_key
from artifactcache.models import WeightsSpec, build_model
from artifactcache.recipes import list_recipes, load_recipe
from artifactcache.store.local import LocalStore

HAVE_TRT = importlib.util.find_spec("tensorrt") is not None
TINY = [r.name for r in list_recipes() if r.name.startswith("tiny-")]


# ------------------------------------------------------------- precision --


@pytest.mark.parametrize(
    "precision, major, typing, qdq, want",
    [
        ("fp32", 10, "strong", False, (True, (), "fp32")),
        ("fp16", 10, "strong", False, (True, (), "fp16")),
        ("bf16", 11, "strong", False, (True, (), "bf16")),
        ("fp16", 10, "weak", False, (False, ("FP16",), "fp32")),
        ("bf16", 10, "weak", False, (False, ("BF16",), "fp32")),
        ("int8", 10, "weak", True, (False, ("INT8",), "fp32")),
        ("fp8", 10, "weak", True, (False, ("FP8",), "fp32")),
        ("int8", 11, "strong", True, (True, (), "fp32")),
        ("fp8", 11, "strong", True, (True, (), "fp32")),
    ],
)
def test_precision_plan(precision, major, typing, qdq, want):
    plan = options.precision_plan(precision, major, typing, qdq)
    assert (plan.strongly_typed, plan.builder_flags, plan.export_dtype) == want


@pytest.mark.parametrize(
    "args, message",
    [
        (("int8", 10, "strong", False), "int8 needs an explicitly quantized ONNX graph"),
        (("fp8", 11, "weak", False), "fp8 needs an explicitly quantized ONNX graph"),
        (("fp16", 11, "weak", False), "TensorRT 11 removed weakly typed networks"),
        (("fp64", 10, "strong", False), "supports dtype fp32, fp16, bf16, int8, fp8"),
    ],
)
def test_precision_plan_refusals(args, message):
    with pytest.raises(BackendError, match=message):
        options.precision_plan(*args)


def test_engine_options():
    eo = options.engine_options(BuildOptions(extra={"opt_level": "5", "workspace_mb": 512}))
    assert (eo.opt_level, eo.workspace_mb, eo.typing, eo.allow_host_code) == (
        5,
        512,
        "strong",
        False,
    )
    assert options.engine_options(BuildOptions(extra={"allow_host_code": "yes"})).allow_host_code
    for extra, message in [
        ({"opt_level": 6}, "opt_level must be 0-5"),
        ({"opt_level": "max"}, "opt_level must be an integer"),
        ({"workspace_mb": 0}, "workspace_mb must be a positive integer"),
        ({"typing": "loose"}, "typing must be strong or weak"),
        ({"allow_host_code": "maybe"}, "allow_host_code must be true or false"),
        ({"tactics": "all"}, "does not take ['tactics']"),
    ]:
        with pytest.raises(BackendError, match=message.replace("[", r"\[").replace("]", r"\]")):
            options.engine_options(BuildOptions(extra=extra))


# -------------------------------------------------------------- profiles --


def test_profiles_from_recipe_shapes():
    r = load_recipe("tiny-llama")  # prefill_len 8
    prefill, decode = loader.profiles_for(r)
    assert prefill["input_ids"] == ((1, 1), (1, 8), (1, 8))
    assert prefill["input_pos"] == ((1,), (8,), (8,))
    assert decode == {"input_ids": ((1, 1),) * 3, "input_pos": ((1,),) * 3}
    assert "past_keys" not in prefill  # static cache inputs need no profile
    big = load_recipe("llama-7b")  # prefill_len 16
    assert loader.profiles_for(big)[0]["input_ids"][2] == (1, 16)
    assert [trt_runner.profile_for_tokens(r, n) for n in (1, 2, 8)] == [1, 0, 0]
    with pytest.raises(ShapeError, match=r"outside the engine's profiles \(1..8\)"):
        trt_runner.profile_for_tokens(r, 9)


# ------------------------------------------------- plan header and compat --


def _header(major: int, minor: int, patch: int) -> bytes:
    head = bytearray(32)
    head[24:27] = bytes([major, minor, patch])
    return bytes(head)


def test_plan_header_version():
    assert util.plan_header_version(_header(10, 3, 0)) == (10, 3, 0)
    assert util.plan_header_version(_header(10, 3, 0)[:20]) is None  # too short
    assert util.plan_header_version(_header(0, 0, 0)) is None  # not a layout we know


def test_compat_problem():
    meta = {"tensorrt": "10.3.0", "compute_capability": "9.0"}
    assert util.compat_problem(meta, "10.3.0", "9.0") is None
    assert util.compat_problem(meta, "10.3.0.26", "9.0") is None  # build number ignored
    assert "built with TensorRT 10.3.0, this runtime is TensorRT 10.4.0" in util.compat_problem(
        meta, "10.4.0", "9.0"
    )
    assert "compute capability 9.0, this GPU is 8.0" in util.compat_problem(meta, "10.3.0", "8.0")
    assert "records no TensorRT version" in util.compat_problem({}, "10.3.0", "9.0")


def test_a_version_compatible_engine_runs_on_later_tensorrt():
    meta = {"tensorrt": "10.3.0", "compute_capability": "9.0", "allow_host_code": True}
    assert util.compat_problem(meta, "10.4.0", "9.0") is None
    assert util.compat_problem(meta, "11.4.0.106", "9.0") is None
    assert "built with TensorRT 10.3.0 runs on that version or later, this runtime is " in (
        util.compat_problem(meta, "10.2.1", "9.0")
    )
    assert "this GPU is 8.0" in util.compat_problem(meta, "10.4.0", "8.0")  # still per GPU


def test_version_compatible_engines_are_keyed_by_the_major(monkeypatch):
    """So that a TensorRT upgrade within the major finds the entry at all."""
    from artifactcache import keys

    def toolchain(version: str, **extra):
        monkeypatch.setattr(keys, "package_version", lambda d: version if "tensorrt" in d else "1")
        return TRT.toolchain(BuildOptions(device="cuda", mode="onnx", extra=extra))

    vc = {"allow_host_code": True}
    assert toolchain("10.3.0", **vc)["tensorrt"] == toolchain("10.4.0", **vc)["tensorrt"]
    assert toolchain("10.3.0", **vc)["tensorrt"] != toolchain("11.0.0", **vc)["tensorrt"]
    assert toolchain("10.3.0")["tensorrt"] != toolchain("10.4.0")["tensorrt"]


def test_the_plan_header_is_advisory():
    meta = {"tensorrt": "10.3.0"}
    assert util.header_note(meta, _header(10, 3, 0)) is None
    assert util.header_note(meta, b"\0" * 32) is None  # cannot be parsed: no verdict
    note = util.header_note(meta, _header(10, 2, 0))
    assert "reads TensorRT 10.2.0, the manifest says 10.3.0" in note and "advisory" in note


# ---------------------------------------------------------- timing cache --


def test_timing_cache_key_factors():
    plan = options.precision_plan("fp16", 10, "strong", False)
    eo = options.EngineOptions()
    base = loader.timing_cache_factors("NVIDIA H200", "9.0", "10.3.0", plan, eo)
    assert base["recipe"] == {} and base["weights"] == "none"  # shared across models
    others = [
        loader.timing_cache_factors("NVIDIA A100", "8.0", "10.3.0", plan, eo),
        loader.timing_cache_factors("NVIDIA H200", "9.0", "10.4.0", plan, eo),
        loader.timing_cache_factors(
            "NVIDIA H200", "9.0", "10.3.0", plan, options.EngineOptions(opt_level=5)
        ),
        loader.timing_cache_factors(
            "NVIDIA H200", "9.0", "10.3.0", options.precision_plan("fp16", 10, "weak", False), eo
        ),
    ]
    assert len({compute_key(f) for f in others} | {compute_key(base)}) == 5


def test_timing_cache_entry_is_merged_after_each_build(tmp_path):
    """The store side of load-before / merge-after, with a set-union merge standing in
    for ITimingCache.combine (the only part that needs TensorRT)."""
    store = LocalStore(tmp_path / "c")
    plan = options.precision_plan("fp32", 10, "strong", False)
    factors = loader.timing_cache_factors("GPU", "9.0", "10.3.0", plan, options.EngineOptions())

    def union(old: bytes | None, new: bytes) -> bytes:
        return b"\n".join(sorted(set((old or b"").split()) | set(new.split())))

    dep = loader.timing_cache_dependency(factors, merge=union)
    assert api.open_dependency(dep, store) == (None, "absent")  # optional: never built for it
    api.refresh_dependency(dep, store, b"tactic-a")
    api.refresh_dependency(dep, store, b"tactic-b")
    entry = store.get(compute_key(factors))
    assert (entry.path / TIMING_CACHE_FILE).read_bytes() == b"tactic-a\ntactic-b"
    assert entry.meta["merged_builds"] == 2 and entry.label["backend"] == "trt-timing-cache"


# ------------------------------------------------------ backend and keys --


def test_key_factors_onnx_mode():
    b = TRT
    r = load_recipe("tiny-llama")
    opts = BuildOptions(device="cuda", dtype="fp16", mode="onnx", extra={"opt_level": 4})
    f = b.factors(r, opts)
    assert f["mode"] == "onnx" and f["opt_level"] == 4 and f["allow_host_code"] is False
    assert f["export"]["dtype"] == "fp16" and f["export"]["opset"] == ExportSpec().opset
    assert f["profiles"][0]["input_ids"] == [[1, 1], [1, 8], [1, 8]]
    assert b.factors(r, BuildOptions(device="cuda", dtype="fp16", mode="onnx")) != f
    assert set(b.toolchain(opts)) >= {"python", "torch", "cuda", "tensorrt"}


def test_key_factors_llm_mode():
    b = TRT
    r = load_recipe("llama-7b")  # prefill_len 16, max_seq_len 256, max_batch 1
    opts = BuildOptions(device="cuda", dtype="bf16")
    f = b.factors(r, opts)
    assert f["mode"] == "llm" and f["dtype"] == "bf16"
    assert f["build_config"] == {
        "max_batch_size": 1,
        "max_input_len": 16,
        "max_seq_len": 256,
        "max_num_tokens": 16,
        "max_beam_width": 1,
        "gather_context_logits": True,
    }
    assert {"tensorrt", "tensorrt_llm"} <= set(b.toolchain(opts))


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"dtype": "int8"}, "TensorRT-LLM) supports dtype fp32, fp16, bf16, not 'int8'"),
        ({"dtype": "int8", "mode": "onnx"}, "int8 needs an explicitly quantized ONNX graph"),
        ({"mode": "plan"}, "backend 'trt' has modes llm, onnx"),
        ({"extra": {"opset": 19}}, "apply to --mode onnx only"),
    ],
)
def test_bad_options_are_one_line_errors(kwargs, message):
    with pytest.raises(BackendError) as e:
        api.make_context("tiny-llama", "trt", **kwargs)
    assert message in str(e.value) and "\n" not in str(e.value)


@pytest.mark.skipif(HAVE_TRT, reason="tensorrt is importable here")
def test_unavailable_without_tensorrt(cache_dir):
    ok, reason = TRT.available(BuildOptions(device="cuda"))
    assert not ok and reason.startswith("tensorrt not importable: pip install 'artifactcache[trt]'")
    with pytest.raises(BackendUnavailable, match="tensorrt not importable"):
        api.make_context("tiny-llama", "trt")
    from artifactcache.cli.app import app

    r = CliRunner().invoke(app, ["build", "tiny-llama", "--backend", "trt"])
    assert r.exit_code == 1
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: backend 'trt' is unavailable: tensorrt")
    assert "pip install 'artifactcache[trt]'" in lines[0]


# ------------------------------------------------- TensorRT-LLM checkpoint --


# The families trt --mode llm writes a config for (the others are refused, tested below).
TINY_TRTLLM = [n for n in TINY if load_recipe(n).family not in ("qwen2", "qwen3")]


@pytest.mark.parametrize("recipe", TINY_TRTLLM)
def test_hf_checkpoint_for_trtllm_matches_eager(recipe, tmp_path):
    """What TensorRT-LLM is handed (config.json + safetensors) is the same model,
    as transformers reads it."""
    transformers = pytest.importorskip("transformers")
    r = load_recipe(recipe)
    ctx = BuildContext(recipe=r, opts=BuildOptions(), weights=WeightsSpec(None, 3))
    d = write_hf_checkpoint(ctx, Path(tmp_path) / "hf", "fp32")
    assert hf_config(r, "fp32")["architectures"][0].endswith("ForCausalLM")
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(d), dtype=torch.float32).eval()
    ours = build_model(r, weights=WeightsSpec(None, 3))
    ids = torch.randint(0, 1000, (1, 24))  # past tiny-mistral's 16-token window
    with torch.no_grad():
        want = ours(ids, torch.arange(24))
        got = hf(ids).logits
    assert float((got - want).abs().max() / want.abs().max()) < 1e-4


@pytest.mark.parametrize("recipe", ["tiny-qwen2", "tiny-qwen3"])
def test_trtllm_refuses_a_family_it_has_no_config_for(recipe):
    """Before any work: the key's factors already need the family's config."""
    r = load_recipe(recipe)
    with pytest.raises(BackendError, match=f"does not build family {r.family} yet"):
        TRT.factors(r, BuildOptions(device="cuda", mode="llm"))
    with pytest.raises(BackendError, match="use --mode onnx"):
        hf_config(r, "fp32")


# ------------------------------------------------------ real TensorRT only --


@pytest.mark.skipif(not HAVE_TRT, reason="tensorrt not importable")
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_onnx_engine_parity_with_eager(tmp_path):
    store = LocalStore(tmp_path / "c")
    runner = api.load("tiny-llama", "trt", device="cuda", mode="onnx", store=store)
    eager = api.load("tiny-llama", "eager", device="cuda", store=store)
    ids = list(load_recipe("tiny-llama").bench.prompt_ids)
    got, want = runner.logits(ids), eager.logits(ids)
    assert float((got - want).abs().max() / want.abs().max()) < 1e-2
    assert runner.generate(ids, 16) == eager.generate(ids, 16)
