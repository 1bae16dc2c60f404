"""The torch-private APIs acache uses exist on the torch under test, and a missing one
is a one-line user error that names it."""

from __future__ import annotations

import os
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


def test_pin_triton_ptxas_sets_the_path_inductor_compiles_with(monkeypatch, tmp_path):
    """A warm inductor process must hash Triton keys with the build's ptxas: pinning
    applies Inductor's own rule (torch's bundled ptxas, unless the user set one). The
    rule runs for real, on a fake torch tree that has a ptxas."""
    compile_tasks = pytest.importorskip("torch._inductor.runtime.compile_tasks")
    helper = compile_tasks._set_triton_ptxas_path
    fake = tmp_path / "torch" / "_inductor" / "runtime" / "compile_tasks.py"
    fake.parent.mkdir(parents=True)
    fake.write_text("")
    found = []
    for bin_dir in (fake.parents[1] / "bin", fake.parents[2] / "bin"):  # torch releases differ
        bin_dir.mkdir(exist_ok=True)
        (bin_dir / "ptxas").write_text("#!/bin/sh\n")
        (bin_dir / "ptxas").chmod(0o755)
        found.append(str(bin_dir / "ptxas"))
    monkeypatch.setattr(compile_tasks, "__file__", str(fake))
    for user_set in (None, "/opt/my/ptxas"):
        if hasattr(helper, "cache_clear"):
            helper.cache_clear()
        if user_set is None:
            monkeypatch.delenv("TRITON_PTXAS_PATH", raising=False)
        else:
            monkeypatch.setenv("TRITON_PTXAS_PATH", user_set)
        tp.pin_triton_ptxas()
        if user_set is None:
            assert os.environ["TRITON_PTXAS_PATH"] in found
        else:
            assert os.environ["TRITON_PTXAS_PATH"] == user_set  # the user's wins
    if hasattr(helper, "cache_clear"):
        helper.cache_clear()


def test_inductor_load_and_build_pin_ptxas_before_anything_compiles():
    """Both ends of an entry pin it (the call sits before the model is built)."""
    import inspect

    from artifactcache.backends.inductor import backend

    for method in (backend.InductorBackend.build, backend.InductorBackend.load):
        src = inspect.getsource(method)
        assert src.index("pin_triton_ptxas()") < src.index("build_model_for(")


@pytest.mark.slow
@pytest.mark.skipif(tp.aot_compile_missing() != "", reason="torch cannot save compiled functions")
def test_a_saved_step_guards_its_inputs_but_not_the_model_parameters(tmp_path):
    """A parameter guard would check requires_grad, so a model whose parameters differ
    only there would fail it; an input of another shape, or a dynamic size outside its
    range, must still fail its guard."""

    def step(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
        return model(x).relu()

    built = torch.nn.Linear(8, 4).requires_grad_(False)
    traced = torch.randn(2, 8)
    tp.mark_dynamic_dim(traced, 0, 2, 4)  # as the inductor steps mark a pass's length
    x = torch.randn(2, 8)
    with torch.no_grad():
        compiled = tp.aot_compile_step(step, (built, traced), {})
        tp.save_compiled_step(compiled, tmp_path / "step")
        loaded = tp.load_compiled_step(tmp_path / "step")
        other = torch.nn.Linear(8, 4)  # requires_grad=True: only a parameter guard sees it
        torch.testing.assert_close(loaded(other, x), step(other, x))
        torch.testing.assert_close(loaded(built, torch.randn(3, 8)).shape, (3, 4))
        with pytest.raises(Exception, match="(?i)guard"):
            loaded(built, torch.randn(2, 9))
        with pytest.raises(Exception, match="(?i)guard"):
            loaded(built, torch.randn(6, 8))  # past the dynamic range's top


def test_every_int_array_the_cpp_wrapper_names_is_declared_where_it_is_used():
    """Inductor's C++ wrapper caches an int array's name by id() of the writeline its
    declaration went through; a freed one-call buffer's address comes back for the
    next, or the declaration sits in a block the use is outside of, and g++ stops at an
    undeclared ``int_array_N`` (aoti builds on the H200 and the H100). Mended: each use
    declares its own array through its own writeline."""
    from itertools import count

    from torch._inductor.codegen.cpp_wrapper_cpu import CppWrapperCpu
    from torch._inductor.utils import IndentedBuffer

    tp.declare_int_arrays_at_each_use()
    tp.declare_int_arrays_at_each_use()  # once per process, however often it is called
    method = CppWrapperCpu.codegen_int_array_var
    assert method._acache_declares_each and not hasattr(method.__wrapped__, "__wrapped__")
    wrapper = CppWrapperCpu.__new__(CppWrapperCpu)
    wrapper.int_array_id, wrapper.codegen_int_array_var_cache = count(), {}
    wrapper.declared_int_array_vars = set()
    wrapper._int_array_writeline_targets = []  # the releases that mend it themselves
    for _ in range(64):
        buffer = IndentedBuffer()
        name = wrapper.codegen_int_array_var("{2, 3}", buffer.writeline)
        assert f"{name}[] = {{2, 3}};" in buffer.getvalue()
        del buffer
    # One live buffer: a use inside a block, then one after it, each with its own
    # declaration in front of it (the cached name would be out of the second's scope).
    body = IndentedBuffer()
    body.writeline("{")
    inner = wrapper.codegen_int_array_var("{4, 5}", body.writeline)
    body.writeline(f"use({inner});")
    body.writeline("}")
    outer = wrapper.codegen_int_array_var("{4, 5}", body.writeline)
    body.writeline(f"use({outer});")
    lines = [line.strip() for line in body.getvalue().splitlines()]
    assert outer != inner
    after_block = lines[lines.index("}") + 1 :]
    assert any(f"{outer}[] = {{4, 5}};" in line for line in after_block)
