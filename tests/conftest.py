"""Shared fixtures. Every test runs with ACACHE_DIR pointed at its own temp dir,
so no test ever touches the user's real cache.

Keep this file small: fixtures that one test module needs live in that module.
"""

from __future__ import annotations

import os

import pytest


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
