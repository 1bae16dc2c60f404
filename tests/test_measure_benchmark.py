"""measure/benchmark.py: `acache bench`'s loop over batch sizes, with the probe faked.

Real probes run in tests/test_cli_measure.py (a recipe) and tests/test_api_module.py
(a model spec)."""

from __future__ import annotations

import pytest

from artifactcache.choices import BuildChoices
from artifactcache.errors import AcacheError, MeasureError
from artifactcache.measure import benchmark, coldstart

SPEC = "examples/vision.py:tiny_convnet"


def _probe(batch: int | None, source: str | None = None) -> dict:
    steady = {"request_s": [1.0, 1.2], "prefill_s": [0.1, 0.1], "new_tokens": 4,
              "batch": batch or 1, "step_s": [0.01]}  # fmt: skip
    return {"prompt_len": 6, "steady": steady, "copy_bandwidth": {"gbps": 10.0},
            "matmul_flops": {"tflops": 0.5}, "entry_source": source, "key": "k",
            "phases": {}, "memory": {"peak_rss_bytes": 1}, "environment": {}}  # fmt: skip


@pytest.fixture
def spawned(monkeypatch) -> list[coldstart.ProbeSpec]:
    seen: list[coldstart.ProbeSpec] = []

    def fake(spec, cache_dir, *, log_path=None):
        seen.append(spec)
        assert log_path is not None and log_path.exists()
        return _probe(spec.batch, "built" if len(seen) == 1 else None)

    monkeypatch.setattr(coldstart, "spawn_probe", fake)
    return seen


def test_each_size_on_its_own_artifact_or_on_the_max_batch_one(spawned):
    said = []
    res = benchmark.run_bench("tiny-llama", "eager", BuildChoices(), [1, 2], new_tokens=4,
                              iters=1, warmup=1, allow_shared_root=True,
                              progress=lambda m, d, t: said.append((d, t)))  # fmt: skip
    assert [(s.batch, s.choices.max_batch) for s in spawned] == [(1, 1), (2, 2)]
    assert all(s.matmul_flops and s.step_latency for s in spawned)
    assert spawned[0].extra_flags == ["--allow-shared-root"] and said == [(0, 2), (1, 2)]
    assert [(r["batch"], r["max_batch"], r["entry"]) for r in res] == [
        (1, 1, "built"), (2, 2, "hit"),
    ]  # fmt: skip
    assert res[0]["recipe"] == "tiny-llama" and res[0]["backend"] == "eager"
    spawned.clear()
    res = benchmark.run_bench("tiny-llama", "eager", BuildChoices(max_batch=4), [1, 4])
    assert [s.choices.max_batch for s in spawned] == [4, 4]


@pytest.mark.parametrize(
    ("sizes", "choices", "needle"),
    [([1, 2], BuildChoices(max_batch=1), "exceeds the artifact's max_"),
     ([1, 2], BuildChoices(inputs=("x",)), "--input"),
     ([], BuildChoices(), "at least one batch size")],
)  # fmt: skip
def test_every_size_is_checked_before_any_probe_runs(spawned, sizes, choices, needle):
    with pytest.raises(AcacheError, match=needle):
        benchmark.run_bench("tiny-llama", "eager", choices, sizes)
    assert spawned == []


def test_a_model_spec_gets_one_probe_per_batch_size(spawned):
    said = []
    rows = benchmark.run_module_bench(SPEC, "eager", BuildChoices(), [1, 4], iters=2, warmup=1,
                                      progress=lambda m, d, t: said.append(m))  # fmt: skip
    assert [(s.batch, s.iters, s.recipe) for s in spawned] == [(1, 2, SPEC), (4, 2, SPEC)]
    assert [(r["batch"], r["key"], r["recipe"]) for r in rows] == [(1, "k", SPEC), (4, "k", SPEC)]
    assert said == [f"bench {SPEC}/eager batch 1", f"bench {SPEC}/eager batch 4"]
    spawned.clear()
    with pytest.raises(MeasureError, match="--iters and --warmup"):
        benchmark.run_module_bench(SPEC, "eager", BuildChoices(), iters=0)
    with pytest.raises(AcacheError, match="--max-batch is for a recipe"):
        benchmark.run_module_bench(SPEC, "eager", BuildChoices(max_batch=2))
    assert spawned == []


def test_prompt_lengths_reach_the_one_row_probe_and_are_checked_before_any(spawned):
    benchmark.run_bench("tiny-llama", "eager", BuildChoices(), [1, 2], prompt_lens=[4, 16])
    assert [s.prompt_lens for s in spawned] == [(4, 16), ()]  # not the 2-row artifact's
    assert "--prompt-lens" in spawned[0].argv(None)
    spawned.clear()
    with pytest.raises(AcacheError, match="add 1 to --batch"):
        benchmark.run_bench("tiny-llama", "eager", BuildChoices(), [2], prompt_lens=[4])
    assert spawned == []
    # 64 + 1 positions on the tiny recipe's 64: one line, no probe, nothing built.
    with pytest.raises(AcacheError, match="--prompt-len 64 does not fit"):
        benchmark.run_bench("tiny-llama", "eager", BuildChoices(), [1], prompt_lens=[4, 64])
    assert spawned == []
    benchmark.run_bench("tiny-llama", "eager", BuildChoices(max_seq_len=128), prompt_lens=[64])
    assert [s.prompt_lens for s in spawned] == [(64,)]
