"""Sampling and EOS on eager (the compiled backends: their own test modules); the sampler's
arguments and distribution."""

from __future__ import annotations

import math

import pytest
import torch
from _backend_util import BATCH_PROMPTS, private_dir, runner_cache
from _generate_util import assert_sampling_and_eos, naive_greedy
from torch.overrides import TorchFunctionMode

from artifactcache.backends.shared.runner import StepRunner
from artifactcache.errors import GenerationError
from artifactcache.generate import Sampling, cut_at_eos, resolve_eos_ids
from artifactcache.models import build_model
from artifactcache.recipes import load_recipe

RECIPE = "tiny-llama"


@pytest.fixture(scope="module")
def runners(tmp_path_factory):
    return runner_cache(private_dir(tmp_path_factory, "generate-sampling"))


def _prompt() -> list[int]:
    return list(load_recipe(RECIPE).bench.prompt_ids)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"temperature": -0.5}, "temperature (--temperature) must be a finite number >= 0"),
        ({"temperature": math.nan}, "temperature (--temperature) must be a finite number >= 0"),
        ({"temperature": 1.0, "top_k": 0}, "top_k (--top-k) must be an integer >= 1"),
        ({"temperature": 1.0, "top_p": 0.0}, "top_p (--top-p) must be in (0, 1]"),
        ({"temperature": 1.0, "top_p": 1.5}, "top_p (--top-p) must be in (0, 1]"),
        ({"temperature": 1.0, "seed": -1}, "seed must be an integer >= 0"),
        ({"top_k": 5}, "set a temperature > 0"),
        ({"top_p": 0.9}, "set a temperature > 0"),
    ],
)
def test_bad_sampling_arguments_are_one_line_errors(kwargs, message, runners):
    with pytest.raises(GenerationError) as e:
        Sampling(**kwargs)
    assert message in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(GenerationError, match="must|temperature"):
        runners(RECIPE, "eager").generate(_prompt(), 4, **kwargs)


def test_eos_ids_outside_the_vocabulary_are_refused(runners):
    with pytest.raises(GenerationError, match="EOS token id 32000 is outside the vocabulary"):
        runners(RECIPE, "eager").generate(_prompt(), 4, eos_token_ids=[32000])


def test_cut_at_eos_keeps_the_first_eos_only():
    assert cut_at_eos([5, 6, 2, 7, 2], [2]) == [5, 6, 2]
    assert cut_at_eos([5, 6], [2]) == [5, 6]


def test_the_sampler_follows_the_distribution_and_its_filters():
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    logits = probs.log()

    def freqs(**kw) -> torch.Tensor:
        pick = Sampling(temperature=1.0, seed=0, **kw).sampler(torch.device("cpu"))
        draws = torch.tensor([int(pick(logits)) for _ in range(4000)])
        return torch.bincount(draws, minlength=4).float() / len(draws)

    assert torch.allclose(freqs(), probs, atol=0.03)
    top2 = freqs(top_k=2)
    assert top2[2:].sum() == 0 and torch.allclose(top2[:2], torch.tensor([0.625, 0.375]), atol=0.03)
    # top_p 0.8: 0.5 + 0.3 reach it, so the two least likely tokens are dropped.
    nucleus = freqs(top_p=0.8)
    assert nucleus[2:].sum() == 0 and torch.allclose(nucleus[:2], top2[:2], atol=0.03)


def test_the_sampler_draws_each_row_of_a_batch_on_its_own():
    # Row r puts almost all its mass on token r, and a little on token 3.
    logits = torch.full((3, 4), -30.0)
    logits[torch.arange(3), torch.arange(3)] = 10.0
    logits[:, 3] = 0.0
    want = torch.tensor([[0], [1], [2]])
    assert torch.equal(Sampling().sampler(torch.device("cpu"))(logits), want)
    for kw in ({}, {"top_k": 2}, {"top_p": 0.9}):
        pick = Sampling(temperature=1.0, seed=0, **kw).sampler(torch.device("cpu"), rows=3)
        assert torch.equal(pick(logits), want), kw
    one = Sampling(temperature=1.0, seed=0).sampler(torch.device("cpu"))(logits[1])
    assert one.shape == (1, 1)  # a single row of logits keeps the [1, 1] shape


class _CountCalls(TorchFunctionMode):
    """How many times each torch function or Tensor method ran inside the block."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: dict[str, int] = {}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", str(func))
        self.calls[name] = self.calls.get(name, 0) + 1
        return func(*args, **(kwargs or {}))


def test_unseeded_rows_draw_in_one_launch_seeded_rows_each_from_their_own_generator():
    # As above: row r puts almost all its mass on token r.
    logits = torch.full((3, 4), -30.0)
    logits[torch.arange(3), torch.arange(3)] = 10.0
    logits[:, 3] = 0.0
    for seed, launches in ((None, 1), (0, 3), ((4, 4, 1), 3)):
        pick = Sampling(temperature=1.0, seed=seed).sampler(torch.device("cpu"), rows=3)
        with _CountCalls() as counted:
            got = pick(logits)
        assert counted.calls["exponential_"] == launches, seed
        assert torch.equal(got, torch.tensor([[0], [1], [2]])), seed  # each row its own


def _eager_runner(rows: int) -> StepRunner:
    recipe = load_recipe(RECIPE).with_shapes(max_batch=rows)
    model = build_model(recipe)

    def step(*inputs):
        return model(*inputs)

    return StepRunner(recipe, step, step, torch.device("cpu"))


def test_each_row_of_a_sampled_batch_samples_as_its_prompt_alone():
    wide, alone = _eager_runner(rows=4), _eager_runner(rows=1)
    prompts = [list(p) for p in BATCH_PROMPTS]
    sampled = dict(temperature=1.0, eos_token_ids=())
    n = 20
    # One int: row i gets seed + i; a batch of one is generate() itself.
    rows = wide.generate_batch(prompts, n, seed=5, **sampled)
    assert rows == [alone.generate(p, n, seed=5 + i, **sampled) for i, p in enumerate(prompts)]
    assert wide.generate_batch(prompts[:1], n, seed=5, **sampled) == [rows[0]]
    # One seed per row: rows with equal seeds each sample as a lone run with that seed.
    seeds = [9, 9, 3, 9]
    rows = wide.generate_batch(prompts, n, seed=seeds, **sampled)
    for p, s, got in zip(prompts, seeds, rows, strict=True):
        assert got == alone.generate(p, n, seed=s, **sampled)
    # The same prompt twice: distinct samples under one int, equal ones under equal seeds.
    twice = [prompts[0], prompts[0]]
    a, b = wide.generate_batch(twice, n, seed=5, **sampled)
    assert a != b
    a, b = wide.generate_batch(twice, n, seed=(4, 4), **sampled)
    assert a == b == alone.generate(prompts[0], n, seed=4, **sampled)


@pytest.mark.parametrize(
    ("seed", "message"),
    [
        ([1, 2, 3], "3 seeds for 2 prompts: give one seed per prompt"),
        ([1, -2], "seed must be an integer >= 0 or one such integer per prompt"),
        ([], "seed must be an integer >= 0 or one such integer per prompt"),
    ],
)
def test_seeds_per_row_are_checked_before_any_step(seed, message):
    calls: list[int] = []
    recipe = load_recipe(RECIPE).with_shapes(max_batch=2)

    def step(*inputs):
        calls.append(1)
        raise AssertionError("no step may run")

    runner = StepRunner(recipe, step, step, torch.device("cpu"))
    with pytest.raises(GenerationError) as e:
        runner.generate_batch([[1, 2], [3]], 4, temperature=1.0, seed=seed)
    assert message in str(e.value) and "\n" not in str(e.value) and calls == []


def test_eager_greedy_is_the_full_forward_argmax(runners):
    prompt = _prompt()
    assert runners(RECIPE, "eager").generate(prompt, 12) == naive_greedy(
        load_recipe(RECIPE), prompt, 12
    )


def test_sampling_and_eos(runners):
    """generate()'s sampling and EOS on eager; the compiled backends run the same checks on
    their modules' tiny-llama entries (test_backends_inductor.py, test_backends_aoti.py)."""
    assert_sampling_and_eos(runners(RECIPE, "eager"), _prompt())


def test_the_trt_llm_runner_cuts_at_eos_refuses_sampling_and_long_prompts(monkeypatch):
    """TensorRT-LLM is not installable here: a stand-in LLM returns fixed ids."""
    import sys
    import types

    from artifactcache.backends.tensorrt.llm import TrtLlmRunner
    from artifactcache.errors import BackendError, ShapeError

    monkeypatch.setitem(sys.modules, "tensorrt_llm", types.SimpleNamespace(SamplingParams=dict))

    class LLM:
        def generate(self, prompts, params, use_tqdm):
            assert params["ignore_eos"] and params["temperature"] == 0.0
            out = types.SimpleNamespace(token_ids=[5, 6, 7, 8][: params["max_tokens"]])
            return [types.SimpleNamespace(outputs=[out]) for _ in prompts]

    runner = TrtLlmRunner(LLM(), load_recipe(RECIPE))
    wide = TrtLlmRunner(LLM(), load_recipe(RECIPE).with_shapes(max_batch=2))
    assert wide.generate_batch([[1, 2], [3]], 4, eos_token_ids=[7]) == [[5, 6, 7]] * 2
    with pytest.raises(ShapeError, match="a batch of 2 exceeds the artifact's max_batch 1"):
        runner.generate_batch([[1, 2], [3]], 4)
    assert runner.generate([1, 2], 4) == [5, 6, 7, 8]
    assert runner.generate([1, 2], 4, eos_token_ids=[6]) == [5, 6]
    assert list(runner.stream([1, 2], 4, eos_token_ids=[7])) == [5, 6, 7]
    with pytest.raises(BackendError, match="greedily only"):
        runner.generate([1, 2], 4, temperature=0.5)
    # A prompt may take the context (the engine's max_input_len), not more.
    too_long = list(range(1, runner.recipe.shapes.max_seq_len + 1))
    with pytest.raises(ShapeError):
        runner.generate(too_long, 4)


def test_a_checkpoint_eos_id_the_model_cannot_emit_is_dropped_not_refused():
    # transformers' Phi3Config keeps eos_token_id=32000 even with a 300-token vocabulary.
    assert resolve_eos_ids(None, (32000, 7, 7), vocab_size=300) == (7,)
    assert resolve_eos_ids(None, (32000,), vocab_size=300) == ()
    with pytest.raises(GenerationError, match="outside the vocabulary"):
        resolve_eos_ids((32000,), (7,), vocab_size=300)  # the caller's ids are checked
    assert resolve_eos_ids((), (7,), vocab_size=300) == ()  # () never stops early
