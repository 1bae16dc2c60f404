"""Inductor's autotune results stay findable, and coordinate-descent results trusted, in a
later process (backends/inductor/autotune_cache.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from artifactcache.backends.inductor import autotune_cache as warm_tuning  # noqa: E402


def test_a_kernel_path_moves_to_this_processs_cache_dir(tmp_path):
    here = tmp_path / "warm"
    gone = str(tmp_path / "tmpbuild123" / "75" / "c75a2mly.py")
    assert warm_tuning.local_kernel_path(gone, here) == str(here / "75" / "c75a2mly.py")
    inside = str(here / "75" / "c75a2mly.py")
    assert warm_tuning.local_kernel_path(inside, here) == inside
    (tmp_path / "kept" / "75").mkdir(parents=True)  # its own dir is there: left alone
    kept = str(tmp_path / "kept" / "75" / "c75a2mly.py")
    assert warm_tuning.local_kernel_path(kept, here) == kept
    assert warm_tuning.local_kernel_path(None, here) is None
    assert warm_tuning.local_kernel_path("k.py", here) == "k.py"


def test_a_static_autotuners_recheck_and_its_saves_use_this_processs_cache_dir(
    tmp_path, monkeypatch
):
    """A saved graph's static autotuner carries the build's absolute kernel path and a
    save hook whose cache file lies in the build's dir: both must move to where the
    entry's files were installed, or a re-tuned result lands where nobody looks."""
    import pickle
    import shutil

    th = pytest.importorskip("torch._inductor.runtime.triton_heuristics")
    ac = pytest.importorskip("torch._inductor.runtime.autotune_cache")
    build = tmp_path / "build"
    (build / "75").mkdir(parents=True)
    kernel = str(build / "75" / "c75a2mly.py")
    hook_cache = ac.AutotuneCache.create({"autotune_local_cache": True}, kernel, "confhash")
    hook_cache = pickle.loads(pickle.dumps(hook_cache))  # as a saved graph holds it
    tuner = object.__new__(th.CachingAutotuner)
    tuner.filename, tuner.save_cache_hook = kernel, hook_cache.save
    shutil.rmtree(build)  # the build's fresh cache dir is gone

    warm = tmp_path / "warm"
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(warm))
    seen = []
    monkeypatch.setattr(
        th.CachingAutotuner, "recheck_autotune_cache", lambda self, **k: seen.append(self.filename)
    )
    real = th.CachingAutotuner.recheck_autotune_cache
    with warm_tuning.inductor_tuning_results_kept():
        tuner.recheck_autotune_cache(reload_kernel_from_src=None)
    assert seen == [str(warm / "75" / "c75a2mly.py")]
    assert Path(hook_cache.local_cache[1]).parent == warm / "75"
    assert th.CachingAutotuner.recheck_autotune_cache is real  # restored


def test_the_patches_stay_until_the_last_overlapping_context_leaves():
    th = pytest.importorskip("torch._inductor.runtime.triton_heuristics")
    real = th.CachingAutotuner.recheck_autotune_cache
    outer = warm_tuning.inductor_tuning_results_kept()
    inner = warm_tuning.inductor_tuning_results_kept()
    outer.__enter__()
    patched = th.CachingAutotuner.recheck_autotune_cache
    assert patched is not real
    inner.__enter__()
    outer.__exit__(None, None, None)  # out of order, as two threads may leave
    assert th.CachingAutotuner.recheck_autotune_cache is patched
    inner.__exit__(None, None, None)
    assert th.CachingAutotuner.recheck_autotune_cache is real


def test_a_plain_result_does_not_overwrite_a_coordinate_descent_one(tmp_path):
    """Inductor's own AutotuneCache: outside the context a later plain benchmark result
    replaces the refined one (the fault), inside it the refined one stays."""
    ac = pytest.importorskip("torch._inductor.runtime.autotune_cache")
    config_cls = pytest.importorskip("triton").Config
    meta = {"autotune_local_cache": True}
    refined, plain = config_cls({"XBLOCK": 128}, num_warps=8), config_cls({"XBLOCK": 64})

    def cache_for(name: str, configs_hash: str = "confhash") -> object:
        (tmp_path / name).mkdir(exist_ok=True)
        return ac.AutotuneCache.create(meta, str(tmp_path / name / "c.py"), configs_hash)

    def saved(cache: object) -> dict:
        return json.loads(Path(cache.local_cache[1]).read_text())

    outside = cache_for("a")
    outside.save(refined, 10**6, found_by_coordesc=True)
    outside.save(plain, 10**6)
    assert saved(outside)["found_by_coordesc"] is False

    with warm_tuning.inductor_tuning_results_kept():
        kept = cache_for("b")
        kept.save(refined, 10**6, True)  # positional, as well as by keyword
        kept.save(plain, 10**6)
        assert saved(kept)["found_by_coordesc"] is True and saved(kept)["XBLOCK"] == 128
        kept.save(plain, 10**6, True)  # a later coordinate-descent result still lands
        assert saved(kept)["XBLOCK"] == 64
        first = cache_for("c")  # a first plain result is saved
        first.save(plain, 10**6)
        assert saved(first)["found_by_coordesc"] is False
        other = cache_for("b", "another-configs-hash")  # other candidates: not guarded
        other.save(plain, 10**6)
        assert saved(other)["configs_hash"] == "another-configs-hash"


def _recheck_of_torch_2_11(self, reload_kernel_from_src):
    """torch 2.11.0's CachingAutotuner.recheck_autotune_cache
    (runtime/triton_heuristics.py:445-478), the static-launch assert left out."""
    th = sys.modules["torch._inductor.runtime.triton_heuristics"]
    configs = [result.config for result in self.compile_results]
    cached_configs, _, info = th.check_autotune_cache(configs, self.filename, self.inductor_meta)
    self.autotune_cache_info = info
    if len(cached_configs) == 1 and len(configs) > 1:
        best_config = cached_configs[0]
        best_config_hash = th.triton_config_to_hashable(best_config)
        for compile_result in self.compile_results:
            if th.triton_config_to_hashable(compile_result.config) == best_config_hash:
                self.compile_results = [compile_result]
                return
        if best_config.found_by_coordesc:
            if self.fn.fn is None:
                self.fn = reload_kernel_from_src().fn
            self.compile_results = [self._precompile_config(best_config)]


@pytest.mark.parametrize("recheck", ["torch-2.11", "this-torch"])
@pytest.mark.parametrize(
    "compiled", [["refined"], ["start"], ["start", "refined"], ["start", "other"]]
)
def test_a_static_autotuners_coordinate_descent_hit_is_not_tuned_again(
    tmp_path, monkeypatch, recheck, compiled
):
    """Attempt 18: a warm process's static autotuner hits the build's
    coordinate-descent result; the one compiled result it keeps must be that config,
    marked ``found_by_coordesc``, or ``CachingAutotuner.run`` tunes it again. torch
    2.11's recheck drops the hit with one compiled config and the mark with several
    (fails without the fix); the installed torch's own recheck must end the same."""
    import types

    th = pytest.importorskip("torch._inductor.runtime.triton_heuristics")
    ac = pytest.importorskip("torch._inductor.runtime.autotune_cache")
    config_cls = pytest.importorskip("triton").Config
    named = {
        "start": config_cls({"XBLOCK": 64, "R0_BLOCK": 8}, num_warps=4, num_stages=1),
        "other": config_cls({"XBLOCK": 32, "R0_BLOCK": 8}, num_warps=4, num_stages=1),
        "refined": config_cls({"XBLOCK": 128, "R0_BLOCK": 8}, num_warps=8, num_stages=1),
    }
    cache_dir = tmp_path / "warm"
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(cache_dir))
    (cache_dir / "75").mkdir(parents=True)
    kernel = cache_dir / "75" / "c75a2mly.py"
    kernel.write_text("# kernel\n")
    meta = {"autotune_local_cache": True, "coordinate_descent_tuning": True}
    configs = [named[n] for n in compiled]
    # what the build saved (the entry's .best_config, installed here)
    build_cache = ac.AutotuneCache.create(meta, str(kernel), th.hash_configs(configs))
    build_cache.save(
        config_cls({"XBLOCK": 128, "R0_BLOCK": 8}, num_warps=8, num_stages=1),
        10**6,
        found_by_coordesc=True,
    )

    compiled_here = []

    def precompile(self, config):
        compiled_here.append(th.triton_config_to_hashable(config))
        return types.SimpleNamespace(config=config)

    tuner = object.__new__(th.CachingAutotuner)
    tuner.filename, tuner.inductor_meta = str(kernel), meta
    tuner.fn = types.SimpleNamespace(fn=object())
    tuner.compile_results = [
        types.SimpleNamespace(
            config=config_cls(dict(c.kwargs), num_warps=c.num_warps, num_stages=c.num_stages)
        )
        for c in configs
    ]
    tuner.is_statically_launchable = lambda: True
    tuner.__dict__["_could_rblock_scale"] = False  # torch 2.15's recheck asks (cached_property)
    monkeypatch.setattr(th.CachingAutotuner, "_precompile_config", precompile, raising=False)
    if recheck == "torch-2.11":
        monkeypatch.setattr(th.CachingAutotuner, "recheck_autotune_cache", _recheck_of_torch_2_11)
    with warm_tuning.inductor_tuning_results_kept():
        tuner.recheck_autotune_cache(lambda: pytest.fail("the kernel was loaded"))
    (kept,) = tuner.compile_results
    assert th.triton_config_to_hashable(kept.config) == th.triton_config_to_hashable(
        named["refined"]
    )
    assert getattr(kept.config, "found_by_coordesc", False) is True
    # compiled here only where the winner was not among the compiled configs
    assert len(compiled_here) == (0 if "refined" in compiled else 1)


def test_without_coordinate_descent_a_recheck_is_left_alone(tmp_path, monkeypatch):
    """CPU builds tune nothing: the hook neither reads nor changes anything."""
    import types

    th = pytest.importorskip("torch._inductor.runtime.triton_heuristics")
    tuner = types.SimpleNamespace(
        inductor_meta={}, autotune_cache_info={"autotune_cache_state": "hit"},
        compile_results=["untouched"], filename=str(tmp_path / "missing.py"),
    )  # fmt: skip
    warm_tuning.keep_coordesc_mark(tuner, [object()], None)
    assert tuner.compile_results == ["untouched"]
    assert th is not None


def test_a_cache_hit_is_not_widened_by_dynamic_rblock_scaling(monkeypatch):
    """torch 2.11's precompile adds a half-R0_BLOCK config to a register-heavy reduction
    even when its config came from the autotune cache; a warm process then compiled and
    benchmarked both. Under the context a hit keeps its one config, a miss is scaled."""
    th = pytest.importorskip("torch._inductor.runtime.triton_heuristics")

    def widen_like_2_11(self):  # what 2.11 does: no look at the cache state
        self.compile_results.append("R0_BLOCK halved")

    monkeypatch.setattr(th.CachingAutotuner, "_dynamic_scale_rblock", widen_like_2_11)
    hit, miss = (object.__new__(th.CachingAutotuner) for _ in range(2))
    hit.autotune_cache_info = {"autotune_cache_state": "hit", "best_config": "cached"}
    miss.autotune_cache_info = {"autotune_cache_state": "miss"}
    for tuner in (hit, miss):
        tuner.compile_results = ["cached"]
    with warm_tuning.inductor_tuning_results_kept():
        hit._dynamic_scale_rblock()
        miss._dynamic_scale_rblock()
    assert hit.compile_results == ["cached"]
    assert miss.compile_results == ["cached", "R0_BLOCK halved"]
    assert th.CachingAutotuner._dynamic_scale_rblock is widen_like_2_11  # restored
