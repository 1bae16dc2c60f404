"""The key format: any single factor change changes the key, dict order never does;
full keys and prefixes; the store reaches the format without keys.py or torch."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from _factor_trees import changed_leaf, factor_objs, reorder
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from artifactcache.errors import KeyLookupError
from artifactcache.store.keyformat import (
    KEY_HEX_LEN,
    MIN_PREFIX,
    canonical_json,
    canonical_value,
    compute_key,
    is_full_key,
    normalize_prefix,
)


@given(factor_objs, st.data())
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_changing_any_single_factor_changes_the_key(factors, data):
    edit = changed_leaf(factors, data)
    assume(edit is not None)
    _, other = edit
    assert compute_key(other) != compute_key(factors)


@given(factor_objs, st.randoms(use_true_random=False))
@settings(max_examples=100, deadline=None)
def test_reordering_dict_entries_keeps_the_key(factors, rng):
    assert compute_key(reorder(factors, rng)) == compute_key(factors)


def test_float_spellings_and_int_float_kept_apart():
    assert compute_key({"eps": 1e-5}) == compute_key({"eps": 0.00001})
    assert compute_key({"x": 1}) != compute_key({"x": 1.0})
    assert canonical_json({"b": 1, "a": [True, None]}) == '{"a":[true,null],"b":1}'


def test_tuples_and_paths_have_one_spelling_and_other_types_are_refused():
    assert compute_key({"s": (1, 2), "p": Path("/a")}) == compute_key({"s": [1, 2], "p": "/a"})
    with pytest.raises(TypeError, match="set"):
        canonical_value({"s": {1}})


def test_full_keys_and_prefixes():
    key = compute_key({"x": 1})
    assert len(key) == KEY_HEX_LEN and is_full_key(key)
    assert not is_full_key(key[:-1]) and not is_full_key(key.upper())
    assert not is_full_key(key[:-1] + "g")
    assert normalize_prefix(f"  {key[:MIN_PREFIX].upper()} ") == key[:MIN_PREFIX]
    assert normalize_prefix(key) == key
    for bad in (key[: MIN_PREFIX - 1], key + "0", "zz" * MIN_PREFIX):
        with pytest.raises(KeyLookupError, match=f"give {MIN_PREFIX} to {KEY_HEX_LEN} hex"):
            normalize_prefix(bad, hint="see here")
    with pytest.raises(KeyLookupError, match=r"\(see here\)"):
        normalize_prefix("xyz", hint="see here")


def test_the_store_reaches_the_key_format_without_keys_or_torch():
    """keys.py imports the store (weights memo); the store never imports keys.py,
    and no store module pulls in torch."""
    code = (
        "import sys\n"
        "from artifactcache.store import bundle, local, maintenance, remote, tiered, verify\n"
        "print(sorted(m for m in ('artifactcache.keys', 'torch') if m in sys.modules))"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
