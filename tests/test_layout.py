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
        ours = node.level > 0 or (node.module or "").split(".")[0] == "artifactcache"
        if not ours:  # torch's private modules are torch_private.py's business
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


# Test files about the package as a whole rather than one module.
WHOLE_PACKAGE_TESTS = {"test_layout.py", "test_packaging.py"}


def _mirrored(test_name: str) -> str | None:
    """The module or package a tests/test_<package>_<module>[_topic].py file names, or None.

    tests/test_benchmarks_<script>.py names benchmarks/<script>.py.
    """
    stem = test_name.removeprefix("test_").removesuffix(".py")
    if stem.startswith("benchmarks_"):
        script = PACKAGE.parent / "benchmarks" / f"{stem.removeprefix('benchmarks_')}.py"
        return f"../benchmarks/{script.name}" if script.is_file() else None
    parts = stem.split("_")
    found = None
    path = PACKAGE
    # Greedy, longest first: module names hold underscores too (torch_private, onnx_export).
    i = 0
    while i < len(parts):
        for j in range(len(parts), i, -1):
            name = "_".join(parts[i:j])
            if (path / name / "__init__.py").exists():
                path, found, i = path / name, str((path / name).relative_to(PACKAGE)), j
                break
            if (path / f"{name}.py").exists():
                return str((path / f"{name}.py").relative_to(PACKAGE))
        else:
            break
    return found


def test_every_test_file_names_the_module_it_tests() -> None:
    tests = Path(__file__).parent
    unmapped = [
        p.name
        for p in sorted(tests.glob("test_*.py"))
        if p.name not in WHOLE_PACKAGE_TESTS and _mirrored(p.name) is None
    ]
    assert unmapped == []


def test_the_mapping() -> None:
    assert _mirrored("test_backends_shared_torch_private.py") == "backends/shared/torch_private.py"
    assert _mirrored("test_backends_tensorrt_standin.py") == "backends/tensorrt"
    assert _mirrored("test_store_local_failures.py") == "store/local.py"
    assert _mirrored("test_api.py") == "api"
    assert _mirrored("test_bundle.py") is None
    assert _mirrored("test_benchmarks_checkpoint_folder.py") == "../benchmarks/checkpoint_folder.py"
    assert _mirrored("test_benchmarks_nothing_here.py") is None


# What store/ may import from the rest of the package: leaves that know no torch.
STORE_MAY_IMPORT = {"errors", "settings", "limits", "extras"}


def _store_reaches(path: Path) -> set[str]:
    """The top-level artifactcache modules outside store/ a store file imports (lazy too)."""
    dotted: list[str] = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            dotted += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative to artifactcache.store
                up = ["artifactcache", "store"][: 3 - node.level]
                base = ".".join([*up, base] if base else up)
            # `from artifactcache import keys` names the module in the imported names
            dotted += (
                [f"{base}.{a.name}" for a in node.names] if base == "artifactcache" else [base]
            )
    parts = [d.split(".") for d in dotted]
    return {p[1] for p in parts if p[0] == "artifactcache" and len(p) > 1 and p[1] != "store"}


def test_the_store_imports_only_torch_free_leaves() -> None:
    """store/ never imports keys, api or any module that knows torch (issue 29, item 5)."""
    store = PACKAGE / "store"
    offenders = {
        f"store/{path.name}": sorted(bad)
        for path in sorted(store.glob("*.py"))
        if (bad := _store_reaches(path) - STORE_MAY_IMPORT)
    }
    assert offenders == {}
