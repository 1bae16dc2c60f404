"""Fake cgroup trees for tests of what a container's limits leave a process."""

from __future__ import annotations

from pathlib import Path


def cgroup_tree(root: Path, files: dict[str, str]) -> Path:
    """Write each {relative path: text} under root, as a cgroup mount shows them."""
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text + "\n")
    return root
