"""Triton kernels defined on first use as a module's globals (models/gemv.py,
models/decode_attention.py).

Importing Triton costs seconds, so each module defines its kernels in a function run
once. They must end up as module globals: Inductor's generated code, its compile
workers and a saved compiled function (the inductor warm path) look a user-defined
kernel up by (module, name), in a process where nothing has defined it yet, so the
module's ``__getattr__`` defines them on such a lookup.
"""

from __future__ import annotations

import functools
import os
import sys
import threading
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

T = TypeVar("T")


def interpreting() -> bool:
    """Whether Triton's interpreter runs the kernels (``TRITON_INTERPRET=1``: the CPU
    tests), which reads any tensor and runs no inline PTX."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def once(define: Callable[[], T]) -> Callable[[], T]:
    """``define`` run at most once, whichever thread asks first; later calls return its
    result. functools.cache holds no lock while the function runs, so two threads could
    both define the kernels (and one could see the other's half-set globals). An
    exception is not kept: the next call tries again."""
    lock = threading.Lock()
    done: list[T] = []

    @functools.wraps(define)
    def run() -> T:
        if not done:  # double-checked: no lock once defined
            with lock:
                if not done:
                    done.append(define())
        return done[0]

    return run


def kernel_getattr(module: str, names: Iterable[str], define: Callable[[], Any]) -> Any:
    """A module ``__getattr__`` that runs ``define`` (which sets ``names`` as the module's
    globals) on the first lookup of one of them. Without Triton the lookup is an
    AttributeError, so ``hasattr`` answers False rather than raising ImportError."""
    kernels = frozenset(names)

    def __getattr__(name: str) -> Any:
        if name in kernels:
            try:
                define()
            except ImportError as e:
                raise AttributeError(f"{module}.{name} is a Triton kernel: {e}") from e
            return vars(sys.modules[module])[name]
        raise AttributeError(f"module {module!r} has no attribute {name!r}")

    return __getattr__
