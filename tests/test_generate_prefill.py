"""Prompts of any length up to the context: chunked prefill through the compiled step."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from _backend_util import private_dir, rel_err, runner_cache
from _generate_util import (
    assert_prompt_gives_the_full_forward,
    full_forward,
    naive_greedy,
    write_recipe,
)
from typer.testing import CliRunner

from artifactcache.errors import ShapeError
from artifactcache.generate import PAD_ID, chunk_len_range, left_pad, plan_chunks
from artifactcache.recipes import load_recipe

PROMPT = [(7 * i + 11) % 32000 for i in range(300)]
N_NEW = 8

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
EAGER_AND_ORT = BACKENDS[:2]


@pytest.fixture(scope="module")
def long_recipe(tmp_path_factory) -> Path:
    return write_recipe(tmp_path_factory.mktemp("recipes"), max_seq_len=320, prefill_len=16)


@pytest.fixture(scope="module")
def passes_recipe(tmp_path_factory) -> Path:
    """Passes of 16 .. 64 tokens: the steps' token count is a dynamic dimension."""
    return write_recipe(
        tmp_path_factory.mktemp("recipes"), name="passes", max_seq_len=320, prefill_len=64
    )


@pytest.fixture(scope="module")
def runners(tmp_path_factory):
    return runner_cache(private_dir(tmp_path_factory, "generate-prefill"))


def test_chunks_cover_the_prompt_once_and_pad_the_last():
    ids = list(range(1, 20))
    chunks = plan_chunks(ids, 8, 64)
    assert [c.start for c in chunks] == [0, 8, 16]
    assert all(len(c.ids) == 8 for c in chunks)
    assert chunks[-1].ids == (17, 18, 19, 0, 0, 0, 0, 0) and chunks[-1].keep == (0, 3)
    kept = [t for c in chunks for t in c.ids[c.keep[0] : c.keep[1]]]
    assert kept == ids


def test_a_last_chunk_past_the_cache_end_overlaps_instead_of_padding():
    ids = list(range(1, 21))  # 20 tokens, cache of 20, chunks of 8: 16 + 8 > 20
    chunks = plan_chunks(ids, 8, 20)
    assert [c.start for c in chunks] == [0, 8, 12]
    assert chunks[-1].ids == tuple(range(13, 21)) and chunks[-1].keep == (4, 8)
    assert max(c.start + len(c.ids) for c in chunks) <= 20
    kept = [t for c in chunks for t in c.ids[c.keep[0] : c.keep[1]]]
    assert kept == ids


def test_passes_are_as_long_as_their_tokens_and_at_least_16():
    ids = list(range(1, 151))  # 150 tokens through passes of up to 64
    chunks = plan_chunks(ids, 64, 320)
    assert [(c.start, len(c.ids), c.keep) for c in chunks] == [
        (0, 64, (0, 64)), (64, 64, (0, 64)), (128, 22, (0, 22)),
    ]  # fmt: skip
    assert [len(c.ids) for c in plan_chunks([5] * 40, 64, 320)] == [40]  # ends on a token
    assert [(len(c.ids), c.keep) for c in plan_chunks([5] * 70, 64, 320)] == [
        (64, (0, 64)), (16, (0, 6)),
    ]  # fmt: skip
    assert [len(c.ids) for c in plan_chunks([5] * 6, 64, 320)] == [16]  # not 64
    assert chunk_len_range(64) == (16, 64) and chunk_len_range(16) is None
    assert [len(c.ids) for c in plan_chunks([5] * 6, 8, 320)] == [8]  # static T


def test_a_pass_past_the_cache_end_ends_at_the_prompt_instead():
    ids = list(range(1, 71))  # 64 + 6 -> a pass of 16 at 64 would end at 80 > 70
    chunks = plan_chunks(ids, 64, 70)
    assert [(c.start, len(c.ids), c.keep) for c in chunks] == [(0, 64, (0, 64)), (54, 16, (10, 16))]
    kept = [t for c in chunks for t in c.ids[c.keep[0] : c.keep[1]]]
    assert kept == ids


def test_a_prompt_of_exactly_prefill_len_is_one_chunk():
    chunks = plan_chunks(list(range(8)), 8, 8)
    assert len(chunks) == 1 and chunks[0].keep == (0, 8)


@pytest.mark.parametrize("backend", EAGER_AND_ORT)
def test_a_300_token_prompt_gives_the_full_forward(backend, long_recipe, runners):
    """Passes of 16 (a static token count): 19 of them, the last padded. The compiled
    backends' check is test_backends_shared_runner_kv_len.py's, on the entries that
    module builds of a recipe with the same passes."""
    recipe = load_recipe(long_recipe)
    assert_prompt_gives_the_full_forward(runners(str(long_recipe), backend), recipe, PROMPT, N_NEW)


@pytest.mark.parametrize("backend", BACKENDS)
def test_passes_of_any_length_give_the_full_forward(backend, passes_recipe, runners):
    """One step serves every pass length (16 .. 64): logits() runs every pass through the
    steps that read the cache (the causal first pass returns its last row only: the next
    test), against one masked forward of the whole prompt; generate's greedy tokens go
    through the causal first pass."""
    recipe = load_recipe(passes_recipe)
    runner = runners(str(passes_recipe), backend)
    for n in (6, 40, 64, 150, 300):
        ids = PROMPT[:n]
        assert rel_err(runner.logits(ids), full_forward(recipe, ids)) <= 1e-4, n
    assert runner.generate(PROMPT[:150], N_NEW) == naive_greedy(recipe, PROMPT[:150], N_NEW)


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_causal_first_pass_gives_the_last_positions_logits(backend, passes_recipe, runners):
    """generate's prefill takes the causal first pass, which returns its last position's
    logits alone (a prompt of >= 16 tokens, or a longer one's first pass); checked against
    one masked forward of the whole prompt, which logits() also takes."""
    recipe = load_recipe(passes_recipe)
    runner = runners(str(passes_recipe), backend)
    for n in (16, 40, 64, 150):
        ids = PROMPT[:n]
        last, _ = runner._prefill([ids], all_rows=False)
        want = full_forward(recipe, ids)[-1]
        assert last.shape[-1] == recipe.model.vocab_size
        assert rel_err(last[0].float().cpu(), want) <= 1e-4, n


def test_the_serving_model_returns_a_first_pass_last_row_only():
    import torch

    from artifactcache.models import build_model

    model = build_model(load_recipe("tiny-llama"))
    ids = torch.tensor([PROMPT[:12]])
    every = model(ids, torch.arange(12))
    assert every.shape[:2] == (1, 12)  # a direct call keeps every position
    model.first_pass_last_logits = True
    last = model(ids, torch.arange(12))
    assert last.shape[:2] == (1, 1)
    assert torch.allclose(last[0, 0], every[0, -1], atol=1e-5)  # one row, not twelve: blocking
    masked = model(ids, torch.arange(12), torch.zeros(1, dtype=torch.long))
    assert masked.shape[:2] == (1, 12)  # the masked path is not a first pass


@pytest.mark.slow
def test_a_warm_inductor_process_compiles_nothing_for_a_new_pass_length(
    passes_recipe, tmp_path: Path, monkeypatch
):
    """The Mega-Cache path (a torch without saved compiled functions) traces the steps
    with Dynamo at load: pass lengths other than the one compiled at hit the dynamic token
    dimension's graph."""
    from torch._dynamo.utils import counters

    from artifactcache import api

    monkeypatch.setenv("ACACHE_INDUCTOR_WARM_PATH", "megacache")
    runner = api.load(passes_recipe, "inductor", cache_dir=tmp_path / "cache")
    graphs = counters["stats"]["unique_graphs"]
    for n in (6, 40, 64, 150):
        runner.generate(PROMPT[:n], 2)
    assert counters["stats"]["unique_graphs"] == graphs


@pytest.mark.parametrize("backend", ["eager", pytest.param("aoti", marks=pytest.mark.slow)])
def test_a_left_padded_batch_runs_through_the_passes_that_read_the_cache(
    backend, passes_recipe, tmp_path: Path
):
    """Prompts of 150 and 40 tokens in one batch: the rows are left-padded, so even the
    first pass reads the cache through the mask (no causal first pass)."""
    from artifactcache import api

    recipe = load_recipe(passes_recipe)
    runner = api.load(passes_recipe, backend, max_batch=2, cache_dir=tmp_path / "cache")
    prompts = [PROMPT[:150], PROMPT[:40]]
    for got, ids in zip(runner.logits_batch(prompts), prompts, strict=True):
        assert rel_err(got, full_forward(recipe, ids)) <= 1e-4
    out = runner.generate_batch(prompts, N_NEW, eos_token_ids=())
    assert out == [naive_greedy(recipe, ids, N_NEW) for ids in prompts]


def test_a_prompt_that_fills_the_cache_to_its_last_slot(tmp_path: Path, runners):
    """max_seq_len 310 is no multiple of 16: the last chunk overlaps the one before."""
    path = write_recipe(tmp_path, name="fills", max_seq_len=310, prefill_len=16)
    recipe = load_recipe(path)
    ids = PROMPT + list(range(100, 110))
    got = runners(str(path), "eager").logits(ids)
    assert rel_err(got, full_forward(recipe, ids)) <= 1e-4


def test_a_prompt_past_the_context_is_refused_in_one_line(long_recipe, runners):
    runner = runners(str(long_recipe), "eager")
    with pytest.raises(ShapeError, match="300 prompt \\+ 21 new tokens = 321 exceeds max_seq_len"):
        runner.generate(PROMPT, 21)
    with pytest.raises(ShapeError, match="exceeds max_seq_len 320"):
        runner.logits(PROMPT + PROMPT[:21])


def test_cli_refuses_a_prompt_past_the_context_before_building(long_recipe, tmp_path: Path):
    from artifactcache.cli.app import app

    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    tokens = ",".join(str(t) for t in PROMPT)
    r = CliRunner().invoke(
        app,
        ["run", str(long_recipe), "--tokens", tokens, "--max-new-tokens", "21",
         "--cache-dir", str(cache)],
    )  # fmt: skip
    assert r.exit_code == 1
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: 300 prompt + 21 new tokens")
    assert list(cache.rglob("manifest.json")) == []  # nothing built


def test_left_pad_aligns_every_prompt_to_the_longest_and_fills_the_rows():
    rows, starts = left_pad([[5, 6, 7], [8], [9, 10]], 5)
    assert rows == [
        [5, 6, 7],
        [PAD_ID, PAD_ID, 8],
        [PAD_ID, 9, 10],
        [PAD_ID] * 3,  # filler rows up to the steps' static batch
        [PAD_ID] * 3,
    ]
    assert starts == [0, 2, 1, 0, 0]
    assert left_pad([[1, 2]], 1) == ([[1, 2]], [0])
