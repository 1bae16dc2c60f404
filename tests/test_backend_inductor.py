"""inductor: parity with eager for every tiny recipe, and a warm second process.

Compiling is slow on CPU (tens of seconds per recipe), so entries are built once
per module into one cache root and shared by the tests.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from _backend_util import (
    TINY,
    kernel_compiles,
    load_in_child,
    private_dir,
    rel_err,
    runner_cache,
    tree_digest,
)

from artifactcache import api
from artifactcache.backends.base import get_backend
from artifactcache.errors import BackendError, ShapeError
from artifactcache.recipes import load_recipe

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    return private_dir(tmp_path_factory, "inductor-cache")


@pytest.fixture(scope="module")
def runners(root: Path):
    """(recipe, backend) -> Runner, built on first use (build-on-miss, then warm load)."""
    return runner_cache(root)


@pytest.mark.parametrize("name", TINY)
def test_matches_eager(name: str, runners):
    recipe = load_recipe(name)
    eager, compiled = runners(name, "eager"), runners(name, "inductor")
    prompt = list(recipe.bench.prompt_ids)
    full = [(7 * i + 11) % recipe.model.vocab_size for i in range(recipe.shapes.prefill_len)]
    for ids in (prompt, full):
        assert rel_err(compiled.logits(ids), eager.logits(ids)) <= 1e-4
    assert compiled.generate(prompt, 32) == eager.generate(prompt, 32)


def test_entry_holds_megacache_and_kernels(root: Path):
    res = api.build("tiny-llama", "inductor", cache_dir=root)
    meta = res.entry.meta
    assert (res.entry.path / "megacache.bin").stat().st_size == meta["megacache_bytes"] > 0
    assert meta["cache_artifacts"].get("inductor", 0) >= 2  # the prefill and decode graphs
    # On CPU the Mega-Cache holds C++ source only; the entry carries the objects.
    assert meta["kernels"] and all(
        (res.entry.path / "kernels" / k).is_file() for k in meta["kernels"]
    )


def test_second_process_does_not_compile(runners, tmp_path: Path):
    recipe = load_recipe("tiny-llama")
    prompt = list(recipe.bench.prompt_ids)
    want = runners("tiny-llama", "eager").generate(prompt, 16)
    # Built by `acache build` in its own process, as users build. (Builds after an
    # aoti build in one process are covered by test_backend_aoti's config check.)
    root = tmp_path / "cache"
    root.mkdir(mode=0o700)
    subprocess.run(
        [sys.executable, "-m", "artifactcache.cli", "build", "tiny-llama", "-b", "inductor",
         "--cache-dir", str(root)],
        check=True, capture_output=True, env={**os.environ, "TORCHINDUCTOR_CACHE_DIR":
        str(tmp_path / "build-inductor")},
    )  # fmt: skip
    entry = api.build("tiny-llama", "inductor", cache_dir=root).entry  # a hit: the entry
    before = tree_digest(entry.path)
    env = {
        "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"),  # fresh and empty
        "TRITON_CACHE_DIR": str(tmp_path / "triton"),
        "TORCHINDUCTOR_COMPILE_THREADS": "1",  # compiles happen in-process, where we count
    }
    report = load_in_child(root, "tiny-llama", "inductor", prompt, 16, env)
    assert report["ids"] == want
    assert kernel_compiles(report) == []
    ind, aot = report["counters"].get("inductor", {}), report["counters"].get("aot_autograd", {})
    assert ind.get("fxgraph_cache_hit", 0) == 2 and ind.get("fxgraph_cache_miss", 0) == 0
    assert aot.get("autograd_cache_hit", 0) == 2 and aot.get("autograd_cache_miss", 0) == 0
    assert {"cache_loaded", "artifact_ready", "weights_ready"} <= set(report["phases"])
    assert tree_digest(entry.path) == before  # load never writes into the entry


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
