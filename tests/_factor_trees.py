"""Arbitrary nested factor objects and edits of them, for the key tests (not a test
module): tests/test_store_keyformat.py (the key format) and tests/test_keys.py (the
factors, their diff)."""

from __future__ import annotations

import math
import random
from typing import Any

from hypothesis import strategies as st

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


def changed_leaf(factors: dict, data: st.DataObject) -> tuple[tuple, dict] | None:
    """One leaf's path, drawn, and the factors with that leaf changed; None if no leaf."""
    paths = leaf_paths(factors)
    if not paths:  # e.g. {"a": []} has no leaf to change
        return None
    path = data.draw(st.sampled_from(paths))
    leaf = factors
    for p in path:
        leaf = leaf[p]
    return path, replace(factors, path, changed(leaf))
