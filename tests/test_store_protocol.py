"""artifactcache/store/protocol.py: every store api.py may be handed satisfies Store."""

from __future__ import annotations

from pathlib import Path

import pytest

from artifactcache.measure.child.recording import RecordingStore
from artifactcache.store.local import LocalStore
from artifactcache.store.protocol import Store
from artifactcache.store.tiered import TieredStore, open_tiered

IMPLEMENTATIONS = (LocalStore, TieredStore, RecordingStore)
METHODS = ("get", "open", "get_or_build", "record_dependency", "reading")


@pytest.fixture
def stores(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, object]:
    monkeypatch.setenv("ACACHE_SIGNING_KEY", "")
    local = LocalStore(tmp_path / "cache")
    # The remote is never contacted: constructing the tier opens no connection.
    tiered = open_tiered(
        LocalStore(tmp_path / "tiered"), "s3://bucket/prefix", signing_key="", trust_unsigned=True
    )
    return {"local": local, "tiered": tiered, "recording": RecordingStore(local, {})}


def test_each_implementation_is_a_store(stores: dict[str, object]) -> None:
    for name, store in stores.items():
        assert isinstance(store, Store), name


@pytest.mark.parametrize("cls", IMPLEMENTATIONS, ids=lambda c: c.__name__)
def test_no_implementation_forwards_through_getattr(cls: type) -> None:
    # __getattr__ would make isinstance() true for any object, whatever it implements.
    assert all("__getattr__" not in vars(k) for k in cls.__mro__), cls
    # Every method is defined by the class itself (or a base), not found at run time.
    assert all(any(m in vars(k) for k in cls.__mro__) for m in METHODS), cls


def test_wrappers_reach_the_inner_store(tmp_path: Path) -> None:
    local = LocalStore(tmp_path / "cache")
    stamps: dict[str, float] = {}
    recording = RecordingStore(local, stamps)
    key = "ab" * 32
    assert recording.base == local.base
    assert recording.get(key) is None

    def build(workdir: Path) -> dict[str, str]:
        (workdir / "artifact.bin").write_bytes(b"x")
        return {"what": "test"}

    entry, source = recording.get_or_build(key, {"f": 1}, build)
    assert source == "built" and recording.source == "built" and recording.entry == entry
    assert set(stamps) == {"store_call", "build_start", "build_done"}
    assert local.get(key) is not None and recording.open(key[:12]).key == key
    assert recording.get_or_build(key, {"f": 1}, build)[1] == "local"


def test_an_object_missing_a_method_is_not_a_store(tmp_path: Path) -> None:
    class NoReading:
        base = tmp_path

        def get(self, key: str) -> None: ...
        def open(self, key: str) -> None: ...
        def get_or_build(self, key: str, factors: dict, build: object) -> None: ...
        def record_dependency(self, key: str) -> None: ...

    assert not isinstance(NoReading(), Store)
