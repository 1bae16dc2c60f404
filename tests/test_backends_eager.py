"""eager: the baseline Runner over the shared StepRunner, through the store."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from _backend_util import TINY, private_dir

from artifactcache import api
from artifactcache.backends.base import BuildContext, get_backend
from artifactcache.errors import BackendError, ShapeError
from artifactcache.models import build_model
from artifactcache.recipes import load_recipe


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    return private_dir(tmp_path_factory, "eager-cache")


def naive_greedy(recipe, prompt: list[int], n: int) -> list[int]:
    """Greedy decoding by recomputing the whole sequence each step (no cache reuse)."""
    model = build_model(recipe)
    seq = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            logits = model(torch.tensor([seq]), torch.arange(len(seq)))
            seq.append(int(logits[0, -1].argmax()))
    return seq[len(prompt) :]


@pytest.mark.parametrize("name", TINY)
def test_generate_matches_full_recompute(name: str, root: Path):
    recipe = load_recipe(name)
    runner = api.load(name, "eager", cache_dir=root)
    prompt = list(recipe.bench.prompt_ids)
    assert runner.generate(prompt, 24) == naive_greedy(recipe, prompt, 24)


def test_logits_shape_dtype_and_padding_independence(root: Path):
    recipe = load_recipe("tiny-llama")
    runner = api.load("tiny-llama", "eager", cache_dir=root)
    ids = list(recipe.bench.prompt_ids)
    out = runner.logits(ids)
    assert out.shape == (len(ids), recipe.model.vocab_size)
    assert out.dtype == torch.float32 and out.device.type == "cpu"
    # The first 3 positions' logits do not depend on what follows (causal + padding).
    assert torch.allclose(runner.logits(ids[:3]), out[:3], rtol=1e-5, atol=1e-5)
    # A fresh forward each time: the same answer after a generation filled the cache.
    runner.generate(ids, 10)
    assert torch.equal(runner.logits(ids), out)


def test_build_is_cached_and_load_records_phases(root: Path):
    first = api.build("tiny-phi-2", "eager", cache_dir=root)
    again = api.build("tiny-phi-2", "eager", cache_dir=root)
    assert again.key == first.key and not again.built and again.bytes > 0
    assert (first.entry.path / "eager.json").is_file()
    ctx = BuildContext(recipe=None, opts=None, weights=None)
    api.load("tiny-phi-2", "eager", cache_dir=root, build_on_miss=False, context=ctx)
    assert ctx.phases["entry_ready"] <= ctx.phases["weights_ready"] <= ctx.phases["artifact_ready"]


def test_keys_differ_by_dtype_and_seed():
    b = get_backend("eager")
    keys = set()
    for dtype, seed in [("fp32", 0), ("bf16", 0), ("fp32", 1)]:
        _, ctx = api.make_context("tiny-llama", "eager", dtype=dtype, seed=seed)
        keys.add(api.key_for(b, ctx).key)
    assert len(keys) == 3


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_half_dtypes_run(dtype: str, root: Path):
    runner = api.load("tiny-llama", "eager", dtype=dtype, cache_dir=root)
    out = runner.logits([1, 2, 3])
    assert out.dtype == torch.float32 and torch.isfinite(out).all()
    assert len(runner.generate([1, 2, 3], 5)) == 5


def test_shapes_that_do_not_fit(root: Path):
    recipe = load_recipe("tiny-llama")
    runner = api.load("tiny-llama", "eager", cache_dir=root)
    # prefill_len is the chunk size, not a limit: the context is.
    assert runner.logits([1] * (recipe.shapes.prefill_len + 1)).shape[0] == 9
    with pytest.raises(ShapeError, match="max_seq_len"):
        runner.logits([1] * (recipe.shapes.max_seq_len + 1))
    with pytest.raises(ShapeError, match="max_seq_len"):
        runner.generate([1, 2], recipe.shapes.max_seq_len)
    with pytest.raises(ShapeError, match="vocabulary"):
        runner.logits([recipe.model.vocab_size])
    with pytest.raises(ShapeError, match="empty"):
        runner.generate([], 3)
    assert runner.generate([1, 2], 0) == []


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"mode": "max-autotune"}, "no modes"),
        ({"dtype": "fp8"}, "unknown dtype"),
        ({"device": "tpu"}, "unknown device"),
    ],
)
def test_bad_options_are_one_line_errors(kwargs, match):
    with pytest.raises(BackendError, match=match) as ei:
        api.make_context("tiny-llama", "eager", **kwargs)
    assert "\n" not in str(ei.value)
