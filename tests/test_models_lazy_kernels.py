"""models/lazy_kernels.py: kernels defined once, whichever thread asks first, and the
module ``__getattr__`` that defines them on a lookup by name (no Triton needed here)."""

from __future__ import annotations

import sys
import time
import types

import pytest
from _threads import call_at_once

from artifactcache.models.lazy_kernels import kernel_getattr, once


def test_concurrent_first_calls_define_once():
    """functools.cache runs the function in every thread that calls before it returns."""
    calls: list[int] = []

    @once
    def define() -> int:
        calls.append(1)
        time.sleep(0.05)  # the other threads arrive while the first one defines
        return len(calls)

    results = call_at_once(define, 8)
    assert calls == [1] and results == [1] * 8
    assert define() == 1 and define.__name__ == "define"


def test_a_failed_definition_is_tried_again():
    outcomes = iter([ImportError("no triton"), "defined"])

    @once
    def define() -> str:
        out = next(outcomes)
        if isinstance(out, Exception):
            raise out
        return out

    with pytest.raises(ImportError):
        define()
    assert define() == "defined"


def test_the_module_getattr_defines_the_kernels_on_first_lookup(monkeypatch):
    module = types.ModuleType("acache_fake_kernels")
    monkeypatch.setitem(sys.modules, module.__name__, module)

    @once
    def define() -> None:
        module.kernel = "jit"

    module.__getattr__ = kernel_getattr(module.__name__, ["kernel"], define)
    assert module.kernel == "jit"
    with pytest.raises(AttributeError, match="has no attribute 'other'"):
        module.other  # noqa: B018 - the lookup itself is the test


def test_without_triton_the_lookup_is_an_attribute_error(monkeypatch):
    """hasattr answers False instead of raising the ImportError."""
    module = types.ModuleType("acache_fake_kernels")
    monkeypatch.setitem(sys.modules, module.__name__, module)

    def define() -> None:
        raise ImportError("No module named 'triton'")

    module.__getattr__ = kernel_getattr(module.__name__, ["kernel"], define)
    assert not hasattr(module, "kernel")
    with pytest.raises(AttributeError, match="Triton kernel: No module named 'triton'"):
        module.kernel  # noqa: B018
