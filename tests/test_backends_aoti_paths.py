"""The aoti loaders open only libraries inside the verified entry, whatever its meta says.

No compile: the entry holds stand-in files and the dlopen is replaced by a spy, so these
run in the fast suite.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from artifactcache.backends.aoti import backend as aoti
from artifactcache.backends.aoti import module as module_aoti
from artifactcache.backends.shared import torch_private
from artifactcache.choices import BuildChoices
from artifactcache.errors import IntegrityError
from artifactcache.store.keyformat import compute_key
from artifactcache.store.local import LocalStore

FACTORS = {"schema": 1, "aoti-paths": 1}


class Opened(Exception):
    """The spy's signal: the loader reached dlopen with this path."""


def _spy(path: Path, dev) -> None:
    raise Opened(str(path))


@pytest.fixture
def entry(cache_dir):
    def build(d: Path) -> dict:
        steps = {}
        for step in ("prefill", "extend", "decode"):
            (d / f"{step}.so").write_bytes(b"\x7fELF " + step.encode())
            steps[step] = f"{step}.so"
        return {"steps": steps, "library": "prefill.so"}

    e, _ = LocalStore(cache_dir).get_or_build(compute_key(FACTORS), FACTORS, build)
    return e


@pytest.fixture
def evil(tmp_path) -> Path:
    p = tmp_path / "evil.so"
    p.write_bytes(b"\x7fELF not from the entry")
    return p


def _escapes(entry, evil: Path) -> dict[str, str]:
    """Paths a manifest could name that lie outside the entry (or are not its files)."""
    (entry.path / "link.so").symlink_to(evil)  # also not listed in the manifest
    return {
        "absolute": str(evil),
        "dotdot": "../" * 40 + str(evil.relative_to("/")),
        "symlink": "link.so",
    }


@pytest.mark.parametrize("how", ["absolute", "dotdot", "symlink"])
def test_the_aoti_loader_refuses_a_library_outside_the_entry(entry, evil, how, monkeypatch):
    monkeypatch.setattr(aoti, "aoti_container_runner", _spy)
    monkeypatch.setattr(aoti, "build_model_for", lambda *a: torch.nn.Linear(2, 2))
    ctx = SimpleNamespace(opts=BuildChoices(), recipe=None, phases={})
    rel = _escapes(entry, evil)[how]
    meta = {"steps": {"prefill": rel, "extend": "extend.so", "decode": "decode.so"}}
    with pytest.raises(IntegrityError, match="outside|not one of|symlink"):
        aoti.BACKEND.load(ctx, entry.path, meta)  # type: ignore[arg-type]
    # The same entry with its own paths reaches dlopen, with the entry's file.
    with pytest.raises(Opened, match=str(entry.path / "prefill.so")):
        aoti.BACKEND.load(ctx, entry.path, entry.meta)  # type: ignore[arg-type]


@pytest.mark.parametrize("how", ["absolute", "dotdot", "symlink"])
def test_the_module_aoti_loader_refuses_a_library_outside_the_entry(entry, evil, how, monkeypatch):
    monkeypatch.setattr(torch_private, "aoti_container_runner", _spy)
    spec = SimpleNamespace(module=torch.nn.Linear(2, 2), device="cpu")
    rel = _escapes(entry, evil)[how]
    meta = {"library": rel, "output_tree": None}
    load = module_aoti.MODULE_BACKEND.load
    with pytest.raises(IntegrityError, match="outside|not one of|symlink"):
        load(spec, BuildChoices(), entry.path, meta, {})  # type: ignore[arg-type]
    with pytest.raises(Opened, match=str(entry.path / "prefill.so")):
        load(spec, BuildChoices(), entry.path, entry.meta, {})  # type: ignore[arg-type]
