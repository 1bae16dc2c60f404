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
