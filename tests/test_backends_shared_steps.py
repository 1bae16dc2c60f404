"""backends/shared/steps.py: the pass steps open at their first call, decode at load."""

from __future__ import annotations

import contextlib

import pytest
from _threads import call_at_once

from artifactcache.backends.shared.steps import STEP_KINDS, LazyStep, opened_when_used
from artifactcache.errors import ArgumentError


def _opener(log: list[str], name: str):
    def open_step():
        log.append(name)
        return lambda *inputs: (name, inputs)

    return open_step


def test_a_lazy_step_opens_once_at_its_first_call():
    log: list[str] = []
    step = LazyStep(_opener(log, "extend"), contextlib.nullcontext)
    assert not step.opened and log == []
    assert step(1, 2) == ("extend", (1, 2))
    assert step(3) == ("extend", (3,))
    assert step.opened and log == ["extend"]


def test_a_failed_opening_is_raised_and_tried_again():
    calls = []

    def open_step():
        calls.append(1)
        if len(calls) == 1:
            raise OSError("disk")
        return lambda *inputs: "ok"

    step = LazyStep(open_step, contextlib.nullcontext)
    with pytest.raises(OSError, match="disk"):
        step()
    assert not step.opened
    assert step() == "ok" and step.opened


def test_only_the_pass_steps_wait_and_the_setting_turns_it_off(monkeypatch):
    monkeypatch.delenv("ACACHE_LAZY_STEPS", raising=False)
    log: list[str] = []
    steps = {s: opened_when_used(s, _opener(log, s)) for s in STEP_KINDS}
    assert log == ["decode"]  # every request decodes; its CUDA graph is captured at load
    assert isinstance(steps["prefill"], LazyStep) and isinstance(steps["extend"], LazyStep)

    monkeypatch.setenv("ACACHE_LAZY_STEPS", "0")
    log.clear()
    steps = {s: opened_when_used(s, _opener(log, s)) for s in STEP_KINDS}
    assert log == list(STEP_KINDS)
    assert not any(isinstance(s, LazyStep) for s in steps.values())


def test_a_bad_setting_is_a_one_line_error(monkeypatch):
    monkeypatch.setenv("ACACHE_LAZY_STEPS", "sometimes")
    with pytest.raises(ArgumentError, match="ACACHE_LAZY_STEPS"):
        opened_when_used("extend", _opener([], "extend"))


def test_the_scope_holds_the_opening_and_the_first_call_only():
    """inductor passes its tuning scope: a step deserialized after the load returned
    must still find the load's autotuning results (backends/inductor/autotune_cache.py)."""
    inside: list[bool] = []
    depth = [0]

    @contextlib.contextmanager
    def scope():
        depth[0] += 1
        try:
            yield
        finally:
            depth[0] -= 1

    def open_step():
        inside.append(depth[0] == 1)
        return lambda *inputs: inside.append(depth[0] == 1)

    step = LazyStep(open_step, scope)
    step()
    step()
    assert inside == [True, True, False]  # opened and first run inside, later calls not


def test_concurrent_first_calls_open_the_step_once():
    opened = []

    def open_step():
        opened.append(1)
        return lambda *inputs: len(opened)

    step = LazyStep(open_step, contextlib.nullcontext)
    results = call_at_once(step, 4)
    assert opened == [1] and results == [1, 1, 1, 1]
