"""The probe's compile and tuning counts, from torch's and Triton's own counters."""

from __future__ import annotations

import pytest

from artifactcache.measure.child import compiles


@pytest.fixture
def fresh_counts(monkeypatch):
    from torch._dynamo.utils import counters

    saved = {k: dict(v) for k, v in counters.items()}
    counters.clear()
    monkeypatch.setattr(compiles, "_triton", {"compiled": 0, "cache_hits": 0})
    monkeypatch.setattr(compiles, "_watching", False)
    yield counters
    counters.clear()
    for k, v in saved.items():
        counters[k].update(v)


def test_a_process_that_did_nothing_compiled_nothing(fresh_counts):
    rep = compiles.compile_report("inductor", built=False)
    assert rep["compiled"] is False and rep["tuned"] is False
    assert rep["kernel_benchmarks"] == 0 and rep["triton_compiles"] is None  # not watched


def test_kernel_timings_count_as_tuning_and_compiling(fresh_counts):
    fresh_counts["inductor"]["benchmarking.InductorBenchmarker.benchmark_gpu"] += 3
    fresh_counts["inductor"]["coordesc_tuning_bench"] += 2
    fresh_counts["inductor"]["fxgraph_cache_hit"] += 3  # a hit is not a compile
    rep = compiles.compile_report("inductor", built=False)
    assert rep["kernel_benchmarks"] == 3 and rep["coordesc_benchmarks"] == 2
    assert rep["tuned"] and rep["compiled"] and not rep["inductor_codegen"]


def test_triton_compiles_are_counted_and_cache_hits_are_not(fresh_counts, monkeypatch):
    knobs = pytest.importorskip("triton.knobs", reason="this torch build has no Triton")
    if not hasattr(getattr(knobs, "compilation", None), "listener"):
        pytest.skip("this Triton has no compile listener")
    calls = []
    monkeypatch.setattr(knobs.compilation, "listener", lambda **kw: calls.append(kw))
    assert compiles.watch_triton_compiles()
    hook = knobs.compilation.listener
    # As triton.compiler.compile calls it (keywords only).
    hook(src=None, metadata={}, metadata_group={}, times=None, cache_hit=True)
    assert compiles.compile_report("inductor", built=False)["compiled"] is False
    hook(src=None, metadata={}, metadata_group={}, times=None, cache_hit=False)
    rep = compiles.compile_report("inductor", built=False)
    assert rep["triton_compiles"] == 1 and rep["triton_cache_hits"] == 1 and rep["compiled"]
    assert [c["cache_hit"] for c in calls] == [True, False]  # the listener before still hears
