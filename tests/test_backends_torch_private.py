"""The torch-private APIs acache uses exist on the torch under test, and a missing one
is a one-line user error that names it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from artifactcache.backends import torch_private as tp  # noqa: E402
from artifactcache.errors import AcacheError  # noqa: E402


def test_every_accessor_works_on_this_torch():
    assert tp.aoti_runner_missing("cpu") == ""
    assert isinstance(tp.inductor_cache_dir(), Path)
    tp.forget_inductor_process_caches()
    before = tp.inductor_cache_dir()
    with tp.fresh_inductor_cache(), tp.fresh_cache_artifact_manager():
        assert tp.inductor_cache_dir() != before  # really a fresh dir
    with tp.inductor_config_kept():
        pass
    tp.raise_dynamo_recompile_limit(64)
    import torch._dynamo.config as dc

    assert dc.recompile_limit >= 64
    tp.release_export_state()


def test_config_kept_undoes_an_in_place_change():
    from torch._inductor import config

    before = dict(config.aot_inductor.metadata)
    with tp.inductor_config_kept():
        config.aot_inductor.metadata["acache-test"] = "x"
    assert dict(config.aot_inductor.metadata) == before


def test_missing_api_is_one_line_naming_it(monkeypatch):
    import torch._inductor.utils as iu

    monkeypatch.delattr(iu, "fresh_cache", raising=False)
    monkeypatch.delattr(iu, "fresh_inductor_cache", raising=False)
    with pytest.raises(AcacheError) as e:
        tp.fresh_inductor_cache()
    msg = str(e.value)
    assert "\n" not in msg
    assert "torch._inductor.utils.fresh_cache" in msg and torch.__version__ in msg


def test_missing_module_is_one_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch.compiler._cache", None)  # import -> ImportError
    with pytest.raises(AcacheError, match="CacheArtifactManager"):
        tp.fresh_cache_artifact_manager()


def test_missing_aoti_runner_is_reported(monkeypatch):
    monkeypatch.delattr(torch._C._aoti, "AOTIModelContainerRunnerCpu")
    assert "AOTIModelContainerRunnerCpu" in tp.aoti_runner_missing("cpu")
    with pytest.raises(AcacheError, match="AOTIModelContainerRunnerCpu"):
        tp.aoti_container_runner(Path("x.so"), torch.device("cpu"))


def test_a_kernel_path_moves_to_this_processs_cache_dir(tmp_path):
    here = tmp_path / "warm"
    built = "/tmp/tmpbuild123/75/c75a2mly.py"
    assert tp.local_kernel_path(built, here) == str(here / "75" / "c75a2mly.py")
    assert tp.local_kernel_path(str(here / "75" / "c75a2mly.py"), here) == str(
        here / "75" / "c75a2mly.py"
    )
    assert tp.local_kernel_path(None, here) is None
    assert tp.local_kernel_path("k.py", here) == "k.py"


def test_a_static_autotuners_recheck_looks_in_this_processs_cache_dir(tmp_path, monkeypatch):
    """A saved graph's static autotuner carries the build's absolute kernel path; the
    recheck of its tuning result must look where the entry's files were installed."""
    th = pytest.importorskip("torch._inductor.runtime.triton_heuristics")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "warm"))
    seen = []
    monkeypatch.setattr(
        th.CachingAutotuner, "recheck_autotune_cache", lambda self, **k: seen.append(self.filename)
    )
    real = th.CachingAutotuner.recheck_autotune_cache
    tuner = object.__new__(th.CachingAutotuner)
    tuner.filename = "/tmp/tmpgone/75/c75a2mly.py"
    with tp.inductor_tuning_results_kept():
        tuner.recheck_autotune_cache(reload_kernel_from_src=None)
    assert seen == [str(tmp_path / "warm" / "75" / "c75a2mly.py")]
    assert th.CachingAutotuner.recheck_autotune_cache is real  # restored


def test_a_plain_result_does_not_overwrite_a_coordinate_descent_one(tmp_path):
    """Inductor's own AutotuneCache: outside the context a later plain benchmark result
    replaces the refined one (the fault), inside it the refined one stays."""
    ac = pytest.importorskip("torch._inductor.runtime.autotune_cache")
    config_cls = pytest.importorskip("triton").Config
    kernel = tmp_path / "75" / "c75a2mly.py"
    kernel.parent.mkdir(parents=True)
    meta = {"autotune_local_cache": True}

    def saved_by(inside: bool) -> dict:
        cache = ac.AutotuneCache.create(meta, str(kernel), "confhash")
        refined, plain = config_cls({"XBLOCK": 128}, num_warps=8), config_cls({"XBLOCK": 64})
        cache.save(refined, 10**6, found_by_coordesc=True)
        if inside:
            with tp.inductor_tuning_results_kept():
                cache.save(plain, 10**6)
        else:
            cache.save(plain, 10**6)
        import json

        return json.loads(Path(cache.local_cache[1]).read_text())

    assert saved_by(inside=False)["found_by_coordesc"] is False
    kept = saved_by(inside=True)
    assert kept["found_by_coordesc"] is True and kept["XBLOCK"] == 128
    with tp.inductor_tuning_results_kept():  # a first plain result is still saved
        other = ac.AutotuneCache.create(meta, str(tmp_path / "76" / "c76.py"), "h2")
        (tmp_path / "76").mkdir()
        other.save(config_cls({"XBLOCK": 32}), 10**6)
        assert Path(other.local_cache[1]).is_file()
