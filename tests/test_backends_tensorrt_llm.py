"""backends/tensorrt/llm.py: the checkpoint handed to TensorRT-LLM, as transformers reads it,
and the refusal of a TensorRT-LLM without its TensorRT engine backend (1.3 on)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch
from _trt_standin import Recording, StandinModule
from typer.testing import CliRunner

from artifactcache.backends.base import BuildContext
from artifactcache.backends.tensorrt import BACKEND as TRT
from artifactcache.backends.tensorrt import llm
from artifactcache.backends.tensorrt.llm import (
    hf_config,
    write_hf_checkpoint,
)
from artifactcache.choices import BuildChoices
from artifactcache.errors import BackendError
from artifactcache.models import WeightsSpec, build_model
from artifactcache.recipes import list_recipes, load_recipe

HAVE_TRT = importlib.util.find_spec("tensorrt") is not None
TINY = [r.name for r in list_recipes() if r.name.startswith("tiny-")]
# The families trt --mode llm writes a config for (the others are refused, tested below).
TINY_TRTLLM = [n for n in TINY if load_recipe(n).family not in ("qwen2", "qwen3")]


@pytest.mark.parametrize("recipe", TINY_TRTLLM)
def test_hf_checkpoint_for_trtllm_matches_eager(recipe, tmp_path):
    """What TensorRT-LLM is handed (config.json + safetensors) is the same model,
    as transformers reads it."""
    transformers = pytest.importorskip("transformers")
    r = load_recipe(recipe)
    ctx = BuildContext(recipe=r, opts=BuildChoices(), weights=WeightsSpec(None, 3))
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
        TRT.factors(r, BuildChoices(device="cuda", mode="llm"))
    with pytest.raises(BackendError, match=r"drop --mode llm \(the default, --mode onnx"):
        hf_config(r, "fp32")
    # The default, plain TensorRT, keys (and so builds) every family.
    assert TRT.factors(r, BuildChoices(device="cuda"))["mode"] == "onnx"


def _install_trtllm(monkeypatch, root: Path, version: str, engine_api: bool) -> None:
    """A stand-in tensorrt_llm laid out as pip installs it (package + dist-info) on sys.path;
    ``engine_api``: whether it has tensorrt_llm/_tensorrt_engine, the LLM this path uses."""
    pkg = root / "tensorrt_llm"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(f"__version__ = {version!r}\n")
    if engine_api:
        (pkg / "_tensorrt_engine").mkdir()
        (pkg / "_tensorrt_engine" / "__init__.py").write_text("class LLM: ...\n")
    info = root / f"tensorrt_llm-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: tensorrt-llm\nVersion: {version}\n"
    )
    monkeypatch.delitem(sys.modules, "tensorrt_llm", raising=False)
    monkeypatch.syspath_prepend(str(root))


def test_trtllm_without_engine_backend_is_refused_before_the_cache_is_opened(
    monkeypatch, tmp_path, cache_dir
):
    """TensorRT-LLM 1.3 (its main branch from July 2026) has no TensorRT engine backend:
    --mode llm gets one line at argument time, naming the version and both ways out;
    nothing written."""
    _install_trtllm(monkeypatch, tmp_path / "site", "1.3.0", engine_api=False)
    from artifactcache.cli.app import app

    r = CliRunner().invoke(app, ["build", "tiny-llama", "--backend", "trt", "--mode", "llm"])
    assert r.exit_code == 1
    lines = r.output.strip().splitlines()
    assert len(lines) == 1, r.output
    assert lines[0].startswith(
        "error: backend 'trt' is unavailable: TensorRT-LLM 1.3.0 has no TensorRT engine backend"
    )
    assert "pip install 'artifactcache[trtllm]' (pins tensorrt-llm<1.3)" in lines[0]
    assert "--mode onnx" in lines[0]
    assert list(cache_dir.iterdir()) == []


@pytest.mark.parametrize(
    "version, engine_api, refused",
    [
        ("1.3.0", False, True),
        ("1.3.0rc2", False, True),  # a main-branch pre-release: PEP 440 sorts it below 1.3
        ("1.3.0", True, True),
        ("1.2.0", False, True),  # 1.x without tensorrt_llm._tensorrt_engine
        ("1.2.0", True, False),
        ("1.2.1", True, False),
        ("0.17.0.post1", False, False),  # 0.x: tensorrt_llm.LLM is the engine LLM
    ],
)
def test_trtllm_engine_backend_check(monkeypatch, tmp_path, version, engine_api, refused):
    _install_trtllm(monkeypatch, tmp_path / "site", version, engine_api)
    monkeypatch.setitem(sys.modules, "tensorrt", StandinModule(Recording("10.13.0")))
    problem = llm.engine_backend_problem()
    ok, reason = TRT.available(BuildChoices(device="cuda", mode="llm"))
    if refused:
        assert problem is not None and problem.startswith(f"TensorRT-LLM {version} has no")
        assert (ok, reason) == (False, problem)
    else:
        assert problem is None
        assert (ok, reason) == (True, "")
    # The plain TensorRT path, the default, does not need TensorRT-LLM at all.
    assert TRT.available(BuildChoices(device="cuda", mode="onnx")) == (True, "")
    assert TRT.available(BuildChoices(device="cuda")) == (True, "")
    assert "tensorrt_llm" not in sys.modules  # read without importing it


@pytest.mark.skipif(HAVE_TRT, reason="tensorrt is importable here: the default would build")
def test_the_default_mode_never_looks_at_trtllm(monkeypatch, tmp_path, cache_dir):
    """A TensorRT-LLM without engines installed: a plain --backend trt goes the plain
    TensorRT way (here: no tensorrt, so that is what it names), not the TensorRT-LLM check."""
    _install_trtllm(monkeypatch, tmp_path / "site", "1.3.0", engine_api=False)
    monkeypatch.setattr(llm, "engine_backend_problem", lambda: pytest.fail("llm check ran"))
    from artifactcache.cli.app import app

    r = CliRunner().invoke(app, ["build", "tiny-llama", "--backend", "trt"])
    assert r.exit_code == 1
    (line,) = r.output.strip().splitlines()
    assert line == (
        "error: backend 'trt' is unavailable: tensorrt not importable: "
        "pip install 'artifactcache[trt]'"
    )
    assert list(cache_dir.iterdir()) == []
