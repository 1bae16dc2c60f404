"""Every ACACHE_* variable is declared once in artifactcache/settings.py, and read through it."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

import artifactcache
from artifactcache import settings
from artifactcache.errors import ArgumentError
from artifactcache.limits import env_bool, env_choice, env_int
from artifactcache.settings import KINDS, SETTINGS

PACKAGE = Path(artifactcache.__file__).parent
NAME = re.compile(r"\bACACHE_[A-Z0-9_]*[A-Z0-9]\b")
# Set by the tests for the tests; users never set them, so they are not settings.
TEST_ONLY = ("ACACHE_TEST_WITHOUT_AOT_COMPILE", "ACACHE_TRT_BINDINGS_WHEEL")
# A read of the environment that bypasses settings: os.environ.get / os.getenv /
# os.environ[...] of an ACACHE_* literal or of a *_ENV constant, or limits' parsers.
DIRECT_READ = re.compile(
    r"(?:environ\.get|getenv)\(\s*(?:[\"']ACACHE_|[A-Z0-9_]*_ENV\b)"
    r"|environ\[\s*(?:[\"']ACACHE_|[A-Z0-9_]*_ENV\b)"
    r"|\benv_(?:bool|int|choice)\("
)


def _sources() -> dict[str, str]:
    return {str(p.relative_to(PACKAGE)): p.read_text() for p in sorted(PACKAGE.rglob("*.py"))}


def names_in(sources: dict[str, str]) -> dict[str, set[str]]:
    """ACACHE_* names -> the files naming them (code, strings, comments alike)."""
    found: dict[str, set[str]] = {}
    for path, text in sources.items():
        for name in NAME.findall(text):
            found.setdefault(name, set()).add(path)
    return found


def undeclared(sources: dict[str, str]) -> set[str]:
    return set(names_in(sources)) - set(SETTINGS)


def test_every_acache_variable_in_the_package_is_declared():
    assert undeclared(_sources()) == set()


def test_the_scan_catches_an_undeclared_variable():
    sources = {"new.py": 'x = os.environ.get("ACACHE_NEW_KNOB", "")\n', "ok.py": "ACACHE_DIR"}
    assert undeclared(sources) == {"ACACHE_NEW_KNOB"}


def test_every_declared_variable_is_used_outside_settings():
    found = names_in({k: v for k, v in _sources().items() if k != "settings.py"})
    assert sorted(set(SETTINGS) - set(found)) == []


def test_no_direct_reads_outside_settings_and_limits():
    hits = [
        f"{path}: {m.group(0)}"
        for path, text in _sources().items()
        if path not in ("settings.py", "limits.py")
        for m in DIRECT_READ.finditer(text)
    ]
    assert hits == []
    assert DIRECT_READ.search('raw = os.environ.get("ACACHE_X")')
    assert DIRECT_READ.search("raw = os.environ.get(T0_ENV)")
    assert not DIRECT_READ.search('env["ACACHE_DIR"] = str(cache_dir)')  # writes stay


def test_declarations_are_well_formed():
    for s in SETTINGS.values():
        assert s.kind in KINDS and s.doc and s.name.startswith("ACACHE_"), s
        assert bool(s.choices) == (s.kind == "choice"), s
        if s.kind == "float":
            assert s.parsed_by, f"{s.name}: get() has no float parser"
        if s.parsed_by:
            assert s.name in (PACKAGE / s.parsed_by).read_text(), s  # parsed where it is named
    for name in TEST_ONLY:
        assert name not in SETTINGS


def test_defaults_when_unset_or_empty(monkeypatch):
    for name in SETTINGS:
        monkeypatch.delenv(name, raising=False)
    for s in SETTINGS.values():
        if not s.parsed_by:
            assert settings.get(s.name) == s.default, s.name
            monkeypatch.setenv(s.name, "")
            assert settings.get(s.name) == s.default, s.name
        assert settings.raw(s.name) == ""
    assert settings.get("ACACHE_CUDA_GRAPHS") is True
    assert settings.get("ACACHE_VERIFY") == "memo"
    assert settings.get("ACACHE_LOAD_CHUNK_MB") == 16


def test_values_parse_with_limits_and_fail_the_same_way(monkeypatch):
    monkeypatch.setenv("ACACHE_CUDA_GRAPHS", "off")
    assert settings.get("ACACHE_CUDA_GRAPHS") is False
    monkeypatch.setenv("ACACHE_VERIFY", "FULL")
    assert settings.get("ACACHE_VERIFY") == "full"
    monkeypatch.setenv("ACACHE_LOAD_THREADS", " 3 ")
    assert settings.get("ACACHE_LOAD_THREADS") == 3
    monkeypatch.setenv("ACACHE_DIR", "~/c")
    assert settings.get("ACACHE_DIR") == "~/c"
    for name, value, parse in [
        ("ACACHE_REMOTE_READ_ONLY", "maybe", lambda n: env_bool(n)),
        ("ACACHE_VERIFY", "half", lambda n: env_choice(n, ("full", "memo"), "memo")),
        ("ACACHE_LOAD_CHUNK_MB", "0", lambda n: env_int(n, 1, 1 << 16)),
        ("ACACHE_LOAD_THREADS", "10" * 20, lambda n: env_int(n, 1, 1 << 16)),
    ]:
        monkeypatch.setenv(name, value)
        with pytest.raises(ArgumentError) as want:
            parse(name)
        with pytest.raises(ArgumentError) as got:
            settings.get(name)
        assert str(got.value) == str(want.value) and name in str(got.value)
    rows = {r["name"]: r for r in settings.report()}
    assert rows["ACACHE_VERIFY"]["problem"].startswith("ACACHE_VERIFY='half'")
    assert rows["ACACHE_DIR"]["problem"] is None and rows["ACACHE_DIR"]["value"] == "~/c"


def test_misuse_is_a_programming_error(monkeypatch):
    with pytest.raises(KeyError):
        settings.get("ACACHE_NOT_DECLARED")
    with pytest.raises(KeyError):
        settings.raw("ACACHE_NOT_DECLARED")
    with pytest.raises(TypeError, match="shared/build_plan.py"):
        settings.get("ACACHE_BUILD_JOBS")  # its own error, in backends/shared/build_plan.py
    monkeypatch.setenv("ACACHE_BUILD_JOBS", " 4 ")
    assert settings.raw("ACACHE_BUILD_JOBS") == " 4 "


def test_settings_import_no_torch():
    code = "import sys, artifactcache.settings; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_the_settings_read_at_load_are_checked_with_the_arguments(monkeypatch):
    assert set(settings.READ_AT_LOAD) <= set(settings.SETTINGS)
    for name in settings.READ_AT_LOAD:
        monkeypatch.delenv(name, raising=False)
    settings.check_load_settings()  # all unset: the defaults
    monkeypatch.setenv("ACACHE_LAZY_STEPS", "sometimes")
    with pytest.raises(ArgumentError, match="ACACHE_LAZY_STEPS='sometimes'"):
        settings.check_load_settings()
    monkeypatch.delenv("ACACHE_LAZY_STEPS")
    monkeypatch.setenv("ACACHE_LOAD_CHUNK_MB", "0")
    with pytest.raises(ArgumentError, match="ACACHE_LOAD_CHUNK_MB"):
        settings.check_load_settings()
    monkeypatch.delenv("ACACHE_LOAD_CHUNK_MB")
    monkeypatch.setenv("ACACHE_VERBOSE", "maybe")  # a bad value fails no command
    settings.check_load_settings()
