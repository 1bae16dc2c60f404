"""Keys: any single factor change changes the key; dict order never does; digest memo."""

from __future__ import annotations

import math
import os
import random
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from artifactcache import keys
from artifactcache.keys import canonical_json, compute_key, diff_factors, flatten, make_factors

leaves = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**40), 2**40),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=12),
)
names = st.text(st.characters(codec="ascii", categories=["L", "N"]), min_size=1, max_size=8)
trees = st.recursive(
    leaves,
    lambda kids: st.one_of(
        st.lists(kids, max_size=4), st.dictionaries(names, kids, min_size=1, max_size=4)
    ),
    max_leaves=20,
)
factor_objs = st.dictionaries(names, trees, min_size=1, max_size=6)


def leaf_paths(obj: Any, path: tuple = ()) -> list[tuple]:
    if isinstance(obj, dict):
        return [p for k, v in obj.items() for p in leaf_paths(v, (*path, k))]
    if isinstance(obj, list):
        return [p for i, v in enumerate(obj) for p in leaf_paths(v, (*path, i))]
    return [path]


def changed(value: Any) -> Any:
    """A value that differs from ``value`` in canonical form."""
    if value is None:
        return 0
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, float):
        return math.nextafter(value, math.inf)
    return value + "x"


def replace(obj: Any, path: tuple, new: Any) -> Any:
    if not path:
        return new
    head, rest = path[0], path[1:]
    if isinstance(obj, dict):
        return {k: (replace(v, rest, new) if k == head else v) for k, v in obj.items()}
    return [replace(v, rest, new) if i == head else v for i, v in enumerate(obj)]


def reorder(obj: Any, rng: random.Random) -> Any:
    if isinstance(obj, dict):
        items = list(obj.items())
        rng.shuffle(items)
        return {k: reorder(v, rng) for k, v in items}
    if isinstance(obj, list):
        return [reorder(v, rng) for v in obj]
    return obj


@given(factor_objs, st.data())
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_changing_any_single_factor_changes_the_key(factors, data):
    paths = leaf_paths(factors)
    assume(paths)  # e.g. {"a": []} has no leaf to change
    path = data.draw(st.sampled_from(paths))
    leaf = factors
    for p in path:
        leaf = leaf[p]
    other = replace(factors, path, changed(leaf))
    assert compute_key(other) != compute_key(factors)
    if path and all(isinstance(p, str) for p in path):  # diff names exactly that factor
        assert [d.path for d in diff_factors(factors, other)] == [".".join(path)]


@given(factor_objs, st.randoms(use_true_random=False))
@settings(max_examples=100, deadline=None)
def test_reordering_dict_entries_keeps_the_key(factors, rng):
    shuffled = reorder(factors, rng)
    assert compute_key(shuffled) == compute_key(factors)
    assert diff_factors(factors, shuffled) == []


def test_float_spellings_and_int_float_kept_apart():
    assert compute_key({"eps": 1e-5}) == compute_key({"eps": 0.00001})
    assert compute_key({"x": 1}) != compute_key({"x": 1.0})
    assert canonical_json({"b": 1, "a": [True, None]}) == '{"a":[true,null],"b":1}'


def test_each_documented_factor_changes_the_key():
    base = dict(
        recipe={"family": "llama", "model": {"dim": 64}},
        weights="random:0",
        backend="eager",
        options={"dtype": "fp32"},
        toolchain={"python": "3.11.7", "torch": "2.13.0"},
        hardware={"device": "cpu", "machine": "x86_64"},
    )
    key = compute_key(make_factors(**base))
    variants = {
        "recipe": {"family": "llama", "model": {"dim": 128}},
        "weights": "random:1",
        "backend": "inductor",
        "options": {"dtype": "bf16"},
        "toolchain": {"python": "3.11.7", "torch": "2.14.0"},
        "hardware": {"device": "cuda", "machine": "x86_64"},
    }
    for name, value in variants.items():
        assert compute_key(make_factors(**{**base, name: value})) != key, name
    rows = dict(flatten(make_factors(**base)))
    assert rows["backend.options.dtype"] == "fp32" and rows["schema"] == keys.KEY_SCHEMA


def test_weights_digest_memo_and_invalidation(tmp_path, monkeypatch):
    ckpt = tmp_path / "model.safetensors"
    ckpt.write_bytes(os.urandom(1 << 16))
    memo = tmp_path / "memo"
    calls: list[Path] = []
    real = keys._hash_file
    monkeypatch.setattr(keys, "_hash_file", lambda p: calls.append(p) or real(p))

    first = keys.weights_digest(ckpt, memo_dir=memo)
    assert first.startswith("blake3:") and len(calls) == 1
    assert keys.weights_digest(ckpt, memo_dir=memo) == first and len(calls) == 1  # memoized

    st0 = ckpt.stat()
    data = bytearray(ckpt.read_bytes())
    data[0] ^= 0xFF
    ckpt.write_bytes(bytes(data))  # same size, new content
    os.utime(ckpt, ns=(st0.st_atime_ns, st0.st_mtime_ns + 1_000_000_000))
    second = keys.weights_digest(ckpt, memo_dir=memo)
    assert second != first and len(calls) == 2  # the memo line no longer matched


def test_weights_digest_of_a_folder(tmp_path):
    d = tmp_path / "hf"
    d.mkdir()
    (d / "model.safetensors").write_bytes(b"w" * 100)
    (d / "config.json").write_text("{}")
    (d / "README.md").write_text("ignored")
    a = keys.weights_digest(d)
    (d / "README.md").write_text("still ignored")
    assert keys.weights_digest(d) == a
    # config.json reaches the key through the parsed recipe, not as raw bytes
    # (tests/test_sources_checkpoint.py); the tensors do.
    (d / "config.json").write_text('{"dim": 1}')
    assert keys.weights_digest(d) == a
    (d / "model.safetensors").write_bytes(b"v" * 100)
    assert keys.weights_digest(d) != a
