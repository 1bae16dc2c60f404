"""measure/child/timing.py: the probe's timed loops (batched requests, decode steps one by
one) and the device's matmul peak."""

from __future__ import annotations

import pytest
import torch

from artifactcache.backends.shared.runner import StepRunner
from artifactcache.measure.child import timing
from artifactcache.models import build_model
from artifactcache.recipes import load_recipe


def test_requests_are_batches_and_steps_are_timed_one_by_one():
    recipe = load_recipe("tiny-llama").with_shapes(max_batch=2)
    model = build_model(recipe)
    calls: list[int] = []

    def step(*inputs):
        calls.append(inputs[0].shape[0])
        return model(*inputs)

    runner = StepRunner(recipe, step, step, torch.device("cpu"))
    prompts = [list(recipe.bench.prompt_ids)] * 2
    cpu = torch.device("cpu")
    out = timing.measure_requests(runner, prompts, 5, iters=1, warmup=1, device=cpu)
    assert out["batch"] == 2 and len(out["tokens"]) == 5
    assert out["tokens"] == runner.generate(prompts[0], 5, eos_token_ids=())
    calls.clear()
    steps = timing.measure_step_latency(runner, prompts, 5, cpu)
    assert len(steps) == 4 and all(t > 0 for t in steps)  # decode steps only
    assert len(calls) == 5  # the prefill, then one call per timed step
    assert timing.measure_step_latency(object(), prompts, 5, cpu) is None


def test_the_matmul_peak_is_measured_in_the_runs_dtype():
    got = timing.matmul_flops(torch.device("cpu"), "bf16", n=64, rounds=1)
    assert got["n"] == 64 and got["dtype"] == "bf16" and got["tflops"] > 0


class _CountingRunner:
    """generate(ids, 1) -> one token; remembers the length of every prompt it was given."""

    def __init__(self) -> None:
        self.lengths: list[int] = []

    def generate(self, ids: list[int], max_new_tokens: int) -> list[int]:
        assert max_new_tokens == 1
        self.lengths.append(len(ids))
        return [7]


def test_ttft_warms_up_each_length_then_times_it():
    fake = _CountingRunner()
    cpu = torch.device("cpu")
    got = timing.measure_ttft(fake, [[1] * 4, [2] * 16], iters=3, warmup=2, device=cpu)
    assert fake.lengths == [4] * 5 + [16] * 5  # 2 excluded + 3 timed, one length at a time
    assert [(r["prompt_len"], r["warmup"], len(r["ttft_s"])) for r in got] == [
        (4, 2, 3), (16, 2, 3),
    ]  # fmt: skip
    assert all(t > 0 for r in got for t in r["ttft_s"])
    # A real runner: the first token of a prompt of each length.
    recipe = load_recipe("tiny-llama")
    model = build_model(recipe)
    runner = StepRunner(recipe, model, model, cpu)
    real = timing.measure_ttft(runner, [[1] * 9], iters=1, warmup=1, device=cpu)
    assert real[0]["prompt_len"] == 9 and real[0]["ttft_s"][0] > 0


def test_ttft_keeps_each_lengths_first_request_apart(monkeypatch: pytest.MonkeyPatch):
    """The first request of a length (a new shape: a compile, a capture, a cuDNN graph)
    is timed alone as ``first_s``, outside the timed iterations."""
    clock = [0.0]
    monkeypatch.setattr(timing.time, "perf_counter", lambda: clock[0])

    class FirstIsSlow:
        seen: set[int] = set()

        def generate(self, ids: list[int], n: int) -> list[int]:
            clock[0] += 1.0 if len(ids) in self.seen else 5.0
            self.seen.add(len(ids))
            return [0] * n

    got = timing.measure_ttft(
        FirstIsSlow(), [[1] * 4, [2] * 16], iters=2, warmup=2, device=torch.device("cpu")
    )
    assert [(r["first_s"], r["ttft_s"]) for r in got] == [(5.0, [1.0, 1.0])] * 2
