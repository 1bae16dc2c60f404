"""runner.py: the shared greedy loop and the CUDA-graph wrapper for plain steps."""

from __future__ import annotations

import pytest
import torch

from artifactcache.backends.runner import StepRunner, cuda_graph_step, example_inputs
from artifactcache.models import build_model
from artifactcache.recipes import load_recipe


def _steps(model):
    return (lambda i, p: model(i, p)), (lambda i, p: model(i, p))


def test_generate_returns_python_ints_and_stops_at_n():
    recipe = load_recipe("tiny-llama")
    model = build_model(recipe)
    runner = StepRunner(recipe, *_steps(model), torch.device("cpu"))
    out = runner.generate(list(recipe.bench.prompt_ids), 7)
    assert len(out) == 7 and all(type(t) is int for t in out)
    assert runner.generate(list(recipe.bench.prompt_ids), 0) == []


def test_cuda_graph_step_keeps_cpu_steps_as_they_are():
    recipe = load_recipe("tiny-llama")
    model = build_model(recipe)
    step = _steps(model)[1]
    wrapped, info = cuda_graph_step(step, example_inputs(recipe, torch.device("cpu"), True))
    assert wrapped is step
    assert info == {"cuda_graph": False, "cuda_graph_reason": "not a CUDA device"}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("graphs", ["1", "0"])
def test_cuda_graph_decode_generates_the_plain_tokens(graphs: str, monkeypatch):
    monkeypatch.setenv("ACACHE_CUDA_GRAPHS", graphs)
    recipe = load_recipe("tiny-llama")
    dev = torch.device("cuda")
    model = build_model(recipe, device=dev)
    prompt = list(recipe.bench.prompt_ids)
    plain = StepRunner(recipe, *_steps(model), dev).generate(prompt, 32)
    decode, info = cuda_graph_step(_steps(model)[1], example_inputs(recipe, dev, True))
    assert info["cuda_graph"] is (graphs == "1"), info
    graphed = StepRunner(recipe, _steps(model)[0], decode, dev).generate(prompt, 32)
    assert graphed == plain
