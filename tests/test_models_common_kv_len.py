"""models/common.py: the KV-length buckets, and a forward that reads only its bucket."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from _generate_util import full_forward, write_recipe

from artifactcache.code_factors import acache_factors
from artifactcache.kv_buckets import (
    KV_BUCKET_MIN,
    cache_slots,
    kv_bucket,
    kv_buckets,
    kv_len_range,
)
from artifactcache.models import build_model
from artifactcache.recipes import load_recipe


def test_buckets_cover_the_filled_length_and_stop_at_the_cache():
    for s in (64, 256, 1000, 4096, 32768):
        prev = 0
        for n in range(1, s + 1, 7):
            b = kv_bucket(n, s)
            assert n <= b <= s and b >= prev  # enough, never past the cache, monotone
            prev = b
        assert kv_bucket(s, s) == s


def test_a_bucket_reads_at_most_a_step_or_an_eighth_more_than_is_filled():
    for n in range(1, 40000, 13):
        b = kv_bucket(n, 1 << 16)
        assert b - n < max(KV_BUCKET_MIN, n / 8)


def test_the_bucket_lists():
    assert kv_buckets(4096) == list(range(256, 4097, 256))  # the 7B seed at 4096: 16 graphs
    assert len(kv_buckets(32768)) == 40
    assert kv_buckets(1000) == [256, 512, 768, 1000]
    assert kv_buckets(256) == [256] and kv_buckets(64) == [64]
    assert kv_len_range(1024) == (256, 1024)
    assert kv_len_range(256) is None and kv_len_range(64) is None


def test_a_spare_slot_only_where_the_read_length_varies():
    assert cache_slots(1024) == 1025 and cache_slots(256) == 256
    model = build_model(load_recipe("tiny-llama"))  # max_seq_len 64: one bucket
    assert model.model.layers[0].self_attn.kv_cache.k_cache.shape[2] == 64


@pytest.fixture(scope="module")
def long_recipe(tmp_path_factory) -> Path:
    return write_recipe(
        tmp_path_factory.mktemp("recipes"), max_seq_len=1024, prefill_len=16, max_positions=1024
    )


def test_decode_reads_only_its_bucket(long_recipe: Path):
    """NaN past the bucket: a step that read it would return NaN (0 x NaN is NaN)."""
    recipe = load_recipe(long_recipe)
    model = build_model(recipe)
    ids = [(7 * i + 11) % 32000 for i in range(300)]
    want = full_forward(recipe, ids)[-1]
    caches = [layer.self_attn.kv_cache for layer in model.model.layers]
    with torch.no_grad():
        model(torch.tensor([ids[:-1]]), torch.arange(299))
        bucket = kv_bucket(300, 1024)
        assert bucket == 512
        for c in caches:
            c.k_cache[:, :, bucket:] = float("nan")
            c.v_cache[:, :, bucket:] = float("nan")
        kv_pos = torch.arange(1024)[:bucket]
        got = model(torch.tensor([[ids[-1]]]), torch.tensor([299]), kv_pos=kv_pos)
    got = got[0, -1]
    assert torch.isfinite(got).all()
    assert ((got - want).abs().max() / want.abs().max()).item() <= 1e-5
    # The whole-cache read (row_start, no kv_pos) is what the NaN would reach.
    with torch.no_grad():
        row_start = torch.zeros(1, dtype=torch.long)
        whole = model(torch.tensor([[ids[-1]]]), torch.tensor([299]), row_start)
    assert torch.isnan(whole).all()


def test_every_backend_key_covers_the_bucket_scheme():
    """The buckets live in models/common.py, which every backend's code digest covers."""
    module = kv_bucket.__module__.removeprefix("artifactcache.")
    for backend in ("eager", "inductor", "aoti", "ort", "trt"):
        sources = acache_factors(backend)["source"]
        assert any(module == s or module.startswith(s + ".") for s in sources), backend
