"""The key format: factors -> canonical JSON -> sha256 hex, and key prefixes.

A key is the sha256 hex of the canonical JSON of its factors: sorted keys, no
whitespace, floats as their ``repr`` (shortest round-trip form, so ``1e-5`` and
``0.00001`` hash the same, and ``1.0`` stays apart from ``1``); dict order never
matters. What the factors hold is ``keys.py``'s business (``make_factors``); the
store needs only this format, to check a key, resolve a prefix and re-derive an
imported entry's key from its factors. Torch-free, like all of store/.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..errors import KeyLookupError

KEY_HEX_LEN = 64
MIN_PREFIX = 8
_HEX = frozenset("0123456789abcdef")


def canonical_value(obj: Any) -> Any:
    """Factors as JSON-safe values with one spelling per value."""
    if isinstance(obj, Mapping):
        return {str(k): canonical_value(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [canonical_value(v) for v in obj]
    if isinstance(obj, bool) or obj is None or isinstance(obj, (int, str)):
        return obj
    if isinstance(obj, float):
        # repr is the shortest round-trip spelling, so equal floats hash equal
        # whatever literal wrote them; the wrapper keeps 1.0 apart from 1.
        return {"__float__": repr(obj)}
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"cannot use {type(obj).__name__} as a key factor")


def canonical_json(factors: Mapping[str, Any]) -> str:
    """Canonical JSON: sorted keys, no whitespace, floats as repr strings."""
    return json.dumps(
        canonical_value(factors), sort_keys=True, separators=(",", ":"), ensure_ascii=True
    )


def compute_key(factors: Mapping[str, Any]) -> str:
    """The sha256 hex of the factors' canonical JSON."""
    return hashlib.sha256(canonical_json(factors).encode()).hexdigest()


def is_full_key(text: str) -> bool:
    """Exactly KEY_HEX_LEN lower-case hex characters."""
    return len(text) == KEY_HEX_LEN and all(c in _HEX for c in text)


def normalize_prefix(prefix: str, *, hint: str = "see `acache ls`") -> str:
    """A key prefix, lower-cased: 8 to 64 hex characters, else a one-line KeyLookupError."""
    p = prefix.strip().lower()
    if len(p) < MIN_PREFIX or len(p) > KEY_HEX_LEN or any(c not in _HEX for c in p):
        raise KeyLookupError(
            f"{prefix!r} is not a key prefix: give {MIN_PREFIX} to {KEY_HEX_LEN} hex characters "
            f"({hint})"
        )
    return p
