"""backends/tensorrt/llm.py: the checkpoint handed to TensorRT-LLM, as transformers reads it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from artifactcache.backends.base import BuildContext, BuildOptions
from artifactcache.backends.tensorrt import BACKEND as TRT
from artifactcache.backends.tensorrt.llm import (
    hf_config,
    write_hf_checkpoint,
)
from artifactcache.errors import BackendError
from artifactcache.models import WeightsSpec, build_model
from artifactcache.recipes import list_recipes, load_recipe

TINY = [r.name for r in list_recipes() if r.name.startswith("tiny-")]
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
