"""runner.py: the shared greedy loop and the CUDA-graph wrapper for plain steps."""

from __future__ import annotations

import pytest
import torch

from artifactcache.backends.runner import StepRunner, cuda_graph_step, decode_examples
from artifactcache.models import build_model
from artifactcache.recipes import load_recipe


def _steps(model):
    return (lambda *inputs: model(*inputs)), (lambda *inputs: model(*inputs))


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
    wrapped, info = cuda_graph_step(step, decode_examples(recipe, torch.device("cpu")))
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
    decode, info = cuda_graph_step(_steps(model)[1], decode_examples(recipe, dev))
    assert info["cuda_graph"] is (graphs == "1"), info
    graphed = StepRunner(recipe, _steps(model)[0], decode, dev).generate(prompt, 32)
    assert graphed == plain


def test_decode_examples_differ_in_token_position_and_row_start():
    recipe = load_recipe("tiny-llama").with_shapes(max_batch=3)
    (i1, p1, r1), (i2, p2, r2) = decode_examples(recipe, torch.device("cpu"))
    assert i1.shape == i2.shape == (3, 1) and p1.shape == p2.shape == (1,)
    assert r1.shape == r2.shape == (3,)
    assert (i2 != i1).all() and int(p2) == int(p1) + 1 < recipe.shapes.max_seq_len
    assert (r2 != r1).all() and (r2 <= p2).all()  # still real rows at the later position


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_graph_that_ignores_its_inputs_is_refused(monkeypatch):
    """The replay is checked at a second input; the fallback is the fresh step."""
    recipe = load_recipe("tiny-llama")
    dev = torch.device("cuda")
    model = build_model(recipe, device=dev)
    frozen = {}

    def ignores_inputs(*inputs):
        """Right when run plainly; its graph reads buffers fixed before capture."""
        frozen.setdefault("args", tuple(t.clone() for t in inputs))
        if torch.cuda.is_current_stream_capturing():
            return model(*frozen["args"])
        return model(*inputs)

    plain = _steps(model)[1]
    decode, info = cuda_graph_step(
        ignores_inputs, decode_examples(recipe, dev), fresh_step=lambda: plain
    )
    assert decode is plain and info["cuda_graph"] is False
    assert "differs" in info["cuda_graph_reason"]
