"""backends/inductor/triton_key.py: Triton's key hashed on a thread."""

from __future__ import annotations

import sys

import pytest

from artifactcache.backends.inductor.triton_key import prefetch_triton_key


def test_triton_key_is_prefetched_into_tritons_own_memo():
    cache = pytest.importorskip("triton.runtime.cache", reason="Triton is not installed")
    cache.triton_key.cache_clear()
    thread = prefetch_triton_key()
    assert thread is not None
    thread.join(120)
    assert not thread.is_alive()
    info = cache.triton_key.cache_info()
    assert (info.misses, info.currsize) == (1, 1)  # computed once, on the thread
    assert cache.triton_key() and cache.triton_key.cache_info().hits == 1


def test_without_triton_nothing_is_prefetched(monkeypatch):
    monkeypatch.setitem(sys.modules, "triton.runtime.cache", None)  # import fails
    assert prefetch_triton_key() is None


def test_a_cuda_inductor_load_starts_the_triton_key_before_the_device():
    """The hash runs beside the CUDA context and the weights, not after them."""
    import inspect

    from artifactcache.backends.inductor import backend

    src = inspect.getsource(backend.InductorBackend.load)
    assert src.index("prefetch_triton_key()") < src.index("device_of(")
