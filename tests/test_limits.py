"""limits.py: the bounds on numbers and environment values users hand acache."""

from __future__ import annotations

import pytest

from artifactcache.errors import ArgumentError, RecipeError
from artifactcache.limits import env_int, int_to_float


@pytest.mark.parametrize("raw", ["--5", "+-5", "²", "1²", "٣", "5x", "1" * 21, "0x10", "1_0"])
def test_env_int_refuses_anything_but_a_signed_run_of_ascii_digits(raw, monkeypatch):
    monkeypatch.setenv("ACACHE_LOAD_THREADS", raw)
    with pytest.raises(ArgumentError, match="ACACHE_LOAD_THREADS=.*expected a whole number"):
        env_int("ACACHE_LOAD_THREADS", 1, 64)


@pytest.mark.parametrize(("raw", "want"), [("8", 8), (" +8 ", 8), ("-0", 0), ("", None)])
def test_env_int_reads_what_it_should(raw, want, monkeypatch):
    monkeypatch.setenv("ACACHE_LOAD_THREADS", raw)
    assert env_int("ACACHE_LOAD_THREADS", 0, 64) == want


def test_an_integer_no_float_holds_is_a_finite_number_error():
    assert int_to_float(10**300, RecipeError) == 1e300
    with pytest.raises(RecipeError, match="must be a finite number, got an integer of 401 dig"):
        int_to_float(10**400, RecipeError)
