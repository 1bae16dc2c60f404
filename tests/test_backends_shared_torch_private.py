"""The torch-private APIs acache uses exist on the torch under test, and a missing one
is a one-line user error that names it."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from artifactcache.backends.shared import torch_private as tp  # noqa: E402
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
    gone = str(tmp_path / "tmpbuild123" / "75" / "c75a2mly.py")
    assert tp.local_kernel_path(gone, here) == str(here / "75" / "c75a2mly.py")
    inside = str(here / "75" / "c75a2mly.py")
    assert tp.local_kernel_path(inside, here) == inside
    (tmp_path / "kept" / "75").mkdir(parents=True)  # its own dir is there: left alone
    kept = str(tmp_path / "kept" / "75" / "c75a2mly.py")
    assert tp.local_kernel_path(kept, here) == kept
    assert tp.local_kernel_path(None, here) is None
    assert tp.local_kernel_path("k.py", here) == "k.py"


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
    with tp.inductor_tuning_results_kept():
        tuner.recheck_autotune_cache(reload_kernel_from_src=None)
    assert seen == [str(warm / "75" / "c75a2mly.py")]
    assert Path(hook_cache.local_cache[1]).parent == warm / "75"
    assert th.CachingAutotuner.recheck_autotune_cache is real  # restored


def test_the_patches_stay_until_the_last_overlapping_context_leaves():
    th = pytest.importorskip("torch._inductor.runtime.triton_heuristics")
    real = th.CachingAutotuner.recheck_autotune_cache
    outer = tp.inductor_tuning_results_kept()
    inner = tp.inductor_tuning_results_kept()
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

    with tp.inductor_tuning_results_kept():
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


def test_forgetting_drops_the_isa_verdicts_that_change_probe_keys():
    """A verdict stored on an ISA object changes its build flags, so the probes' keys."""
    from torch._inductor import cpu_vec_isa

    isa = cpu_vec_isa.supported_vec_isa_list[0]
    isa._is_avx512_bf16_supported = True
    isa._is_amx_fp16_supported = True
    isa._arch_flags = type(isa)._arch_flags + " -mavx512bf16"  # a probe that raised
    tp.forget_inductor_process_caches()  # the next probe computes them again
    assert not [n for n in vars(isa) if n.startswith("_is_") or n == "_arch_flags"]
    assert "-mavx512bf16" not in isa.build_arch_flags().replace(type(isa)._arch_flags, "")


def _probe_libraries(cache_dir: Path) -> set[str]:
    return {p.name for p in cache_dir.rglob("*.so")}


# An AMX CPU with AVX-512 bf16, on any x86 machine: the probes only compile and dlopen
# their code, and the bf16 verdict is the one that grows the AMX and AVX-512 probes' flags.
FAKE_CPU = {
    "_is_avx512_bf16_supported": True,
    "_is_vnni_supported": True,
    "_init_amx": True,
    "_is_amx_fp16_supported": False,  # its probe needs gcc 13
}
FAKE_FLAGS = ["avx2", "avx512", "avx512_vnni", "amx_tile"]
FAKE_CPU_CODE = f"""
import torch
from torch._inductor import cpu_vec_isa
for name, verdict in {FAKE_CPU!r}.items():
    setattr(torch.cpu, name, lambda verdict=verdict: verdict)
cpu_vec_isa.x86_isa_checker = lambda: {FAKE_FLAGS!r}
"""


@pytest.mark.slow
def test_a_second_build_in_a_process_compiles_the_probes_a_fresh_process_does(
    tmp_path, monkeypatch
):
    """The probes a warm process compiles are the ones a build's cache dir must hold."""
    import os
    import platform
    import subprocess

    from torch._inductor import cpu_vec_isa

    if platform.machine() not in ("x86_64", "AMD64") or not hasattr(cpu_vec_isa, "x86_isa_checker"):
        pytest.skip("the probe keys checked here are x86's (cpu_vec_isa.x86_isa_checker)")
    code = FAKE_CPU_CODE + "cpu_vec_isa.valid_vec_isa_list()"
    fresh = tmp_path / "fresh"
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(fresh)}
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=300)
    for name, verdict in FAKE_CPU.items():
        monkeypatch.setattr(torch.cpu, name, lambda verdict=verdict: verdict, raising=False)
    monkeypatch.setattr(cpu_vec_isa, "x86_isa_checker", lambda: FAKE_FLAGS)
    grown = [isa for isa in cpu_vec_isa.supported_vec_isa_list if hasattr(isa, "_avx512_bf16_code")]
    try:
        with tp.fresh_inductor_cache():
            tp.forget_inductor_process_caches()
            cpu_vec_isa.valid_vec_isa_list()  # an earlier build's probes, elsewhere
            verdicts = [vars(i).get("_is_avx512_bf16_supported") for i in grown]
        with tp.fresh_inductor_cache():
            tp.forget_inductor_process_caches()
            cpu_vec_isa.valid_vec_isa_list()
            second = _probe_libraries(tp.inductor_cache_dir())
    finally:
        monkeypatch.undo()
        tp.forget_inductor_process_caches()  # no faked verdict outlives the test
    if not all(verdicts):
        pytest.skip(f"this compiler cannot build every AVX-512 bf16 probe: {verdicts}")
    assert second == _probe_libraries(fresh)


def test_restoring_inductor_config_prints_no_deprecation_warnings():
    """torch 2.15 warns for each deprecated entry (use_mixed_mm, ...) a whole-config copy
    holds when it is loaded back; an acache build's restore must not print them, since
    every user error is one line on stderr (CI runs this on the newest torch)."""
    import warnings

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with tp.inductor_config_kept():
            pass
        from torch._inductor import config

        tp.load_inductor_config(config.get_config_copy())
    assert not [w for w in seen if "torch._inductor.config" in str(w.message)], seen
