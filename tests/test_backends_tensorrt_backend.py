"""backends/tensorrt/backend.py: key factors, option refusals, availability, engine parity.

The TensorRT and TensorRT-LLM calls themselves are unverified here (neither can
be installed on our machines); the tests that need them skip with the reason
"tensorrt not importable". The build and load paths run against a recording
stand-in in tests/test_backends_tensorrt_standin.py.
"""

from __future__ import annotations

import importlib.util
import sys

import pytest
import torch
from typer.testing import CliRunner

from artifactcache import api
from artifactcache.backends.onnx.export import ExportSpec
from artifactcache.backends.tensorrt import BACKEND as TRT
from artifactcache.backends.tensorrt.options import resolve_mode
from artifactcache.choices import BuildChoices
from artifactcache.errors import BackendError, BackendUnavailable
from artifactcache.recipes import load_recipe
from artifactcache.store.local import LocalStore

HAVE_TRT = importlib.util.find_spec("tensorrt") is not None


def test_version_compatible_engines_are_keyed_by_the_major(monkeypatch):
    """So that a TensorRT upgrade within the major finds the entry at all."""
    from artifactcache import keys

    def toolchain(version: str, **extra):
        monkeypatch.setattr(keys, "package_version", lambda d: version if "tensorrt" in d else "1")
        return TRT.toolchain(BuildChoices(device="cuda", mode="onnx", extra=extra))

    vc = {"allow_host_code": True}
    assert toolchain("10.3.0", **vc)["tensorrt"] == toolchain("10.4.0", **vc)["tensorrt"]
    assert toolchain("10.3.0", **vc)["tensorrt"] != toolchain("11.0.0", **vc)["tensorrt"]
    assert toolchain("10.3.0")["tensorrt"] != toolchain("10.4.0")["tensorrt"]


def test_key_factors_onnx_mode():
    b = TRT
    r = load_recipe("tiny-llama")
    opts = BuildChoices(device="cuda", dtype="fp16", mode="onnx", extra={"opt_level": 4})
    f = b.factors(r, opts)
    assert f["mode"] == "onnx" and f["opt_level"] == 4 and f["allow_host_code"] is False
    assert f["export"]["dtype"] == "fp16" and f["export"]["opset"] == ExportSpec().opset
    assert f["profiles"][0]["input_ids"] == [[1, 1], [1, 8], [1, 8]]
    assert b.factors(r, BuildChoices(device="cuda", dtype="fp16", mode="onnx")) != f
    assert set(b.toolchain(opts)) >= {"python", "torch", "cuda", "tensorrt"}


@pytest.mark.parametrize("recipe", ["tiny-llama", "llama-7b"])
def test_the_default_mode_is_onnx_and_keys_as_onnx(monkeypatch, recipe):
    """Plain TensorRT is the default for a recipe, and the key records the resolved mode:
    no --mode, --mode default and --mode onnx are one entry; --mode llm is another."""
    from artifactcache.backends.base import BuildContext
    from artifactcache.models import WeightsSpec

    assert resolve_mode(BuildChoices()) == "onnx"
    # The key's hardware factor needs a GPU; the same stand-in GPU for every mode.
    key_module = sys.modules[api.key_for.__module__]
    monkeypatch.setattr(key_module, "hardware_fingerprint", lambda device, **kw: {"gpu": "x"})
    r = load_recipe(recipe)

    def key(**kw):
        ctx = BuildContext(r, BuildChoices(device="cuda", dtype="fp16", **kw), WeightsSpec())
        return api.key_for(TRT, ctx)

    default = key()
    assert default.factors["backend"]["options"]["mode"] == "onnx"
    assert "tensorrt_llm" not in default.factors["toolchain"]
    assert key(mode="default").key == key(mode="onnx").key == default.key
    llm = key(mode="llm")
    assert llm.factors["backend"]["options"]["mode"] == "llm" and llm.key != default.key


def test_key_factors_llm_mode():
    b = TRT
    r = load_recipe("llama-7b")  # prefill_len 16, max_seq_len 256, max_batch 1
    opts = BuildChoices(device="cuda", dtype="bf16", mode="llm")
    f = b.factors(r, opts)
    assert f["mode"] == "llm" and f["dtype"] == "bf16"
    assert f["build_config"] == {
        "max_batch_size": 1,
        "max_input_len": 256,  # a prompt may take the context: no prefill_len cap
        "max_seq_len": 256,
        "max_num_tokens": 256,
        "max_beam_width": 1,
        "gather_context_logits": True,
    }
    assert {"tensorrt", "tensorrt_llm"} <= set(b.toolchain(opts))


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"dtype": "int8"}, "int8 needs an explicitly quantized ONNX graph"),  # the default
        ({"dtype": "int8", "mode": "onnx"}, "int8 needs an explicitly quantized ONNX graph"),
        ({"dtype": "int8", "mode": "llm"}, "TensorRT-LLM) supports dtype fp32, fp16, bf16"),
        ({"mode": "plan"}, "backend 'trt' has modes onnx, llm (got --mode plan)"),
        ({"extra": {"opset": 19}, "mode": "llm"}, "apply to --mode onnx only"),
    ],
)
def test_bad_options_are_one_line_errors(kwargs, message):
    with pytest.raises(BackendError) as e:
        api.make_context("tiny-llama", "trt", **kwargs)
    assert message in str(e.value) and "\n" not in str(e.value)


@pytest.mark.skipif(HAVE_TRT, reason="tensorrt is importable here")
def test_unavailable_without_tensorrt(cache_dir):
    # The default needs the trt extra only; --mode llm names the trtllm extra as well.
    ok, reason = TRT.available(BuildChoices(device="cuda"))
    assert (ok, reason) == (False, "tensorrt not importable: pip install 'artifactcache[trt]'")
    ok, reason = TRT.available(BuildChoices(device="cuda", mode="llm"))
    assert not ok and reason.startswith(
        "tensorrt not importable: pip install 'artifactcache[trt,trtllm]' (--mode llm"
    )
    with pytest.raises(BackendUnavailable, match="tensorrt not importable"):
        api.make_context("tiny-llama", "trt")
    from artifactcache.cli.app import app

    r = CliRunner().invoke(app, ["build", "tiny-llama", "--backend", "trt"])
    assert r.exit_code == 1
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: backend 'trt' is unavailable: tensorrt")
    assert "pip install 'artifactcache[trt]'" in lines[0]


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
