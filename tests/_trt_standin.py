"""A recording stand-in for the ``tensorrt`` module, and the names of the real bindings.

TensorRT cannot be installed here, but its Python bindings wheel can be downloaded:
its libraries are missing, so it does not import, yet its compiled ``tensorrt.so``
holds every class, method, property and enum name as a string. The stand-in lets
the trt backend's build and load paths run and records every attribute path they
touch; ``bindings_names`` reads the real names, so a test can check one against
the other.
"""

from __future__ import annotations

import ast
import importlib.machinery
import os
import re
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CALL = "()"


@dataclass
class Recording:
    """What the code did with the stand-in: attribute paths, calls, assignments."""

    version: str
    # Call results by method name (e.g. {"parse_from_file": False}); attribute values
    # by name (e.g. {"num_errors": 2}). Anything else is another stand-in.
    returns: dict[str, Any] = field(default_factory=dict)
    values: dict[str, Any] = field(default_factory=dict)
    # Call results computed from the call's arguments, by method name (e.g. an engine's
    # get_tensor_name(i)); a name here wins over ``returns``.
    computed: dict[str, Callable[..., Any]] = field(default_factory=dict)
    paths: set[tuple[str, ...]] = field(default_factory=set)
    calls: list[tuple[tuple[str, ...], tuple, dict]] = field(default_factory=list)
    sets: list[tuple[tuple[str, ...], Any]] = field(default_factory=list)

    def names(self) -> set[str]:
        """Every attribute name the code touched below the module."""
        return {n for p in self.paths for n in p[1:] if n != CALL}

    def called(self, name: str) -> list[tuple[tuple, dict]]:
        """(args, kwargs) of every call of a method or class named ``name``."""
        return [(a, k) for p, a, k in self.calls if p[-1] == name]

    def assigned(self, name: str) -> list[Any]:
        return [v for p, v in self.sets if p[-1] == name]


class Fake:
    """Any TensorRT object: attributes and calls give more fakes, and are recorded."""

    __slots__ = ("_rec", "_path")

    def __init__(self, rec: Recording, path: tuple[str, ...]) -> None:
        object.__setattr__(self, "_rec", rec)
        object.__setattr__(self, "_path", path)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name != "__version__":
            raise AttributeError(name)  # Python's own protocol probes are not TensorRT names
        path = self._path + (name,)
        self._rec.paths.add(path)
        if name == "__version__":
            return self._rec.version
        if name in self._rec.values:
            return self._rec.values[name]
        return Fake(self._rec, path)

    def __setattr__(self, name: str, value: Any) -> None:
        path = self._path + (name,)
        self._rec.paths.add(path)
        self._rec.sets.append((path, value))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self._rec.calls.append((self._path, args, kwargs))
        if self._path[-1] in self._rec.computed:
            return self._rec.computed[self._path[-1]](*args, **kwargs)
        if self._path[-1] in self._rec.returns:
            return self._rec.returns[self._path[-1]]
        return Fake(self._rec, self._path + (CALL,))

    def __int__(self) -> int:  # enum values: 1 << int(flag)
        return len(self._path)

    __index__ = __int__

    def __bytes__(self) -> bytes:  # serialized engines and timing caches
        return ("standin:" + ".".join(self._path)).encode()

    def __repr__(self) -> str:
        return f"<standin {'.'.join(self._path)}>"


class StandinModule(Fake):
    """What ``import tensorrt`` gives while the stand-in is in sys.modules."""

    __slots__ = ()

    def __init__(self, rec: Recording) -> None:
        super().__init__(rec, ("tensorrt",))

    def __getattr__(self, name: str) -> Any:
        if name == "__spec__":  # importlib.util.find_spec reads it
            return importlib.machinery.ModuleSpec("tensorrt", None)
        if name == "__name__":
            return "tensorrt"
        return super().__getattr__(name)


# ----------------------------------------------------------- the real names --

_IDENT = re.compile(rb"(?<=\x00)[A-Za-z_][A-Za-z0-9_]*(?=\x00)")


@dataclass(frozen=True)
class BindingsNames:
    version: str
    strings: frozenset[str]  # NUL-terminated identifier strings of the compiled module
    python: frozenset[str]  # names the package's __init__.py defines

    def has(self, name: str) -> bool:
        # The linker stores a string that is the tail of a longer one only once, inside
        # it ("Builder" lives in "IExprBuilder\0"), so a name may be found as a tail.
        if name in self.strings or name in self.python:
            return True
        return any(s.endswith(name) for s in self.strings)


WHEEL_VAR = "ACACHE_TRT_BINDINGS_WHEEL"


def bindings_wheel() -> Path:
    """The bindings wheel $ACACHE_TRT_BINDINGS_WHEEL names; a skip without it, a failure in CI."""
    import pytest

    raw = os.environ.get(WHEEL_VAR)
    if raw and Path(raw).is_file():
        return Path(raw)
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI must provide the TensorRT bindings wheel: ${WHEEL_VAR} is {raw!r}")
    pytest.skip(
        f"${WHEEL_VAR} names no file (pip download --no-deps tensorrt-cu13-bindings, "
        "then point it at the .whl)"
    )


def bindings_names(wheel: Path) -> BindingsNames:
    """The names in a tensorrt bindings wheel: its .so's strings and its __init__.py."""
    with zipfile.ZipFile(wheel) as z:
        members = z.namelist()
        sos = [m for m in members if re.fullmatch(r"tensorrt[^/]*/tensorrt[^/]*\.so", m)]
        inits = [m for m in members if re.fullmatch(r"tensorrt[^/]*/__init__\.py", m)]
        if len(sos) != 1 or len(inits) != 1:
            raise ValueError(f"{wheel.name}: expected one tensorrt*.so and one __init__.py")
        data = z.read(sos[0])
        init = z.read(inits[0]).decode()
    strings = frozenset(m.group().decode() for m in _IDENT.finditer(data))
    python: set[str] = set()
    version = ""
    for node in ast.walk(ast.parse(init)):
        if isinstance(node, ast.Assign):
            for t in node.targets:
                if isinstance(t, ast.Name):
                    python.add(t.id)
                    if t.id == "__version__" and isinstance(node.value, ast.Constant):
                        version = str(node.value.value)
                elif isinstance(t, ast.Attribute):
                    python.add(t.attr)
        elif isinstance(node, ast.FunctionDef):
            python.add(node.name)
    if not version:
        raise ValueError(f"{wheel.name}: no __version__ in its __init__.py")
    return BindingsNames(version, strings, frozenset(python))
