"""Shared fixtures. Every test runs with ACACHE_DIR pointed at its own temp dir,
so no test ever touches the user's real cache.

Keep this file small: fixtures that one test module needs live in that module.
"""

from __future__ import annotations

import os
import sys
import types

import pytest


def pytest_collection_modifyitems(config, items):
    """Mark ``torch_release`` every test of a module that holds torch or Triton itself.

    Such a module calls torch's (or Triton's) own APIs, so its outcome can change with
    their release; CI runs these tests again on the newest torch (.ci/run). A module that
    imports neither reaches torch only through acache's code, which the compile tests
    (inductor, aoti, torch_private) already cover on both releases.
    """
    for item in items:
        module = getattr(item, "module", None)
        if any(isinstance(vars(module).get(n), types.ModuleType) for n in ("torch", "triton")):
            item.add_marker(pytest.mark.torch_release)


@pytest.fixture(autouse=True)
def _torch_state_restored():
    """Put back, after each test, the process-wide torch settings that Inductor's FX-graph
    cache key holds (the fp32 matmul precision switches, the default dtype, the intra-op
    thread count). One test leaving one changed made every later build in the same
    process (a pytest-xdist worker runs many modules) key its graphs differently from
    the fresh child process that loads them warm, which then missed the cache.
    tests/_backend_util.matmul_precision_kept is what a test that changes them uses."""
    torch = sys.modules.get("torch")
    if torch is None:  # a test module that never imports torch cannot change it
        yield
        return
    from _backend_util import matmul_precision_kept

    dtype, threads = torch.get_default_dtype(), torch.get_num_threads()
    with matmul_precision_kept():
        yield
    if torch.get_default_dtype() != dtype:
        torch.set_default_dtype(dtype)
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory, monkeypatch):
    root = tmp_path_factory.mktemp("acache")
    os.chmod(root, 0o700)
    monkeypatch.setenv("ACACHE_DIR", str(root))
    monkeypatch.delenv("ACACHE_REMOTE", raising=False)
    monkeypatch.delenv("ACACHE_ALLOW_SHARED_ROOT", raising=False)
    yield root


@pytest.fixture
def cache_dir(_isolated_cache):
    return _isolated_cache
