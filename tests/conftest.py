"""Shared fixtures. Every test runs with ACACHE_DIR pointed at its own temp dir,
so no test ever touches the user's real cache.

Keep this file small: fixtures that one test module needs live in that module.
"""

from __future__ import annotations

import os
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
