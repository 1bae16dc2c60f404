"""The probe child: one JSON line with every phase, in order, from process start."""

from __future__ import annotations

import statistics

import pytest

from artifactcache.errors import MeasureError
from artifactcache.measure.coldstart import ProbeSpec, spawn_probe
from artifactcache.measure.phases import PHASE_ORDER


@pytest.fixture(scope="module")
def eager_probe(tmp_path_factory):
    cache = tmp_path_factory.mktemp("probe-cache")
    cache.chmod(0o700)
    spec = ProbeSpec(recipe="tiny-llama", backend="eager", new_tokens=4, iters=2)
    log = tmp_path_factory.mktemp("probe-log") / "probe.log"
    return spawn_probe(spec, cache, log_path=log)


def test_every_phase_present_and_monotonic(eager_probe):
    r = eager_probe
    assert r["ok"] and r["recipe"] == "tiny-llama" and r["backend"] == "eager"
    phases = r["phases"]
    assert set(phases) == set(PHASE_ORDER)  # every phase, none extra (the JSON sorts keys)
    values = [phases[k] for k in PHASE_ORDER]
    assert all(v > 0 for v in values)
    assert values == sorted(values), phases
    # The parent's stamp was taken before the fork; the kernel's start time of the
    # child (10 ms ticks) cannot be much earlier than it.
    assert r["t0_source"] == "parent_spawn_monotonic"
    assert r["proc_start"] > -0.05


def test_steady_state_and_memory(eager_probe):
    st = eager_probe["steady"]
    assert st["iters"] == 2 and len(st["request_s"]) == 2 and len(st["prefill_s"]) == 2
    assert len(st["tokens"]) == 4 and st["tokens"][0] == eager_probe["first_token"]
    decode_s = statistics.median(st["request_s"]) - statistics.median(st["prefill_s"])
    if decode_s > 0:  # 3 decode steps after the prefill's first token
        assert st["decode_tok_s"] == pytest.approx(3 / decode_s)
    else:  # timing noise on a tiny model: no rate rather than a negative one
        assert st["decode_tok_s"] is None
    assert eager_probe["memory"]["peak_rss_bytes"] > 10 << 20
    assert eager_probe["built"] is True and eager_probe["entry_source"] == "built"
    assert eager_probe["compile"]["compiled"] is False  # eager's build is not a compile
    assert eager_probe["subphases"]["build_start"] < eager_probe["subphases"]["build_done"]
    assert eager_probe["entry_bytes"] > 0 and eager_probe["entry_build_seconds"] >= 0
    assert eager_probe["runner_info"] == {}  # eager on CPU: no CUDA graph wrapper
    ph, sub = eager_probe["phases"], eager_probe["subphases"]
    assert ph["entry_ready"] <= sub["device_ready"] <= ph["weights_ready"]


def test_probe_failure_is_one_line_measure_error(tmp_path):
    cache = tmp_path / "empty"
    cache.mkdir(mode=0o700)
    spec = ProbeSpec(recipe="tiny-llama", backend="eager", new_tokens=2, iters=1)
    spec.extra_flags = ["--no-build"]
    with pytest.raises(MeasureError) as ei:
        spawn_probe(spec, cache, log_path=tmp_path / "p.log")
    msg = str(ei.value)
    assert "failed" in msg and "\n" not in msg


def test_prompt_lengths_travel_to_the_child_and_are_checked_there(tmp_path):
    from artifactcache.measure.child import probe

    spec = ProbeSpec(recipe="tiny-llama", backend="eager", prompt_lens=(4, 16))
    argv = spec.argv(None)
    assert probe._parse(argv[argv.index("--recipe") :]).prompt_lens == "4,16"
    assert probe._parse(["--recipe", "r", "--backend", "eager"]).prompt_lens == ""
    cache = tmp_path / "c"
    cache.mkdir(mode=0o700)
    spec = ProbeSpec(recipe="tiny-llama", backend="eager", new_tokens=2, iters=1,
                     prompt_lens=(64,))  # fmt: skip
    with pytest.raises(MeasureError, match="--prompt-len 64 does not fit"):
        spawn_probe(spec, cache)
    assert not any(cache.iterdir())  # refused before anything was built
