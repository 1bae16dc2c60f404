"""api.py: device validation, one lookup per load, and hardware keys by device type."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from artifactcache import api
from artifactcache.api import recipe as recipe_api
from artifactcache.errors import BackendError
from artifactcache.keys import hardware_fingerprint
from artifactcache.store.local import LocalStore


@pytest.mark.parametrize("device", ["gpu", "cpu:1", "cuda:x", "cuda0", ""])
def test_malformed_devices_are_rejected_before_anything_is_written(device, cache_dir):
    with pytest.raises(BackendError, match="unknown device|use cpu"):
        api.build("tiny-llama", "eager", device=device)
    assert not list((cache_dir / "v1" / "entries").glob("*/*"))  # nothing written


def test_hardware_key_uses_the_device_type_and_reads_the_named_gpu(monkeypatch):
    import torch

    asked = []

    def properties(index):
        asked.append(index)
        return SimpleNamespace(name=f"GPU {index}", major=9, minor=0)

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_properties", properties)
    second, default = hardware_fingerprint("cuda:1"), hardware_fingerprint("cuda")
    # cuda:1 and cuda key as "cuda"; each reads its own GPU's name and capability
    assert second["device"] == default["device"] == "cuda" and asked == [1, 0]
    assert (second["gpu"], default["gpu"]) == ("GPU 1", "GPU 0")
    assert second["compute_capability"] == "9.0" and "cpu_isa" not in second
    assert "cpu_isa" in hardware_fingerprint("cpu")


def test_load_with_result_reports_built_then_hit_and_counts_one_hit(cache_dir):
    store = LocalStore(cache_dir)
    first, runner = api.load_with_result("tiny-llama", "eager", store=store)
    assert first.built and first.source == "built"
    again, runner2 = api.load_with_result("tiny-llama", "eager", store=store)
    assert not again.built and again.source == "local" and again.key == first.key
    assert runner2.generate([1, 15043], 3) == runner.generate([1, 15043], 3)
    assert store.stats()["hits"] == 1


def test_a_stale_entry_is_rebuilt_once_not_fatal(cache_dir, monkeypatch):
    """A backend that finds its intact entry unusable here (StaleArtifact, e.g. a TensorRT
    engine from another TensorRT version) gets one forced rebuild from api.load()."""
    from artifactcache.backends.eager import backend as eager
    from artifactcache.errors import StaleArtifact

    calls = {"load": 0, "build": 0}

    class Flaky(type(eager.BACKEND)):
        def build(self, ctx, workdir):
            calls["build"] += 1
            return super().build(ctx, workdir)

        def load(self, ctx, entry_dir, meta):
            calls["load"] += 1
            if calls["load"] == 1:
                raise StaleArtifact("engine from another runtime")
            return super().load(ctx, entry_dir, meta)

    monkeypatch.setattr(recipe_api, "get_backend", lambda name: Flaky())
    store = LocalStore(cache_dir)
    api.build("tiny-llama", "eager", store=store)
    result, runner = api.load_with_result("tiny-llama", "eager", store=store)
    assert calls == {"load": 2, "build": 2} and result.built
    assert len(runner.generate([1, 15043], 2)) == 2
    with pytest.raises(StaleArtifact):  # without build_on_miss it is reported, not hidden
        calls["load"] = 0
        api.load("tiny-llama", "eager", store=store, build_on_miss=False)


@pytest.mark.parametrize("call", [api.load, api.build])
def test_a_choice_given_in_the_choices_place_is_one_clear_error(call, cache_dir):
    from artifactcache.errors import ArgumentError

    with pytest.raises(ArgumentError, match="choices must be a BuildChoices, got str 'cpu'") as e:
        call("tiny-llama", "eager", "cpu")
    assert "device='cpu'" in str(e.value) and "\n" not in str(e.value)
    assert not list((cache_dir / "v1" / "entries").glob("*/*"))
