"""inductor: parity with eager, a warm second process, and the Mega-Cache fallback on
a torch that cannot save compiled functions.

Parity here is tiny-llama's (static passes of 8: a padded one and a full one, and 32
decode steps); every family on inductor and ort, and four on aoti (AOTI_FAMILIES), is
tests/test_models_families.py's.

Compiling is slow on CPU (tens of seconds per recipe), so entries are built once
per module into one cache root and shared by the tests.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from _backend_util import (
    BATCH_PROMPTS,
    assert_rows_match_alone,
    kernel_compiles,
    load_in_child,
    private_dir,
    rel_err,
    runner_cache,
    tree_digest,
)
from _generate_util import assert_sampling_and_eos

from artifactcache import api
from artifactcache.backends.base import get_backend
from artifactcache.backends.inductor import backend as inductor
from artifactcache.backends.inductor import compiling
from artifactcache.choices import BuildChoices
from artifactcache.errors import BackendError, ShapeError
from artifactcache.recipes import load_recipe

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", autouse=True)
def serial_builds():
    """This module's entries build serially on any host (on CUDA or 8+ cores they would
    build in workers, with another record); the workers' build has a test of its own."""
    with pytest.MonkeyPatch.context() as m:
        m.setenv("ACACHE_BUILD_JOBS", "1")
        yield


@pytest.fixture(scope="module")
def root(serial_builds, tmp_path_factory) -> Path:
    """The module's cache root, its tiny-llama entry built by `acache build` in a process
    of its own, as users build, with an empty Inductor cache (a build in this process
    would come after whatever else ran in it, e.g. an aoti build: covered by
    test_backends_aoti's config check)."""
    root = private_dir(tmp_path_factory, "inductor-cache")
    build = subprocess.run(
        [sys.executable, "-m", "artifactcache.cli", "build", "tiny-llama", "-b", "inductor",
         "--cache-dir", str(root)],
        capture_output=True, text=True, env={**os.environ, "TORCHINDUCTOR_CACHE_DIR":
        str(tmp_path_factory.mktemp("build-inductor"))},
    )  # fmt: skip
    assert build.returncode == 0, build.stderr[-3000:]
    return root


@pytest.fixture(scope="module")
def runners(root: Path):
    """(recipe, backend) -> Runner, built on first use (build-on-miss, then warm load)."""
    return runner_cache(root)


@pytest.mark.parametrize("name", ["tiny-llama"])
def test_matches_eager(name: str, runners):
    recipe = load_recipe(name)
    eager, compiled = runners(name, "eager"), runners(name, "inductor")
    prompt = list(recipe.bench.prompt_ids)
    full = [(7 * i + 11) % recipe.model.vocab_size for i in range(recipe.shapes.prefill_len)]
    for ids in (prompt, full):
        assert rel_err(compiled.logits(ids), eager.logits(ids)) <= 1e-4
    assert compiled.generate(prompt, 32) == eager.generate(prompt, 32)


def test_sampling_and_eos(runners):
    """generate()'s sampling and EOS through the compiled steps of the module's entry
    (tests/test_generate_sampling.py holds eager and the sampler to the same checks)."""
    prompt = list(load_recipe("tiny-llama").bench.prompt_ids)
    assert_sampling_and_eos(runners("tiny-llama", "inductor"), prompt)


def test_batch_rows_equal_each_prompt_run_alone(root: Path, runners):
    """Steps built for max_batch 3 (row_start an input): each row is eager's batch 1."""
    batched = api.load("tiny-mistral", "inductor", cache_dir=root, max_batch=3)
    # 24 new tokens after the 19-token prompt cross tiny-mistral's 16-token window.
    assert_rows_match_alone(batched, runners("tiny-mistral", "eager"), BATCH_PROMPTS[1:], 24)


def test_this_torch_warms_from_saved_compiled_functions():
    """torch 2.13 (the dev venv) has the API; the rule must pick it there."""
    assert hasattr(torch.compiler, "load_compiled_function")
    assert inductor.warm_path() == "aot_compile"
    # CUDA too (measured faster to load and to decode on the H200): the key says which.
    tiny = load_recipe("tiny-llama")
    for device in ("cpu", "cuda"):
        opts = BuildChoices(device=device, dtype="bf16")
        assert inductor.BACKEND.factors(tiny, opts)["warm_path"] == "aot_compile"


def test_the_warm_path_can_be_chosen_and_the_key_follows(monkeypatch):
    """$ACACHE_INDUCTOR_WARM_PATH picks the path to measure against the default; the
    key names the path, so the two entries never mix."""
    tiny, cuda = load_recipe("tiny-llama"), BuildChoices(device="cuda", dtype="bf16")
    monkeypatch.setenv(inductor.WARM_PATH_ENV, "aot_compile")
    assert inductor.warm_path() == "aot_compile"
    assert inductor.BACKEND.factors(tiny, cuda)["warm_path"] == "aot_compile"
    monkeypatch.setenv(inductor.WARM_PATH_ENV, "megacache")
    assert inductor.warm_path() == "megacache"
    assert inductor.BACKEND.factors(tiny, cuda)["warm_path"] == "megacache"
    monkeypatch.setenv(inductor.WARM_PATH_ENV, "dynamo")
    with pytest.raises(BackendError, match="choose one of aot_compile, megacache"):
        inductor.warm_path()


def test_an_unknown_warm_path_is_a_one_line_cli_error(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from artifactcache.cli.app import app

    monkeypatch.setenv(inductor.WARM_PATH_ENV, "dynamo")
    cache = tmp_path / "cache"
    res = CliRunner().invoke(
        app, ["build", "tiny-llama", "--backend", "inductor", "--cache-dir", str(cache)]
    )
    assert res.exit_code == 1
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "ACACHE_INDUCTOR" in lines[0]
    assert not cache.exists() or not any(p.is_file() for p in cache.rglob("*"))


def test_entry_holds_compiled_steps_and_kernels(root: Path):
    res = api.build("tiny-llama", "inductor", cache_dir=root)
    meta, path = res.entry.meta, res.entry.path
    assert meta["warm_path"] == "aot_compile"
    files = ("prefill.aotfn", "extend.aotfn", "decode.aotfn")
    assert meta["steps"] == {f: (path / f).stat().st_size for f in files}
    # The model is an input of the saved functions, so no weight is in them.
    weight_bytes = _tiny_llama_weight_bytes()
    assert all(size < weight_bytes / 10 for size in meta["steps"].values())
    # On CPU the compiled graphs hold C++ source only; the entry carries the objects.
    assert meta["kernels"] and all((path / "kernels" / k).is_file() for k in meta["kernels"])
    # The build's own breakdown: each step, then what was saved, within the wall time.
    t = meta["compile_seconds"]
    steps = ["decode", "extend", "prefill"]
    cpu = [f"{s}_cpu" for s in steps]  # this process's CPU seconds in each step
    assert sorted(t) == sorted([*steps, *cpu, "model", "save", "wall"])  # sorted on disk
    assert all(v >= 0 for v in t.values()) and t["prefill"] > 0 and t["prefill_cpu"] > 0
    assert sum(v for k, v in t.items() if k not in ("wall", *cpu)) <= t["wall"] + 0.01


def _tiny_llama_weight_bytes() -> int:
    from artifactcache.models import build_model

    model = build_model(load_recipe("tiny-llama"), device="cpu", dtype="fp32")
    return sum(p.numel() * p.element_size() for p in model.parameters())


def test_steps_built_in_workers_warm_a_process_that_compiles_nothing(
    root: Path, runners, tmp_path: Path
):
    """ACACHE_BUILD_JOBS=3: each step compiled in a build worker of its own (fresh caches
    each), their kernel files merged into the entry. The key is the serial build's, and a
    fresh process loads it without a compile and generates eager's tokens."""
    recipe = load_recipe("tiny-llama")
    prompt = list(recipe.bench.prompt_ids)
    workers_root = tmp_path / "cache"
    workers_root.mkdir(mode=0o700)
    build = subprocess.run(
        [sys.executable, "-m", "artifactcache.cli", "build", "tiny-llama", "-b", "inductor",
         "--cache-dir", str(workers_root)],
        capture_output=True, text=True, env={**os.environ, "ACACHE_BUILD_JOBS": "3",
        "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "build-inductor")},
    )  # fmt: skip
    assert build.returncode == 0, build.stderr[-3000:]
    assert "3 steps at once" in " ".join(build.stderr.split())  # wrapped at COLUMNS
    built = api.build("tiny-llama", "inductor", cache_dir=workers_root)
    assert not built.built  # a hit: the entry the workers built
    entry, meta = built.entry, built.entry.meta
    assert meta["build_jobs"] == 3
    assert set(meta["steps"]) == set(compiling.STEP_FILES.values())
    assert meta["kernels"] and all((entry.path / "kernels" / k).is_file() for k in meta["kernels"])
    assert not (entry.path / ".steps").exists()  # the staging folder is not in the entry
    times = meta["compile_seconds"]
    for step in inductor.STEPS:
        assert times[step] > 0 and times[f"{step}_worker"] >= times[step]
    assert "compiler_probe" not in times
    serial = api.build("tiny-llama", "inductor", cache_dir=root)  # the module's, serial
    assert serial.key == built.key  # scheduling is no key factor
    assert set(serial.entry.meta) == set(meta)  # the same record fields
    assert (serial.entry.meta["build_jobs"], meta["build_jobs"]) == (1, 3)
    env = {
        "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"),  # fresh and empty
        "TRITON_CACHE_DIR": str(tmp_path / "triton"),
        "TORCHINDUCTOR_COMPILE_THREADS": "1",  # compiles happen in-process, where we count
    }
    report = load_in_child(workers_root, "tiny-llama", "inductor", prompt, 16, env)
    assert report["ids"] == runners("tiny-llama", "eager").generate(prompt, 16)
    assert kernel_compiles(report) == []
    assert "stats" not in report["counters"]  # Dynamo traced nothing


def test_second_process_does_not_compile(root: Path, runners, tmp_path: Path):
    recipe = load_recipe("tiny-llama")
    prompt = list(recipe.bench.prompt_ids)
    want = runners("tiny-llama", "eager").generate(prompt, 16)
    # The module's entry, built by `acache build` in its own process (the root fixture).
    entry = api.build("tiny-llama", "inductor", cache_dir=root).entry  # a hit: the entry
    assert entry.meta["build_jobs"] == 1
    before = tree_digest(entry.path)
    # This process's loads from the root may have kept their CPU ISA verdicts there: the
    # children start without them, so the first probes and the second reads its memo.
    (root / "v1" / "cpu-isa.json").unlink(missing_ok=True)
    env = {
        "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"),  # fresh and empty
        "TRITON_CACHE_DIR": str(tmp_path / "triton"),
        "TORCHINDUCTOR_COMPILE_THREADS": "1",  # compiles happen in-process, where we count
    }
    report = load_in_child(root, "tiny-llama", "inductor", prompt, 16, env)
    assert report["ids"] == want
    # Two passes of 8 (a first pass at slot 0, then a padded extend pass): both pass
    # steps open at their first call.
    two_passes = [(7 * i + 11) % recipe.model.vocab_size for i in range(12)]
    both = load_in_child(root, "tiny-llama", "inductor", two_passes, 4, env)
    assert both["ids"] == runners("tiny-llama", "eager").generate(two_passes, 4)
    for r in (report, both):
        assert kernel_compiles(r) == []
        counters = r["counters"]
        # Dynamo traced no frame (a trace counts calls_captured and unique_graphs), and
        # AOTAutograd and the FX-graph cache were never consulted: the saved functions
        # were called as they are.
        assert "stats" not in counters, counters["stats"]
        assert "aot_autograd" not in counters
        ind = counters.get("inductor", {})
        assert ind.get("fxgraph_cache_hit", 0) == 0 and ind.get("fxgraph_cache_miss", 0) == 0
    # The seed prompt (6 tokens in a pass of 8) needs only the extend pass: the
    # first-pass step is never opened.
    assert report["unopened"] == {
        "at_load": ["extend_step", "fresh_step", "prefill_step"],
        "after": ["fresh_step"],
    }
    assert both["unopened"]["after"] == []
    # The first child's CPU ISA verdicts were kept in the cache root: the second ran no
    # probe (torch 2.13 probes each candidate ISA in a child Python; a torch that
    # counts none here has nothing for the memo to save).
    if report["isa_probes"]:
        assert both["isa_probes"] == []
        assert (root / "v1" / "cpu-isa.json").is_file()
    for r in (report, both):
        assert {"compiler_ready", "files_installed", "cache_loaded", "steps_read",
                "steps_opened", "steps_loaded", "artifact_ready", "weights_ready"} <= set(
            r["phases"]
        )  # fmt: skip
    assert tree_digest(entry.path) == before  # load never writes into the entry


def test_a_pass_step_opened_at_first_use_is_opened_in_the_tuning_scope(root: Path, monkeypatch):
    """The saved functions are read at load (under the store's reader lock); a pass step
    deserialized later still runs inside inductor_tuning_results_kept, as the load does."""
    from artifactcache.backends.inductor import autotune_cache

    api.build("tiny-llama", "inductor", cache_dir=root)
    depths: list[int] = []
    real = inductor.load_compiled_step

    def recording(saved):
        assert isinstance(saved, bytes)  # read at load, not from the entry later
        depths.append(autotune_cache.PATCHES.depth)
        return real(saved)

    monkeypatch.setattr(inductor, "load_compiled_step", recording)
    runner = api.load("tiny-llama", "inductor", cache_dir=root, build_on_miss=False)
    assert len(depths) == 1  # decode only
    recipe = load_recipe("tiny-llama")
    runner.generate([3] * recipe.shapes.prefill_len, 2)  # the first pass: rows at slot 0
    runner.generate([3, 4, 5], 2)  # a padded pass: extend
    assert len(depths) == 3 and all(d >= 1 for d in depths), depths
    assert autotune_cache.PATCHES.depth == 0


def test_without_the_api_the_entry_is_a_megacache(monkeypatch, tmp_path: Path):
    """A torch without load_compiled_function (2.11 may be one) falls back, and says so."""
    aot_key = api.key_for(get_backend("inductor"), api.make_context("tiny-llama", "inductor")[1])
    monkeypatch.delattr(torch.compiler, "load_compiled_function")
    b, ctx = api.make_context("tiny-llama", "inductor")
    assert b.factors(ctx.recipe, ctx.opts)["warm_path"] == "megacache"
    assert api.key_for(b, ctx).key != aot_key.key  # different files, different key
    root = tmp_path / "cache"
    root.mkdir(mode=0o700)
    res = api.build("tiny-llama", "inductor", cache_dir=root)
    meta, path = res.entry.meta, res.entry.path
    assert meta["warm_path"] == "megacache"
    assert (path / "megacache.bin").stat().st_size == meta["megacache_bytes"] > 0
    assert meta["cache_artifacts"].get("inductor", 0) >= 2  # the prefill and decode graphs
    assert not list(path.glob("*.aotfn"))
    assert {"prefill", "extend", "decode", "wall"} <= set(res.phases)  # built here
    prompt = list(load_recipe("tiny-llama").bench.prompt_ids)
    eager = api.load("tiny-llama", "eager", cache_dir=root)
    runner = api.load("tiny-llama", "inductor", cache_dir=root, build_on_miss=False)
    assert runner.generate(prompt, 8) == eager.generate(prompt, 8)


def test_an_entry_missing_a_compiled_step_is_refused(tmp_path: Path):
    (tmp_path / "prefill.aotfn").write_bytes(b"x")
    (tmp_path / "extend.aotfn").write_bytes(b"x")
    b, ctx = api.make_context("tiny-llama", "inductor")
    with pytest.raises(BackendError, match="no decode.aotfn: rebuild it with --force") as ei:
        b.load(ctx, tmp_path, {"warm_path": "aot_compile"})
    assert "\n" not in str(ei.value)


def test_child_loads_only_from_the_entry(tmp_path: Path):
    """Guards the test above: the child never builds, so it used the cached entry."""
    other = tmp_path / "empty-root"
    other.mkdir(mode=0o700)
    with pytest.raises(AssertionError, match="KeyLookupError"):
        load_in_child(other, "tiny-llama", "inductor", [1, 2], 2, {})


def test_shapes_that_do_not_fit(runners):
    recipe = load_recipe("tiny-llama")
    runner = runners("tiny-llama", "inductor")
    with pytest.raises(ShapeError):
        runner.logits(list(range(1, recipe.shapes.max_seq_len + 2)))
    with pytest.raises(ShapeError):
        runner.generate([1, 2], recipe.shapes.max_seq_len)


def test_modes_are_key_factors_and_reduce_overhead_needs_cuda():
    b = get_backend("inductor")
    keys = {
        api.key_for(b, api.make_context("tiny-llama", "inductor", mode=m)[1]).key
        for m in (None, "max-autotune")
    }
    assert len(keys) == 2
    with pytest.raises(BackendError, match="needs --device cuda") as ei:
        api.make_context("tiny-llama", "inductor", mode="reduce-overhead")
    assert "\n" not in str(ei.value)
    with pytest.raises(BackendError, match="unknown inductor mode"):
        api.make_context("tiny-llama", "inductor", mode="fast")


def test_the_prompt_passes_compile_without_pad_mm(monkeypatch, tmp_path: Path):
    """Both warm paths compile prefill and extend with shape_padding off: on CUDA,
    pad_mm's guard on the token count broke builds with an unaligned dimension
    (pass_options says why); decode, of one static shape, keeps Inductor's default."""
    from artifactcache.models import build_model

    seen: list[dict] = []

    def record(fn, args, options):
        seen.append(options)
        return lambda *a: None

    monkeypatch.setattr(compiling, "aot_compile_step", record)
    monkeypatch.setattr(compiling, "save_compiled_step", lambda c, p: p.write_bytes(b"x"))
    rec = load_recipe("tiny-llama")
    model = build_model(rec)
    compiling.save_aot_steps(model, BuildChoices(device="cpu"), rec, torch.device("cpu"), tmp_path)
    assert len(seen) == len(inductor.STEPS)
    for step, options in zip(inductor.STEPS, seen, strict=True):
        assert options.get("shape_padding") is (None if step == "decode" else False), step
    assert compiling.pass_options({})["shape_padding"] is False  # the megacache path's passes
