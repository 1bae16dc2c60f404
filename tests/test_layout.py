"""The package's layout rules: no module reaches into another's private names."""

from __future__ import annotations

import ast
from pathlib import Path

import artifactcache

PACKAGE = Path(artifactcache.__file__).parent


def _private_imports(path: Path) -> list[str]:
    """``from X import _name`` in ``path``, except a private module of its own package."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.ImportFrom):
            continue
        for alias in node.names:
            name = alias.name
            if not name.startswith("_") or name.startswith("__"):
                continue
            own_module = (
                node.level == 1 and not node.module and (path.parent / f"{name}.py").exists()
            )
            if not own_module:
                out.append(f"{path.relative_to(PACKAGE)}:{node.lineno}: {name}")
    return out


def test_no_private_cross_module_imports() -> None:
    offenders = [hit for path in sorted(PACKAGE.rglob("*.py")) for hit in _private_imports(path)]
    assert offenders == []
