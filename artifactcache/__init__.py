"""artifactcache: build compiled PyTorch artifacts once, cache them, measure what it buys.

Public API (no CLI needed)::

    import artifactcache
    result = artifactcache.build("tiny-llama", backend="inductor")   # BuildResult
    runner = artifactcache.load("tiny-llama", backend="inductor")    # Runner
    runner.generate([1, 15043, 29892], max_new_tokens=8)

    fast = artifactcache.compile(my_module, (x,), backend="aoti")  # any nn.Module
    fast(x)                                                          # == my_module(x)

    store = artifactcache.LocalStore()            # $ACACHE_DIR or the user cache dir
    entries, warnings = store.scan()

Heavy modules (torch, backends) are imported on first use, so importing this
package is cheap and store-only tools never pay for torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .errors import AcacheError
from .version import __version__ as __version__

__all__ = [
    "AcacheError",
    "BuildResult",
    "Entry",
    "LocalStore",
    "Runner",
    "build",
    "compile",
    "load",
    "load_recipe",
]

_LAZY = {
    "build": ("api", "build"),
    "load": ("api", "load"),
    "compile": ("api", "compile"),
    "BuildResult": ("api", "BuildResult"),
    "Runner": ("backends.base", "Runner"),
    "LocalStore": ("store.local", "LocalStore"),
    "Entry": ("store.local", "Entry"),
    "load_recipe": ("recipes", "load_recipe"),
}

if TYPE_CHECKING:
    from .api import BuildResult, build, compile, load
    from .backends.base import Runner
    from .recipes import load_recipe
    from .store.local import Entry, LocalStore


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        return getattr(importlib.import_module(f"{__name__}.{module}"), attr)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    """The lazy names too, so dir() and completion show load, build and compile."""
    return sorted({*__all__, "__version__", *(n for n in globals() if n.startswith("__"))})
