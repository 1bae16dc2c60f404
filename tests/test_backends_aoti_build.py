"""aoti's build and Inductor's CPU ISA verdicts: every step's wrapper compile reads them
from the cache root's memo, and a concurrent build fills that memo beside its workers
(shared/cpu_isa.py; docs/perf-notes.md, attempt 52)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from artifactcache.backends.aoti import backend as aoti
from artifactcache.backends.base import BuildContext
from artifactcache.choices import BuildChoices
from artifactcache.models import WeightsSpec, build_model
from artifactcache.recipes import load_recipe

cpu_vec_isa = pytest.importorskip("torch._inductor.cpu_vec_isa")


class _Stop(Exception):
    pass


def test_a_steps_compile_reads_the_isa_memo(monkeypatch, tmp_path: Path):
    seen = []

    def compile_and_package(ep, package_path, inductor_configs):
        check = cpu_vec_isa.VecISA.__dict__.get("check_build")
        seen.append(getattr(check, "_acache_isa_memo", False))
        raise _Stop

    monkeypatch.setattr(torch._inductor, "aoti_compile_and_package", compile_and_package)
    recipe = load_recipe("tiny-llama")
    model = build_model(recipe)
    with pytest.raises(_Stop):
        aoti.build_step(model, recipe, torch.device("cpu"), "decode", {}, tmp_path,
                        tmp_path, {}, tmp_path)  # fmt: skip
    assert seen == [True]
    check = cpu_vec_isa.VecISA.__dict__.get("check_build")
    assert not getattr(check, "_acache_isa_memo", False)  # torch's own once it returns


@pytest.mark.parametrize(("jobs", "prefilled"), [("3", True), ("1", False)])
def test_a_concurrent_build_fills_the_memo_beside_its_workers(
    monkeypatch, tmp_path: Path, jobs: str, prefilled: bool
):
    """The prefill starts once the compiler is probed, with that compiler, and the build
    waits for it before returning; a serial build probes in its own steps instead."""
    monkeypatch.setenv("ACACHE_BUILD_JOBS", jobs)
    monkeypatch.setattr(aoti, "choose_cxx", lambda **_: "/usr/bin/g++")
    started: list[tuple] = []

    class Thread:
        joined = False

        def join(self, timeout: float | None = None) -> None:
            Thread.joined = True

    def prefill(cxx, memo_dir):
        started.append((cxx, memo_dir))
        return Thread()

    def steps_and_timings(*args):
        probe = args[-2] if len(args) > 1 else args[0]  # concurrent: (.., probe, jobs)
        probe()
        return {s: f"{s}/{s}.so" for s in aoti.STEPS}, {}

    monkeypatch.setattr(aoti, "prefill_isa_verdicts", prefill)
    monkeypatch.setattr(aoti, "build_concurrently", steps_and_timings)

    def serially(self, ctx, workdir, scratch, probe):
        return steps_and_timings(probe)

    monkeypatch.setattr(aoti.AotiBackend, "_build_serially", serially)
    ctx = BuildContext(recipe=load_recipe("tiny-llama"), opts=BuildChoices(),
                       weights=WeightsSpec(None, 0), memo_dir=tmp_path / "memo")  # fmt: skip
    (tmp_path / "w").mkdir()
    aoti.BACKEND.build(ctx, tmp_path / "w")
    if prefilled:
        assert started == [("/usr/bin/g++", tmp_path / "memo")] and Thread.joined
    else:
        assert started == [] and not Thread.joined


def _ctx(tmp_path: Path, **extra: str) -> BuildContext:
    return BuildContext(recipe=load_recipe("tiny-llama"), opts=BuildChoices(extra=extra),
                        weights=WeightsSpec(None, 0), memo_dir=tmp_path / "memo")  # fmt: skip


def test_a_failed_build_still_waits_for_the_prefill(monkeypatch, tmp_path: Path):
    monkeypatch.setenv("ACACHE_BUILD_JOBS", "3")
    monkeypatch.setattr(aoti, "choose_cxx", lambda **_: None)
    waits: list[float | None] = []

    class Thread:
        def join(self, timeout: float | None = None) -> None:
            waits.append(timeout)

    def failing(*args):
        args[-2]()  # the probe, which starts the prefill
        raise RuntimeError("a worker failed")

    monkeypatch.setattr(aoti, "prefill_isa_verdicts", lambda cxx, memo: Thread())
    monkeypatch.setattr(aoti, "build_concurrently", failing)
    (tmp_path / "w").mkdir()
    with pytest.raises(RuntimeError, match="a worker failed"):
        aoti.BACKEND.build(_ctx(tmp_path), tmp_path / "w")
    assert waits == [aoti.PREFILL_JOIN_S]


def test_the_serial_path_gives_each_step_the_memo_dir(monkeypatch, tmp_path: Path):
    got: list[Path | None] = []

    def step(model, recipe, dev, name, cfg, workdir, scratch, timings, memo_dir):
        got.append(memo_dir)
        return f"{name}/{name}.so"

    monkeypatch.setattr(aoti, "build_step", step)
    monkeypatch.setattr(aoti, "build_model_for", lambda ctx, dev, backend: object())
    aoti.BACKEND._build_serially(_ctx(tmp_path), tmp_path, tmp_path, dict)
    assert got == [tmp_path / "memo"] * len(aoti.STEPS)


def test_a_build_checks_that_torch_has_the_wrapper_setting_first(monkeypatch, tmp_path: Path):
    import torch._inductor.config as inductor_config

    from artifactcache.backends.aoti.options import CONFIG_NAME
    from artifactcache.errors import AcacheError

    monkeypatch.delattr(inductor_config.aot_inductor, CONFIG_NAME.rsplit(".", 1)[1])
    monkeypatch.setattr(aoti, "planned_jobs", lambda *a: pytest.fail("planned past the check"))
    with pytest.raises(AcacheError, match=f"has no {CONFIG_NAME}"):
        aoti.BACKEND.build(_ctx(tmp_path, wrapper_opt="O0"), tmp_path)


def test_a_module_build_keeps_its_probes_verdicts(monkeypatch, tmp_path: Path):
    """acache's any-module aoti build: the compiler probe and the ISA verdicts both kept
    in the store's memo dir, as a recipe's steps keep them."""
    from artifactcache.backends.aoti import module as aoti_module
    from artifactcache.sources.module import spec_from_cli

    root = Path(__file__).resolve().parents[1]
    spec = spec_from_cli(str(root / "examples" / "vision.py") + ":tiny_convnet", None)
    seen: dict[str, object] = {}

    def configs(opts, memo_dir=None):
        seen["configs_memo"] = memo_dir
        return {}

    def compile_and_package(ep, package_path, inductor_configs):
        check = cpu_vec_isa.VecISA.__dict__.get("check_build")
        seen["isa_memo"] = getattr(check, "_acache_isa_memo", False)
        raise _Stop

    monkeypatch.setattr(aoti_module, "inductor_configs", configs)
    monkeypatch.setattr(torch._inductor, "aoti_compile_and_package", compile_and_package)
    (tmp_path / "w").mkdir()
    with pytest.raises(_Stop):
        aoti_module.MODULE_BACKEND.build(spec, BuildChoices(), tmp_path / "w", tmp_path)
    assert seen == {"configs_memo": tmp_path, "isa_memo": True}
    # The manifest's compiler record reads the same memo, or it probes again.
    records: list[object] = []
    monkeypatch.setattr(aoti_module, "build_record",
                        lambda cxx, memo_dir=None: records.append(memo_dir) or {})  # fmt: skip
    monkeypatch.setattr(aoti_module, "safe_extract",
                        lambda pkg, dest: ["model/model.so"])  # fmt: skip

    def packaged(ep, package_path, inductor_configs):
        return package_path

    monkeypatch.setattr(torch._inductor, "aoti_compile_and_package", packaged)
    (tmp_path / "w2").mkdir()
    aoti_module.MODULE_BACKEND.build(spec, BuildChoices(), tmp_path / "w2", tmp_path)
    assert records == [tmp_path]
