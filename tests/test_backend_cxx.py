"""The aoti compiler choice and the C++ runtime guard (backends/cxx.py)."""

from __future__ import annotations

import shutil

import pytest
from _backend_util import CRASHING_PROBE, fake_cxx

from artifactcache.backends import cxx
from artifactcache.errors import BackendError

HAS_GXX = shutil.which("g++") is not None


@pytest.mark.skipif(not HAS_GXX, reason="no g++ on this machine")
def test_user_cxx_wins_when_its_code_runs(monkeypatch, tmp_path):
    import torch  # noqa: F401

    mine = fake_cxx(tmp_path, "my-g++", 'extern "C" int acache_regex_probe(void){return 0;}')
    monkeypatch.setenv("CXX", mine)
    assert cxx.choose_cxx() == mine
    assert cxx.rejected_compilers() == []


@pytest.mark.skipif(not HAS_GXX, reason="no g++ on this machine")
def test_user_cxx_whose_code_crashes_is_skipped(monkeypatch, tmp_path):
    """The GPU image's case: $CXX builds libraries that segfault in this process."""
    import torch  # noqa: F401

    bad = fake_cxx(tmp_path, "crashing-g++", CRASHING_PROBE)
    monkeypatch.setenv("CXX", bad)
    chosen = cxx.choose_cxx()
    assert chosen is not None and chosen != bad
    assert cxx.works_with_runtime(chosen, cxx.loaded_libstdcxx())[0]
    (why,) = cxx.rejected_compilers()
    assert "crashing-g++" in why and "signal 11" in why
    assert cxx.build_record(chosen)["cxx_rejected"] == [why]


def test_cxx_with_arguments_or_missing_is_passed_over_with_a_reason(monkeypatch):
    monkeypatch.setenv("CXX", "ccache g++")
    paths, skipped = cxx._candidates("g++")
    assert skipped == ["CXX='ccache g++' has arguments, which Inductor cannot run"]
    assert all(" " not in p for p in paths)
    monkeypatch.setenv("CXX", "/nonexistent/g++")
    assert cxx._candidates("g++")[1] == ["CXX='/nonexistent/g++' is not on PATH"]


@pytest.mark.skipif(not HAS_GXX, reason="no g++ on this machine")
def test_a_probe_child_that_cannot_run_is_no_evidence_against_the_compiler(monkeypatch):
    """E.g. a child without torch, or a noexec temp dir: keep the compiler, say so."""
    import sys

    monkeypatch.setattr(sys, "executable", "/bin/false")  # the child exits 1
    cxx.probe_compiler.cache_clear()
    try:
        verdict, why = cxx.probe_compiler(shutil.which("g++"), "/x/libstdc++.so.6")
        assert verdict == cxx.UNCHECKED and "exited 1" in why
    finally:
        cxx.probe_compiler.cache_clear()


def test_a_verified_runtime_is_trusted_over_the_reported_path(monkeypatch):
    import torch  # noqa: F401

    monkeypatch.delenv("LD_PRELOAD", raising=False)
    loaded = cxx.loaded_libstdcxx()
    meta = {"cxx": "/opt/x/g++", "libstdcxx": "/opt/x/libstdc++.so.6", "libstdcxx_verified": loaded}
    cxx.check_runtime(meta)  # the probe saw its code run against this very runtime


@pytest.mark.skipif(not HAS_GXX, reason="no g++ on this machine")
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
