"""Bounds on what users hand acache: numbers, files, environment values.

Each boundary checks its input here, once, so a huge number, a FIFO or a
misspelt variable is a one-line AcacheError before anything is built, never a
traceback, a hang or a memory blow-up. No torch here: the store uses it too.
"""

from __future__ import annotations

import math
import os
import re
import stat
from collections.abc import Callable

from .errors import AcacheError, ArgumentError

# torch.manual_seed takes an unsigned 64-bit seed.
SEED_MAX = 2**64 - 1
# Sizes (gc --max-size): an int64 of bytes, 8 EiB, far above any disk.
SIZE_MAX = 2**63 - 1
# A recipe's integers (dims, layers, vocab, lengths): far above any real model, and
# small enough that products of a few of them stay exact and allocatable checks hold.
RECIPE_INT_MAX = 2**31 - 1
# Text files acache reads whole (recipes, config.json, trusted-keys files).
SMALL_FILE_MAX = 16 << 20

# An integer environment value: one optional sign, then ASCII digits.
_INT = re.compile("[+-]?[0-9]{1,20}")
# The spellings click's bool options take, so a value that worked as a flag's env still does.
_TRUE = ("1", "true", "t", "yes", "y", "on")
_FALSE = ("0", "false", "f", "no", "n", "off")


def check_seed(value: object, what: str = "--seed") -> int:
    """A seed torch accepts: an integer in [0, 2**64)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= SEED_MAX:
        shown = value if not isinstance(value, int) or abs(value) < 10**30 else "a huge number"
        raise ArgumentError(f"{what} must be an integer from 0 to 2**64-1, got {shown}")
    return value


def check_finite(value: float, what: str, error: type[AcacheError] = ArgumentError) -> float:
    """nan and inf are refused: TOML and json.loads accept them, no model field means them."""
    if not math.isfinite(value):
        raise error(f"{what} must be a finite number, got {value}")
    return value


def int_to_float(value: int, fail: Callable[[str], AcacheError]) -> float:
    """An integer given where a float is meant; ``fail(why)`` if no float holds it."""
    try:
        return float(value)
    except OverflowError:  # 1 followed by 400 zeros: past the largest float
        digits = len(str(abs(value)))
        raise fail(f"must be a finite number, got an integer of {digits} digits") from None


def regular_file(
    path: str | os.PathLike[str],
    what: str,
    error: type[AcacheError],
    max_bytes: int | None = SMALL_FILE_MAX,
) -> os.stat_result:
    """stat() of ``path`` if it is a regular file of at most ``max_bytes``; else ``error``.

    Checked before any open: opening a FIFO blocks until a writer comes, and a
    device or a sparse terabyte file would be read without end.
    """
    try:
        st = os.stat(path)
    except OSError as e:
        raise error(f"cannot read {what} {path}: {e.strerror or e}") from None
    if not stat.S_ISREG(st.st_mode):
        raise error(f"{what} {path} is not a regular file")
    if max_bytes is not None and st.st_size > max_bytes:
        raise error(f"{what} {path} is {st.st_size} bytes; at most {max_bytes} are read")
    return st


def read_small_file(
    path: str | os.PathLike[str],
    what: str,
    error: type[AcacheError],
    max_bytes: int = SMALL_FILE_MAX,
) -> bytes:
    """The bytes of a regular file of at most ``max_bytes`` (see ``regular_file``)."""
    regular_file(path, what, error, max_bytes)
    # O_NONBLOCK: should the path turn into a FIFO after the check, open() still returns.
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise error(f"cannot read {what} {path}: {e.strerror or e}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise error(f"{what} {path} is not a regular file")
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(max_bytes + 1)
    except OSError as e:
        raise error(f"cannot read {what} {path}: {e.strerror or e}") from None
    finally:
        os.close(fd)
    if len(data) > max_bytes:
        raise error(f"{what} {path} is larger than {max_bytes} bytes")
    return data


def env_bool(name: str, default: bool = False) -> bool:
    """``name`` as a boolean: 1/true/yes/on or 0/false/no/off (any case); unset or empty:
    ``default``. Anything else is refused, naming the variable: a typo must not flip it."""
    raw = os.environ.get(name, "")
    value = raw.strip().lower()
    if not value:
        return default
    if value in _TRUE + _FALSE:
        return value in _TRUE
    raise ArgumentError(
        f"{name}={raw[:40]!r} is not a boolean: use one of {', '.join(_TRUE + _FALSE)}"
    )


def env_int(name: str, lo: int, hi: int) -> int | None:
    """``name`` as an integer in [lo, hi]; unset or empty: None."""
    raw = os.environ.get(name)
    if raw is None or not raw.strip():
        return None
    text = raw.strip()
    if _INT.fullmatch(text):  # ASCII digits only: "--5" and "²" are refused, not int()ed
        value = int(text)
        if lo <= value <= hi:
            return value
    raise ArgumentError(f"{name}={raw[:40]!r}: expected a whole number from {lo} to {hi}")


def env_choice(name: str, choices: tuple[str, ...], default: str) -> str:
    """``name`` as one of ``choices`` (any case); unset or empty: default."""
    value = os.environ.get(name, "").strip().lower()
    if not value:
        return default
    if value not in choices:
        raise ArgumentError(
            f"{name}={value[:40]!r} is not one of the accepted values: {', '.join(choices)}"
        )
    return value
