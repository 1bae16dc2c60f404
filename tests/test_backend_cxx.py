"""The aoti compiler choice and the C++ runtime guard (backends/cxx.py)."""

from __future__ import annotations

import shutil

import pytest

from artifactcache.backends import cxx
from artifactcache.errors import BackendError


def test_user_cxx_wins(monkeypatch):
    monkeypatch.setenv("CXX", "/opt/my/g++")
    assert cxx.choose_cxx() == "/opt/my/g++"


@pytest.mark.skipif(shutil.which("g++") is None, reason="no g++ on this machine")
def test_choice_links_the_loaded_runtime(monkeypatch):
    import torch  # noqa: F401  (maps libstdc++ into this process, as a real load does)

    monkeypatch.delenv("CXX", raising=False)
    loaded = cxx.loaded_libstdcxx()
    assert loaded and "libstdc++" in loaded
    chosen = cxx.choose_cxx()
    assert chosen is not None
    assert cxx.compiler_libstdcxx(shutil.which(chosen)) == loaded
    assert cxx.build_record(chosen)["libstdcxx"] == loaded


def test_mismatched_runtime_is_a_one_line_error(monkeypatch):
    import torch  # noqa: F401

    monkeypatch.delenv("LD_PRELOAD", raising=False)
    meta = {"cxx": "/opt/gcc/bin/g++", "libstdcxx": "/opt/gcc/lib64/libstdc++.so.6.0.34"}
    with pytest.raises(BackendError) as e:
        cxx.check_runtime(meta)
    msg = str(e.value)
    assert "\n" not in msg and "LD_PRELOAD=" in msg and "--force" in msg


def test_matching_or_preloaded_runtime_passes(monkeypatch):
    import torch  # noqa: F401

    loaded = cxx.loaded_libstdcxx()
    cxx.check_runtime({"libstdcxx": loaded})  # same runtime
    cxx.check_runtime({})  # entries from before the record existed
    monkeypatch.setenv("LD_PRELOAD", "/usr/lib/x86_64-linux-gnu/libstdc++.so.6")
    cxx.check_runtime({"libstdcxx": "/elsewhere/libstdc++.so.6.0.99"})


def test_missing_compiler_is_a_one_line_cli_error(monkeypatch):
    from typer.testing import CliRunner

    from artifactcache.cli.app import app

    monkeypatch.setenv("CXX", "/nonexistent/g++")
    for backend in ("inductor", "aoti"):
        res = CliRunner().invoke(app, ["build", "tiny-llama", "--backend", backend])
        assert res.exit_code == 1
        lines = res.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and "install g++" in lines[0]
