"""Decode reads the KV cache up to its length bucket, on every torch backend and ort.

A tiny Llama with a 1024-position cache (buckets 256, 512, 768, 1024): decode steps
that cross bucket boundaries give the logits of eager's full forward, the torch
backends' compiled decode step is called with the short ``kv_pos``, and NaN written
past the bucket before each step changes nothing (a step that read it would return
NaN). A second process loads the one dynamic decode step without compiling, also
when generation moves to a new bucket. The compiled backends' entries also take
test_generate_prefill's 300-token prompt (its static passes of 16 are this recipe's).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest
import torch
from _backend_util import (
    NO_AOT_COMPILE_ENV,
    kernel_compiles,
    load_in_child,
    private_dir,
    rel_err,
    runner_cache,
)
from _generate_util import (
    assert_prompt_gives_the_full_forward,
    full_forward,
    write_recipe,
)

from artifactcache import api
from artifactcache.kv_buckets import kv_bucket
from artifactcache.recipes import load_recipe

MAX_SEQ_LEN = 1024
# Each request's decode steps cross a bucket boundary: 256 -> 512 and 768 -> 1024.
PROMPT_LENS = (250, 762)
N_NEW = 12

BACKENDS = [
    "eager",
    pytest.param(
        "ort",
        marks=pytest.mark.skipif(
            importlib.util.find_spec("onnxruntime") is None, reason="needs onnxruntime"
        ),
    ),
    pytest.param("inductor", marks=pytest.mark.slow),
    pytest.param("aoti", marks=pytest.mark.slow),
]


def prompt_of(n: int) -> list[int]:
    return [(7 * i + 11) % 32000 for i in range(n)]


@pytest.fixture(scope="module")
def long_recipe(tmp_path_factory) -> Path:
    return write_recipe(
        tmp_path_factory.mktemp("recipes"), max_seq_len=MAX_SEQ_LEN, prefill_len=16,
        max_positions=MAX_SEQ_LEN,
    )  # fmt: skip


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    return private_dir(tmp_path_factory, "kv-len")


@pytest.fixture(scope="module")
def runners(root: Path):
    return runner_cache(root)


def _caches(runner: Any) -> list[Any]:
    """The KV caches the torch backends' steps read: their model's own buffers."""
    keep = runner.keepalive
    model = keep[0] if isinstance(keep, tuple) else keep
    return [layer.self_attn.kv_cache for layer in model.model.layers]


def _observed(runner: Any, in_place: bool, seen: list) -> Any:
    """The runner's decode step, recording (position, kv_pos length, logits) per call;
    with ``in_place`` (a torch backend's own cache buffers), NaN fills the cache past
    kv_pos during the call."""
    step = runner.decode_step
    caches = _caches(runner) if in_place else []

    def observed(*inputs: torch.Tensor) -> Any:
        n = inputs[3].shape[0]  # (idx, pos, row_start, kv_pos)
        for c in caches:
            c.k_cache[:, :, n:] = float("nan")
            c.v_cache[:, :, n:] = float("nan")
        out = step(*inputs)
        logits = out[0] if isinstance(out, (list, tuple)) else out
        seen.append((int(inputs[1][0]), n, logits[0, -1].float().clone()))
        for c in caches:  # a later prefill reads the whole cache: leave it finite
            c.k_cache[:, :, n:] = 0
            c.v_cache[:, :, n:] = 0
        return out

    return observed


@pytest.mark.parametrize("backend", BACKENDS)
def test_decode_across_buckets_gives_the_full_forward(backend: str, long_recipe, runners):
    recipe = load_recipe(long_recipe)
    runner = runners(str(long_recipe), backend)
    in_place = backend != "ort"  # ort's cache is its graph's input, not a model buffer
    plain = runner.decode_step
    for n in PROMPT_LENS:
        seen: list = []
        runner.decode_step = _observed(runner, in_place, seen)
        try:
            prompt = prompt_of(n)
            new = runner.generate(prompt, N_NEW, eos_token_ids=())
        finally:
            runner.decode_step = plain
        want = full_forward(recipe, prompt + new)
        assert [pos for pos, _, _ in seen] == list(range(n, n + N_NEW - 1))
        got = torch.stack([logits for _, _, logits in seen])
        assert torch.isfinite(got).all()
        assert rel_err(got, want[n : n + N_NEW - 1]) <= 1e-4
        lengths = [length for _, length, _ in seen]
        assert lengths == [kv_bucket(pos + 1, MAX_SEQ_LEN) for pos, _, _ in seen]
        assert len(set(lengths)) == 2  # the request crossed a bucket boundary


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["inductor", "aoti"])
def test_a_300_token_prompt_gives_the_full_forward(backend: str, long_recipe, runners):
    """test_generate_prefill.py's check of its eager and ort runners, for the compiled
    backends on this module's entries: passes of 16 (a static token count), 19 of them
    through the steps that read the cache, the last padded; then greedy decode."""
    recipe = load_recipe(long_recipe)
    assert_prompt_gives_the_full_forward(
        runners(str(long_recipe), backend), recipe, prompt_of(300), 8
    )


def _eager_ids(runners, long_recipe: Path, prompt: list[int]) -> list[int]:
    return runners(str(long_recipe), "eager").generate(prompt, N_NEW)


def _child_env(tmp_path: Path) -> dict[str, str]:
    return {
        "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"),  # fresh and empty
        "TRITON_CACHE_DIR": str(tmp_path / "triton"),
        "TORCHINDUCTOR_COMPILE_THREADS": "1",  # compiles happen in-process, where we count
    }


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["inductor", "aoti"])
def test_a_second_process_decodes_every_bucket_without_compiling(
    backend: str, long_recipe: Path, root: Path, runners, tmp_path: Path
):
    prompt = prompt_of(PROMPT_LENS[0])
    want = _eager_ids(runners, long_recipe, prompt)
    runners(str(long_recipe), backend)  # built into root
    report = load_in_child(root, str(long_recipe), backend, prompt, N_NEW, _child_env(tmp_path))
    assert report["ids"] == want
    assert kernel_compiles(report) == []
    counters = report["counters"]
    if backend == "inductor":
        assert "stats" not in counters, counters["stats"]  # Dynamo traced nothing
    else:
        assert counters.get("inductor", {}) == {}


@pytest.mark.slow
def test_the_megacache_path_warms_one_dynamic_decode(
    long_recipe: Path, runners, tmp_path: Path, monkeypatch
):
    """Where torch cannot save compiled functions: Dynamo traces again in the
    warm process, every graph hits the FX-graph cache, and a new bucket recompiles nothing."""
    prompt = prompt_of(PROMPT_LENS[0])
    want = _eager_ids(runners, long_recipe, prompt)
    monkeypatch.delattr(torch.compiler, "load_compiled_function")
    root = tmp_path / "cache"
    root.mkdir(mode=0o700)
    assert api.build(str(long_recipe), "inductor", cache_dir=root).entry.meta["warm_path"] == (
        "megacache"
    )
    env = {**_child_env(tmp_path), NO_AOT_COMPILE_ENV: "1"}
    report = load_in_child(root, str(long_recipe), "inductor", prompt, N_NEW, env)
    assert report["ids"] == want
    assert kernel_compiles(report) == []
    ind = report["counters"].get("inductor", {})
    assert ind.get("fxgraph_cache_miss", 0) == 0 and ind.get("fxgraph_cache_hit", 0) >= 3
    # The first pass, extend and one decode: the second bucket traced no fourth graph.
    assert report["counters"]["stats"]["unique_graphs"] == 3


def test_a_padded_batch_reads_only_its_bucket(long_recipe: Path):
    """Two left-padded rows (row_start 0 and 10) decode across 256 -> 512 with NaN past
    the bucket: each row's logits are its own sequence's full forward."""
    from artifactcache.backends.shared.runner import StepRunner
    from artifactcache.models import build_model

    recipe = load_recipe(long_recipe).with_shapes(max_batch=2)
    model = build_model(recipe)
    caches = [layer.self_attn.kv_cache for layer in model.model.layers]
    seen: list = []

    def decode(*inputs: torch.Tensor) -> torch.Tensor:
        n = inputs[3].shape[0]
        for c in caches:
            c.k_cache[:, :, n:] = float("nan")
            c.v_cache[:, :, n:] = float("nan")
        out = model(*inputs)
        seen.append((n, out[:, -1].clone()))
        for c in caches:  # the next bucket reads these slots: leave them finite
            c.k_cache[:, :, n:] = 0
            c.v_cache[:, :, n:] = 0
        return out

    runner = StepRunner(recipe, model, decode, torch.device("cpu"), kv_len_hint=True)
    prompts = [prompt_of(250), prompt_of(240)]
    new = runner.generate_batch(prompts, N_NEW, eos_token_ids=())
    assert [n for n, _ in seen] == [256] * 6 + [512] * 5
    for b, (prompt, tokens) in enumerate(zip(prompts, new, strict=True)):
        want = full_forward(load_recipe(long_recipe), prompt + tokens)
        got = torch.stack([logits[b] for _, logits in seen])
        assert rel_err(got, want[len(prompt) : len(prompt) + N_NEW - 1]) <= 1e-4
