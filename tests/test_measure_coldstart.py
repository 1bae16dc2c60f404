"""Cold really starts empty, warm does not compile, break-even arithmetic."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from artifactcache.measure import coldstart
from artifactcache.measure.breakeven import break_even
from artifactcache.measure.coldstart import ProbeSpec, run_scenarios, summarize


def test_break_even_after():
    be = break_even(ttfr_backend=10.0, latency_backend=1.0, ttfr_eager=4.0, latency_eager=3.0)
    assert be["verdict"] == "after"
    assert be["requests"] == pytest.approx(3.0)  # 6 s extra start-up / 2 s saved per request
    assert be["seconds"] == pytest.approx(3.0)  # 3 requests x 1 s each
    assert be["level_at_s"] == pytest.approx(13.0) == 4.0 + 3 * 3.0  # both lines cross here


def test_break_even_never_pays_off():
    be = break_even(ttfr_backend=10.0, latency_backend=3.0, ttfr_eager=4.0, latency_eager=3.0)
    assert be["verdict"] == "never" and be["requests"] is None and be["seconds"] is None
    slower = break_even(10.0, 4.0, 4.0, 3.0)
    assert slower["verdict"] == "never"


def test_break_even_pays_off_immediately():
    be = break_even(ttfr_backend=3.0, latency_backend=1.0, ttfr_eager=4.0, latency_eager=3.0)
    assert be["verdict"] == "immediately" and be["requests"] == 0.0
    tie = break_even(4.0, 3.0, 4.0, 3.0)
    assert tie["verdict"] == "immediately"


def test_break_even_ahead_then_behind():
    be = break_even(ttfr_backend=2.0, latency_backend=2.0, ttfr_eager=4.0, latency_eager=1.0)
    assert be["verdict"] == "ahead-then-behind"
    assert be["eager_overtakes_after_requests"] == pytest.approx(2.0)


def _fake(first: float, req: list[float], compiled: bool) -> dict:
    phases = {k: first * (i + 1) / 9 for i, k in enumerate(coldstart.PHASE_ORDER)}
    phases["first_result"] = first
    return {
        "phases": phases,
        "steady": {"request_s": req},
        "compile": {"compiled": compiled},
        "built": compiled,
        "memory": {"peak_rss_bytes": 1},
    }


def test_summary_medians_ratio_and_break_even():
    runs = {
        "cold": [_fake(30.0, [1.0], True), _fake(40.0, [1.0], True), _fake(20.0, [1.0], True)],
        "warm": [_fake(6.0, [1.0, 1.0], False), _fake(4.0, [1.0], False)],
        "eager": [_fake(3.0, [2.0, 2.0], False)],
    }
    s = summarize(runs)
    cold = s["scenarios"]["cold"]["phases"]["first_result"]
    assert (cold["median"], cold["min"], cold["max"], cold["n"]) == (30.0, 20.0, 40.0, 3)
    assert s["cold_warm_ratio"] == pytest.approx(30.0 / 5.0)
    assert s["break_even_warm"]["requests"] == pytest.approx((5.0 - 3.0) / (2.0 - 1.0))
    assert s["break_even_cold"]["requests"] == pytest.approx((30.0 - 3.0) / 1.0)


def test_runs_must_be_positive():
    from artifactcache.errors import MeasureError

    with pytest.raises(MeasureError):
        run_scenarios(ProbeSpec(recipe="tiny-llama", backend="eager"), 0)


def test_journal_resumes_without_respawning(tmp_path, monkeypatch):
    spec = ProbeSpec(recipe="tiny-llama", backend="eager", new_tokens=2, iters=1)
    journal, work = tmp_path / "j.jsonl", tmp_path / "work"
    first = run_scenarios(spec, 1, ("eager",), work_dir=work, journal=journal)

    def boom(*a, **k):
        raise AssertionError("a journaled run was spawned again")

    monkeypatch.setattr(coldstart, "spawn_probe", boom)
    again = run_scenarios(spec, 1, ("eager",), work_dir=work, journal=journal)
    assert again["eager"][0]["phases"] == first["eager"][0]["phases"]


@pytest.mark.slow
def test_cold_after_warm_still_compiles_and_warm_does_not(tmp_path, monkeypatch):
    from artifactcache.backends.inductor.backend import warm_path

    # A framework cache in OUR environment must not leak into the children.
    leaked = tmp_path / "parent-inductor-cache"
    leaked.mkdir()
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(leaked))
    spec = ProbeSpec(recipe="tiny-llama", backend="inductor", new_tokens=3, iters=1)
    runs = run_scenarios(spec, 2, ("cold", "warm"))  # cold 1, warm 1, cold 2, warm 2
    cold, warm = runs["cold"], runs["warm"]
    for r in cold:  # the second cold run comes after a warm one: it must compile again
        assert r["built"] and r["compile"]["compiled"], r["compile"]
        if warm_path() == "megacache":  # aot_compile bypasses the FX-graph cache
            assert r["compile"]["fxgraph_cache_miss"] > 0
        assert r["framework_cache_bytes_after"]["TORCHINDUCTOR_CACHE_DIR"] > 0
    for r in warm:
        assert not r["built"] and r["entry_source"] == "local"
        assert not r["compile"]["compiled"], r["compile"]
        if warm_path() == "aot_compile":  # saved compiled functions: nothing traced
            assert r["compile"]["dynamo_unique_graphs"] == 0, r["compile"]
        else:  # the Mega-Cache: Dynamo traces, the FX-graph cache hits
            assert r["compile"]["fxgraph_cache_hit"] > 0
    assert os.listdir(leaked) == []
    # The same greedy tokens whatever the start: warm and cold load the same artifact.
    assert cold[1]["steady"]["tokens"] == warm[0]["steady"]["tokens"]


def _fake_builds(monkeypatch):
    """spawn_probe standing in for a probe: a cold run (an empty acache dir) writes an
    entry named by its build number; a warm run reports the entry it found as its tokens."""
    spawned: list[str] = []

    def fake_spawn(spec, acache_dir, *, env_dirs, log_path, timeout):
        entries = sorted(p.name for p in acache_dir.iterdir())
        if not entries:
            name = f"build-{sum(s == 'cold' for s in spawned)}"
            (acache_dir / name).write_text("")
            spawned.append("cold")
            return {"built": True, "first_token": 1, "steady": {"tokens": [name]}}
        spawned.append("warm")
        return {"built": False, "first_token": 1, "steady": {"tokens": entries}}

    monkeypatch.setattr(coldstart, "spawn_probe", fake_spawn)
    return spawned


def test_one_build_serves_every_warm_run(tmp_path, monkeypatch):
    spawned = _fake_builds(monkeypatch)
    spec = ProbeSpec(recipe="tiny-llama", backend="inductor", new_tokens=2, iters=1)
    runs = run_scenarios(spec, 3, ("cold", "warm"), work_dir=tmp_path / "w", builds=1)
    assert spawned == ["cold", "warm", "warm", "warm"]
    assert [r["steady"]["tokens"] for r in runs["warm"]] == [["build-0"]] * 3
    assert coldstart.matches_build(runs["cold"], runs["warm"]) == [True, True, True]
    assert not any((tmp_path / "w").glob("cold-*")), "the entry outlived its last warm run"


def test_two_builds_pair_the_later_warm_runs_with_the_last(tmp_path, monkeypatch):
    spawned = _fake_builds(monkeypatch)
    spec = ProbeSpec(recipe="tiny-llama", backend="inductor", new_tokens=2, iters=1)
    runs = run_scenarios(spec, 3, ("cold", "warm"), work_dir=tmp_path / "w", builds=2)
    assert spawned == ["cold", "warm", "cold", "warm", "warm"]
    tokens = [r["steady"]["tokens"] for r in runs["warm"]]
    assert tokens == [["build-0"], ["build-1"], ["build-1"]]
    assert coldstart.matches_build(runs["cold"], runs["warm"]) == [True, True, True]
    assert [r["build_index"] for r in runs["warm"]] == [0, 1, 1]
    # A warm run whose tokens are not its build's is caught as a mismatch.
    runs["warm"][2]["steady"]["tokens"] = ["build-0"]
    assert coldstart.matches_build(runs["cold"], runs["warm"]) == [True, True, False]


def test_warm_runs_of_an_entry_built_for_them_are_not_compared_with_a_build(tmp_path, monkeypatch):
    spawned = _fake_builds(monkeypatch)
    spec = ProbeSpec(recipe="tiny-llama", backend="inductor", new_tokens=2, iters=1)
    # Warm alone: the first warm run builds the entry (untimed) and all three load it.
    runs = run_scenarios(spec, 3, ("warm",), work_dir=tmp_path / "w", builds=1)
    assert spawned == ["cold", "warm", "warm", "warm"]  # the fake counts the prime as cold
    assert [r["entry_primed"] for r in runs["warm"]] == [True, True, True]
    assert coldstart.matches_build([{"steady": {"tokens": ["x"]}}], runs["warm"]) == [None] * 3


@pytest.mark.parametrize("builds", [0, 4])
def test_builds_outside_one_to_runs_is_refused_before_any_run(builds, monkeypatch):
    spawned = _fake_builds(monkeypatch)
    spec = ProbeSpec(recipe="tiny-llama", backend="inductor", new_tokens=2, iters=1)
    with pytest.raises(coldstart.MeasureError, match="--builds must be between 1 and"):
        run_scenarios(spec, 3, ("cold", "warm"), builds=builds)
    assert spawned == []


def test_relative_work_dir_reaches_children_as_absolute_paths(tmp_path, monkeypatch):
    """A relative TORCHINDUCTOR_CACHE_DIR broke AOTI's g++ step on the GPU (cwd differs)."""
    seen: list[tuple[Path, dict]] = []

    def fake_spawn(spec, acache_dir, *, env_dirs, log_path, timeout):
        seen.append((acache_dir, dict(env_dirs)))
        raise coldstart.MeasureError("stop after the first spawn")

    monkeypatch.setattr(coldstart, "spawn_probe", fake_spawn)
    monkeypatch.chdir(tmp_path)
    spec = ProbeSpec(recipe="tiny-llama", backend="inductor", new_tokens=2, iters=1)
    with pytest.raises(coldstart.MeasureError):
        run_scenarios(spec, 1, ("cold",), work_dir=Path("rel-work"))
    ((acache_dir, env_dirs),) = seen
    assert acache_dir.is_absolute()
    assert env_dirs and all(Path(v).is_absolute() for v in env_dirs.values())


def _timed(ttfrs, lats):
    return [{"phases": {"first_result": t}, "steady": {"request_s": list(lats)}} for t in ttfrs]


def test_break_even_interval_brackets_the_median_and_says_when_it_runs_to_never():
    from artifactcache.measure.breakeven import break_even_interval

    backend = _timed([10.0, 10.4, 9.8], [1.0, 1.1, 0.9, 1.05])
    eager = _timed([4.0, 4.1, 3.9], [3.0, 3.2, 2.9, 3.1])
    iv = break_even_interval(backend, eager)
    n = break_even(10.0, 1.025, 4.0, 3.05)["requests"]
    assert iv["low"] <= n <= iv["high"] and iv["high"] < 2 * iv["low"]
    assert iv["processes"] == [3, 3] and iv["requests_timed"] == [12, 12]
    assert break_even_interval(backend, eager) == iv  # seeded: a report renders it again
    # Latencies that overlap: some resamples are never level.
    close = break_even_interval(_timed([10.0], [1.0, 1.3]), _timed([4.0], [1.2, 1.25]))
    assert close["high"] is None
    assert break_even_interval(backend, []) is None  # no eager runs: nothing to compare
