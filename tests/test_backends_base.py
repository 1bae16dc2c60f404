"""backends/base.py: every backend named in BACKEND_NAMES implements the Backend protocol."""

from __future__ import annotations

import inspect

import pytest

from artifactcache.backends.base import BACKEND_NAMES, Backend, get_backend


def _protocol_methods() -> list[str]:
    return [n for n, v in vars(Backend).items() if inspect.isfunction(v) and not n.startswith("_")]


@pytest.mark.parametrize("name", BACKEND_NAMES)
def test_every_backend_has_every_protocol_method(name):
    """A backend missing one (check_recipe, say) fails here by name, not at the first
    build or compare that calls it."""
    backend = get_backend(name)
    assert "check_recipe" in _protocol_methods()
    missing = [m for m in _protocol_methods() if not callable(getattr(backend, m, None))]
    assert missing == [] and backend.name == name
