"""runner.py: the shared greedy loop, batches, and the CUDA-graph wrapper for plain steps."""

from __future__ import annotations

import pytest
import torch
from _backend_util import BATCH_PROMPTS, TINY, assert_rows_match_alone

from artifactcache.backends.shared.runner import EOS_CHECK_EVERY, StepRunner
from artifactcache.backends.shared.steps import decode_examples
from artifactcache.errors import ShapeError
from artifactcache.kv_buckets import kv_bucket
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


def test_decode_examples_differ_in_token_position_and_row_start():
    recipe = load_recipe("tiny-llama").with_shapes(max_batch=3)
    (i1, p1, r1, k1), (i2, p2, r2, k2) = decode_examples(recipe, torch.device("cpu"))
    assert i1.shape == i2.shape == (3, 1) and p1.shape == p2.shape == (1,)
    assert r1.shape == r2.shape == (3,)
    assert (i2 != i1).all() and int(p2) == int(p1) + 1 < recipe.shapes.max_seq_len
    assert (r2 != r1).all() and (r2 <= p2).all()  # still real rows at the later position
    # kv_pos: the key positions of the one bucket of a 64-position cache, in both.
    assert k1 is k2 and torch.equal(k1, torch.arange(recipe.shapes.max_seq_len))


# ------------------------------------------------------------------ batches --


def _runner(name: str = "tiny-llama", rows: int = 1, calls: list | None = None) -> StepRunner:
    """An eager StepRunner for ``rows`` batch rows; ``calls`` records each step's rows."""
    recipe = load_recipe(name).with_shapes(max_batch=rows)
    model = build_model(recipe)

    def step(*inputs):
        if calls is not None:
            calls.append(inputs[0].shape[0])
        return model(*inputs)

    return StepRunner(recipe, step, step, torch.device("cpu"))


@pytest.mark.parametrize("name", [*TINY, "tiny-qwen2", "tiny-qwen3"])
def test_every_row_of_a_batch_equals_its_prompt_run_alone(name: str):
    # 24 new tokens after a 19-token prompt cross tiny-mistral's 16-token window.
    assert_rows_match_alone(_runner(name, rows=4), _runner(name), BATCH_PROMPTS, 24)


def test_a_smaller_batch_pads_rows_and_generate_is_a_batch_of_one():
    calls: list[int] = []
    wide, alone = _runner(rows=4, calls=calls), _runner()
    prompts = [list(p) for p in BATCH_PROMPTS[:2]]
    assert_rows_match_alone(wide, alone, prompts, 10)
    assert set(calls) == {4}  # every step ran all four rows
    ids = list(BATCH_PROMPTS[2])
    assert wide.generate(ids, 12) == alone.generate(ids, 12)
    assert list(wide.stream(ids, 12)) == alone.generate(ids, 12)
    sampled = dict(temperature=0.8, top_k=50, seed=3)
    assert wide.generate(ids, 12, **sampled) == wide.generate(ids, 12, **sampled)


def test_each_row_stops_at_its_own_eos():
    runner = _runner(rows=2)
    prompts = [list(BATCH_PROMPTS[0]), list(BATCH_PROMPTS[2])]
    n = 2 * EOS_CHECK_EVERY + 8
    free = runner.generate_batch(prompts, n, eos_token_ids=())
    # An id the first row makes early that the second row makes later or never.
    k, eos = next(
        (i, t) for i, t in enumerate(free[0])
        if i >= 2 and t not in free[0][:i] and t not in free[1][: i + 1]
    )  # fmt: skip
    got = runner.generate_batch(prompts, n, eos_token_ids=[eos])
    assert got[0] == free[0][: k + 1]  # the EOS id is kept
    second = free[1].index(eos) + 1 if eos in free[1] else n
    assert got[1] == free[1][:second]


def test_the_loop_ends_once_every_row_is_done():
    calls: list[int] = []
    runner = _runner(rows=2, calls=calls)
    prompts = [list(BATCH_PROMPTS[0]), list(BATCH_PROMPTS[1])]
    n = 3 * EOS_CHECK_EVERY
    free = runner.generate_batch(prompts, n, eos_token_ids=())
    eos = sorted({free[0][1], free[1][1]})  # both rows finish by their second token
    calls.clear()
    got = runner.generate_batch(prompts, n, eos_token_ids=eos)
    assert all(len(row) <= 2 and row[-1] in eos for row in got)
    # One prefill, then decode steps up to the first flag check, not all n - 1.
    assert len(calls) == 1 + EOS_CHECK_EVERY - 1


@pytest.mark.parametrize(
    ("prompts", "needle"),
    [
        ([[1, 2]] * 5, "a batch of 5 exceeds the artifact's max_batch 4"),
        ([], "the batch is empty"),
        ([1, 2, 3], "each prompt must be a list of token ids, got int"),
        ("1 2", "expected a list of prompts"),
        ([[1, 2], []], "the prompt is empty"),
        ([[1, 2], [32000]], "outside the vocabulary"),
        ([[1] * 65, [1]], "65 prompt .* exceeds max_seq_len 64"),
    ],
)
def test_a_batch_that_does_not_fit_is_refused_before_any_step(prompts, needle):
    calls: list[int] = []
    runner = _runner(rows=4, calls=calls)
    for call in (runner.generate_batch, lambda p, n: runner.logits_batch(p)):
        with pytest.raises(ShapeError, match=needle) as e:
            call(prompts, 8)
        assert "\n" not in str(e.value)
    assert calls == []


def test_padded_rows_never_leak_into_a_later_request():
    """A request after a batch whose rows started later sees none of the old slots."""
    runner, alone = _runner(rows=2), _runner()
    runner.generate_batch([list(BATCH_PROMPTS[2]), [7]], 20, eos_token_ids=())
    ids = list(BATCH_PROMPTS[1])
    assert torch.allclose(runner.logits(ids), alone.logits(ids), rtol=1e-5, atol=1e-5)


def _long_recipe(tmp_path):
    from _generate_util import write_recipe

    return load_recipe(write_recipe(tmp_path, max_seq_len=1024, max_positions=1024))


def _recording(step, seen):
    def record(*inputs):
        seen.append(inputs)
        return step(*inputs)

    return record


def test_decode_gets_its_bucket_as_a_view_of_one_buffer(tmp_path):
    recipe = _long_recipe(tmp_path)
    model = build_model(recipe)
    seen: list = []
    prefill, decode = _steps(model)
    runner = StepRunner(
        recipe, prefill, _recording(decode, seen), torch.device("cpu"), kv_len_hint=True
    )
    prompt = [(3 * i + 1) % 32000 for i in range(250)]
    runner.generate(prompt, 12, eos_token_ids=())
    assert len(seen) == 11 and all(len(inputs) == 4 for inputs in seen)
    lengths = [inputs[3].shape[0] for inputs in seen]
    assert lengths == [kv_bucket(250 + k + 1, 1024) for k in range(11)]
    assert lengths[:6] == [256] * 6 and lengths[6:] == [512] * 5
    for inputs in seen:
        assert torch.equal(inputs[3], torch.arange(inputs[3].shape[0]))
    # No allocation per step: every kv_pos is a view of one buffer, one view per bucket.
    assert len({inputs[3].untyped_storage().data_ptr() for inputs in seen}) == 1
    assert len({id(inputs[3]) for inputs in seen}) == 2


def test_without_the_hint_decode_gets_no_kv_pos():
    """A backend whose steps take no kv_pos (none of acache's since ort and trt take it)."""
    recipe = load_recipe("tiny-llama")
    model = build_model(recipe)
    seen: list = []
    prefill, decode = _steps(model)
    StepRunner(recipe, prefill, _recording(decode, seen), torch.device("cpu")).generate([1, 2], 4)
    assert [len(inputs) for inputs in seen] == [3, 3, 3]
