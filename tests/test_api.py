"""The front door (artifactcache.api): one build/load/compile for recipes and model specs."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import artifactcache
from artifactcache import api
from artifactcache.errors import AcacheError

SPEC = str(Path(__file__).resolve().parents[1] / "examples" / "vision.py") + ":tiny_convnet"


def test_build_and_load_take_a_model_spec(tmp_path):
    built = api.build(SPEC, "eager", cache_dir=tmp_path, inputs=["2x3x32x32"])
    assert built.built and built.entry.meta["outputs"] >= 1
    again = api.build(SPEC, "eager", cache_dir=tmp_path, inputs=["2x3x32x32"])
    assert not again.built and again.key == built.key
    compiled = api.load(SPEC, "eager", cache_dir=tmp_path, inputs=["2x3x32x32"])
    assert compiled.key == built.key and compiled.source == "local"
    out = compiled(torch.randn(2, 3, 32, 32))
    assert isinstance(out, torch.Tensor | tuple | list | dict)


def test_build_and_load_take_a_recipe(tmp_path):
    built = api.build("tiny-llama", "eager", cache_dir=tmp_path)
    runner = api.load("tiny-llama", "eager", cache_dir=tmp_path, build_on_miss=False)
    assert built.built
    assert len(runner.generate([1, 2, 3], 2, eos_token_ids=())) == 2


def test_compile_takes_a_spec_a_module_or_a_recipe(tmp_path):
    from artifactcache.sources.module import call_factory

    by_spec = api.compile(SPEC, backend="eager", cache_dir=tmp_path)
    module, inputs = call_factory(SPEC)
    by_module = artifactcache.compile(module, inputs, backend="eager", cache_dir=tmp_path)
    assert by_spec.key == by_module.key  # the same module, the same key
    runner = api.compile("tiny-llama", backend="eager", cache_dir=tmp_path)
    assert hasattr(runner, "generate")
    built = api.build("tiny-llama", "eager", cache_dir=tmp_path)
    api.compile("tiny-llama", backend="eager", cache_dir=tmp_path, force=True)  # rebuilds
    assert api.build("tiny-llama", "eager", cache_dir=tmp_path).entry.created > built.entry.created


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda d: api.build(SPEC, "eager", cache_dir=d, max_seq_len=64), "--max-seq-len is for"),
        (lambda d: api.load(SPEC, "eager", cache_dir=d, quant="int8wo"), "--quant is for a recipe"),
        (lambda d: api.build("tiny-llama", "eager", cache_dir=d, inputs=["1x4"]), "--input is for"),
        (lambda d: api.compile("tiny-llama", (1,), backend="eager", cache_dir=d), "example in"),
        (lambda d: api.compile("tiny-llama", backend="eager", cache_dir=d, version="2"), "tag="),
    ],
)
def test_a_choice_of_the_other_path_is_one_line_and_writes_nothing(tmp_path, call, message):
    with pytest.raises(AcacheError, match=message):
        call(tmp_path / "cache")
    assert not (tmp_path / "cache").exists()
