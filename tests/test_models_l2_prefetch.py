"""models/l2_prefetch.py: the decode kernel's prefetch plan and where it runs (the
kernel's own tests are tests/test_models_decode_attention.py's)."""

from __future__ import annotations

import pytest
import torch

from artifactcache.models import l2_prefetch as pf


def test_the_plan_takes_whole_chunks_of_at_most_the_weight():
    chunk, threads = pf.PREFETCH_CHUNK, pf.PREFETCH_THREADS
    assert pf.plan(16 << 20, 64 << 20, 1) == pf.Prefetch(1, (16 << 20) // chunk)
    assert pf.plan(16 << 20, 64 << 20, 1).programs == (16 << 20) // chunk // threads
    assert pf.plan(16 << 20, 3 * chunk + 7, 1) == pf.Prefetch(1, 3)
    assert pf.plan(16 << 20, 3 * chunk, 1).programs == 1
    assert pf.plan(chunk - 1, 64 << 20, 1).programs == 0  # less than a chunk
    assert pf.plan(16 << 20, 64 << 20, 0).programs == 0  # no instruction here
    assert pf.plan(16 << 20, 64 << 20, 1, threads=256).programs == (16 << 20) // chunk // 256


def test_the_chunk_is_what_the_bulk_prefetch_takes():
    assert pf.PREFETCH_CHUNK % 16 == 0 and pf.PREFETCH_CHUNK % 128 == 0  # lines too
    assert pf.PREFETCH_BY in (1, 3)


def test_the_mode_is_the_interpreters_stand_in_or_none_off_the_gpu(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert pf.mode(torch.device("cpu")) == 2
    monkeypatch.delenv("TRITON_INTERPRET")
    assert pf.mode(torch.device("cpu")) == 0


@pytest.mark.parametrize(("capability", "want"), [((9, 0), pf.PREFETCH_BY), ((8, 0), 0)])
def test_only_sm_90_and_later_prefetch(monkeypatch, capability, want):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    assert pf.mode(torch.device("cuda", 0)) == want
