"""aoti: parity with eager, shared constants, architecture keys, and a second process
that loads the unpacked packages without compiling anything.

Parity here is tiny-llama's (static passes of 8: a padded one and a full one, and 32
decode steps); every family on inductor and ort, and four on aoti (AOTI_FAMILIES), is
tests/test_models_families.py's.

Each recipe's two packages take tens of seconds to compile on CPU, so entries are
built once per module into one cache root and shared by the tests.
"""

from __future__ import annotations

import os
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
from artifactcache.errors import BackendError, ShapeError
from artifactcache.measure.coldstart import MODULES_AT_EXIT, NOT_ON_A_WARM_LOAD
from artifactcache.models import WeightsSpec, build_model
from artifactcache.recipes import load_recipe

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[Path, dict]:
    """The module's cache root, its tiny-llama entry built first, serially (the serial
    path builds the model in this process), the model's parameters tracked: what the
    build left behind is taken as soon as it returns, before another export could free
    it (test_build_leaves_no_model_and_no_config_behind)."""
    import gc
    import weakref

    from torch._inductor import config

    from artifactcache.backends.aoti import backend as aoti

    root = private_dir(tmp_path_factory, "aoti-cache")
    refs: list[weakref.ref] = []
    real = aoti.build_model_for

    def tracked(ctx, dev, backend):
        model = real(ctx, dev, backend)
        refs.extend(weakref.ref(p) for p in model.parameters())
        return model

    with pytest.MonkeyPatch.context() as m:
        m.setattr(aoti, "build_model_for", tracked)
        m.setenv("ACACHE_BUILD_JOBS", "1")
        before = config.get_config_copy()
        built_here = api.build("tiny-llama", "aoti", cache_dir=root).built
    gc.collect()
    left = {
        "built": built_here,
        "params": len(refs),
        "alive": sum(r() is not None for r in refs),
        "config_changed": sorted(
            k for k, v in config.get_config_copy().items() if before.get(k) != v
        ),
    }
    return root, left


@pytest.fixture(scope="module")
def root(built) -> Path:
    return built[0]


@pytest.fixture(scope="module")
def runners(root: Path):
    return runner_cache(root)


@pytest.mark.parametrize("name", ["tiny-llama"])
def test_matches_eager(name: str, runners):
    recipe = load_recipe(name)
    eager, aoti = runners(name, "eager"), runners(name, "aoti")
    prompt = list(recipe.bench.prompt_ids)
    full = [(7 * i + 11) % recipe.model.vocab_size for i in range(recipe.shapes.prefill_len)]
    for ids in (prompt, full):
        assert rel_err(aoti.logits(ids), eager.logits(ids)) <= 1e-4
    # Decode reads the KV cache prefill wrote: only true if both runners share it.
    assert aoti.generate(prompt, 32) == eager.generate(prompt, 32)


def test_sampling_and_eos(runners):
    """generate()'s sampling and EOS through the compiled steps of the module's entry
    (tests/test_generate_sampling.py holds eager and the sampler to the same checks)."""
    prompt = list(load_recipe("tiny-llama").bench.prompt_ids)
    assert_sampling_and_eos(runners("tiny-llama", "aoti"), prompt)


def test_batch_rows_equal_each_prompt_run_alone(root: Path, runners):
    """Steps built for max_batch 3 (row_start an input): each row is eager's batch 1."""
    batched = api.load("tiny-mistral", "aoti", cache_dir=root, max_batch=3)
    # 24 new tokens after the 19-token prompt cross tiny-mistral's 16-token window.
    assert_rows_match_alone(batched, runners("tiny-mistral", "eager"), BATCH_PROMPTS[1:], 24)


def test_entry_is_unpacked_and_weight_free(root: Path):
    res = api.build("tiny-llama", "aoti", cache_dir=root)
    path, meta = res.entry.path, res.entry.meta
    assert set(meta["steps"]) == {"prefill", "extend", "decode"}
    for rel in meta["steps"].values():
        assert (path / rel).is_file() and rel.endswith(".so")
    assert not list(path.rglob("*.pt2"))  # nothing left to extract at load
    n_params = sum(p.numel() for p in build_model(load_recipe("tiny-llama")).parameters())
    assert res.bytes < n_params * 4 / 2  # fp32 weights would be ~4 bytes per parameter
    assert res.entry.manifest["arch_key"] == res.key


def test_one_build_serves_other_weights(root: Path, runners, tmp_path: Path):
    """Weight-stripped: a checkpoint of the same architecture hits the same entry."""
    from safetensors.torch import save_file

    recipe = load_recipe("tiny-llama")
    other = build_model(recipe, weights=WeightsSpec(seed=7))
    ckpt = tmp_path / "model.safetensors"
    save_file({k: v.contiguous() for k, v in other.state_dict().items()}, str(ckpt))
    random_key = api.build("tiny-llama", "aoti", cache_dir=root).key
    res = api.build("tiny-llama", "aoti", weights=ckpt, cache_dir=root)
    assert res.key == random_key and not res.built
    prompt = list(recipe.bench.prompt_ids)
    got = runners("tiny-llama", "aoti", ckpt).logits(prompt)
    want = runners("tiny-llama", "eager", ckpt).logits(prompt)
    assert rel_err(got, want) <= 1e-4
    assert rel_err(got, runners("tiny-llama", "aoti").logits(prompt)) > 1e-2


def test_second_process_does_not_compile(root: Path, runners, tmp_path: Path):
    recipe = load_recipe("tiny-llama")  # the module's entry: no build of its own
    prompt = list(recipe.bench.prompt_ids)
    want = runners("tiny-llama", "eager").generate(prompt, 16)
    entry = api.build("tiny-llama", "aoti", cache_dir=root).entry
    before = tree_digest(entry.path)
    fw = tmp_path / "inductor"
    fw.mkdir()
    os.chmod(fw, 0o500)  # empty and read-only: nothing may be generated or extracted here
    env = {
        "TORCHINDUCTOR_CACHE_DIR": str(fw),
        "TRITON_CACHE_DIR": str(tmp_path / "triton"),
        "TORCHINDUCTOR_COMPILE_THREADS": "1",
    }
    # Two passes of 8 (a first pass at slot 0, then a padded extend pass): both pass
    # steps run in a process that compiles nothing.
    two_passes = [(5 * i + 3) % recipe.model.vocab_size for i in range(12)]
    want_two = runners("tiny-llama", "eager").generate(two_passes, 4)
    try:
        report = load_in_child(root, "tiny-llama", "aoti", prompt, 16, env)
        both = load_in_child(root, "tiny-llama", "aoti", two_passes, 4, env)
    finally:
        os.chmod(fw, 0o700)
    assert report["ids"] == want
    assert both["ids"] == want_two
    for r in (report, both):
        assert r["compiles"] == [] and kernel_compiles(r) == []
        assert r["counters"].get("inductor", {}) == {}
    # aoti opens every step at load (a dlopen each): nothing waits for its first use.
    assert report["unopened"] == both["unopened"] == {"at_load": [], "after": []}
    assert os.listdir(fw) == []
    assert tree_digest(entry.path) == before  # loading never writes into the entry


def test_shapes_that_do_not_fit(runners):
    recipe = load_recipe("tiny-llama")
    runner = runners("tiny-llama", "aoti")
    with pytest.raises(ShapeError):
        runner.logits(list(range(1, recipe.shapes.max_seq_len + 2)))
    with pytest.raises(ShapeError):
        runner.generate([1, 2], recipe.shapes.max_seq_len)


def test_logits_are_fresh_each_call(runners):
    runner = runners("tiny-llama", "aoti")
    a = runner.logits([5, 6, 7])
    runner.generate([9, 9, 9, 9], 20)
    assert torch.equal(runner.logits([5, 6, 7]), a)


def test_bad_mode_is_one_line_error():
    with pytest.raises(BackendError, match="unknown aoti mode") as ei:
        api.make_context("tiny-llama", "aoti", mode="reduce-overhead")
    assert "\n" not in str(ei.value)


def test_build_leaves_no_model_and_no_config_behind(built):
    """A cold start builds then loads in one process: the build's weights must go.

    torch.export kept the traced graph (and our model) in a module-level map until
    the next export; on the H200 the cold process peaked at twice the weights.
    """
    _, left = built  # the module's first build, taken as it returned
    assert left["built"] and left["params"] > 0
    assert left["alive"] == 0, f"{left['alive']} of the build's parameters are still alive"
    # AOTI's compile filled config.aot_inductor.metadata in place; left there, it
    # changed the cache keys of every later torch.compile in this process.
    assert not left["config_changed"], (
        f"the build left Inductor config changed: {left['config_changed']}"
    )


# sys.modules at exit, written to argv[1]: `-X importtime` cannot be used to tell,
# since it does not see modules imported with importlib.import_module (the backends).
WARM_LOAD_CHILD = MODULES_AT_EXIT + (
    "import artifactcache\n"
    "r = artifactcache.load('tiny-llama', backend='aoti', cache_dir=sys.argv[1],\n"
    "                       build_on_miss=False)\n"
    "r.generate([1, 15043, 29892], 2)\n"
)
CLI_CHILD = MODULES_AT_EXIT + (
    "import runpy\n"
    "sys.argv[0] = 'acache'\n"
    "runpy.run_module('artifactcache.cli', run_name='__main__')\n"
)


def _imported_by(code: str, args: list[str], root: Path, tmp_path: Path) -> set[str]:
    """Every module in sys.modules when a fresh ``python -c CODE ARGS`` process exits."""
    import json
    import subprocess
    import sys

    out = tmp_path / "modules.json"
    env = {**os.environ, "ACACHE_DIR": str(root), "PYTHONPATH": str(Path(__file__).parents[1])}
    p = subprocess.run([sys.executable, "-c", code, str(out), *args], capture_output=True,
                       text=True, env=env, timeout=600)  # fmt: skip
    assert p.returncode == 0, p.stderr[-3000:]
    return set(json.loads(out.read_text()))


@pytest.mark.parametrize("how", ["load", "cli"])
def test_a_warm_load_imports_no_compiler_stack(how: str, root: Path, tmp_path: Path):
    """A warm start pays for ``import torch`` and acache's own modules, nothing heavier
    (docs/perf-notes.md, "acache's share of a warm start's imports")."""
    api.build("tiny-llama", "aoti", cache_dir=root)  # the entry the children load (or a hit)
    if how == "load":
        seen = _imported_by(WARM_LOAD_CHILD, [str(root)], root, tmp_path)
    else:
        args = ["run", "tiny-llama", "--backend", "aoti", "--cache-dir", str(root),
                "--max-new-tokens", "2"]  # fmt: skip
        seen = _imported_by(CLI_CHILD, args, root, tmp_path)
    assert "artifactcache.backends.aoti.backend" in seen  # the child really loaded through aoti
    assert sorted(m for m in NOT_ON_A_WARM_LOAD if m in seen) == []
