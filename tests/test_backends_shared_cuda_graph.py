"""cuda_graph.py: steps replayed from CUDA graphs, one per input shapes, checked against
the plain step (the CUDA tests run on a GPU machine only)."""

from __future__ import annotations

import pytest
import torch

from artifactcache.backends.shared.cuda_graph import cuda_graph_step
from artifactcache.backends.shared.runner import StepRunner
from artifactcache.backends.shared.steps import decode_examples
from artifactcache.models import build_model
from artifactcache.recipes import load_recipe


def _steps(model):
    return (lambda *inputs: model(*inputs)), (lambda *inputs: model(*inputs))


def _long_recipe(tmp_path):
    from _generate_util import write_recipe

    return load_recipe(write_recipe(tmp_path, max_seq_len=1024, max_positions=1024))


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
    plain = StepRunner(recipe, *_steps(model), dev, kv_len_hint=True).generate(prompt, 32)
    decode, info = cuda_graph_step(_steps(model)[1], decode_examples(recipe, dev))
    assert info["cuda_graph"] is (graphs == "1"), info
    graphed = StepRunner(recipe, _steps(model)[0], decode, dev, kv_len_hint=True)
    assert graphed.generate(prompt, 32) == plain


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


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_graph_per_bucket_captured_on_first_use(tmp_path, monkeypatch):
    monkeypatch.setenv("ACACHE_CUDA_GRAPHS", "1")
    recipe = _long_recipe(tmp_path)
    dev = torch.device("cuda")
    model = build_model(recipe, device=dev)
    prompt = [(3 * i + 1) % 32000 for i in range(250)]
    plain = StepRunner(recipe, *_steps(model), dev, kv_len_hint=True)
    want = plain.generate(prompt, 300, eos_token_ids=())
    decode, info = cuda_graph_step(_steps(model)[1], decode_examples(recipe, dev))
    assert info == {"cuda_graph": True, "cuda_graphs": 1}
    graphed = StepRunner(recipe, _steps(model)[0], decode, dev, info=info, kv_len_hint=True)
    assert graphed.generate(prompt, 300, eos_token_ids=()) == want
    # Positions 250..548 span buckets 256, 512 and 768; 256 was captured at load.
    assert graphed.info == {"cuda_graph": True, "cuda_graphs": 3}
