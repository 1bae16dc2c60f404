"""Helpers shared by the remote-tier tests (not a test module): the signing-key fixture,
a test build, and checks on stores and on the one-line errors."""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path

import pytest

from artifactcache.store.keyformat import compute_key
from artifactcache.store.local import LocalStore
from artifactcache.store.remote import read_manifest
from artifactcache.store.s3 import S3Store
from artifactcache.store.signing import fingerprint, generate_key


@pytest.fixture(autouse=True)
def builder_key(tmp_path_factory, monkeypatch) -> Path:
    """Every host in these tests is a builder with one fleet key, trusted by all, unless a
    test says otherwise; the key's public line is in ``<key>.pub``."""
    path = tmp_path_factory.mktemp("keys") / "builder"
    generate_key(path, "builder")
    monkeypatch.setenv("ACACHE_SIGNING_KEY", str(path))
    monkeypatch.setenv("ACACHE_TRUSTED_KEYS", f"{path}.pub")
    monkeypatch.delenv("ACACHE_REMOTE_TRUST_UNSIGNED", raising=False)
    return path


def remote_manifest(remote, key: str) -> dict | None:
    """The remote manifest as stored, signature unchecked (for assertions only)."""
    found = read_manifest(remote, key)
    return found[0] if found else None


def key_of(name: str) -> str:
    return compute_key({"test": "remote", "name": name})


def factors_of(name: str) -> dict:
    return {"test": "remote", "name": name}


def make_build(payload: bytes = b"weights", big: int = 0):
    """A build writing a few files; ``big`` adds a file that needs multipart/ranged transfers."""

    def build(work: Path) -> dict:
        (work / "model.bin").write_bytes(payload * 500)
        (work / "sub").mkdir()
        (work / "sub" / "config.json").write_text('{"layers": 2}')
        if big:
            (work / "sub" / "big.bin").write_bytes(os.urandom(big))
        return {"payload": payload.decode()}

    return build


def never_build(work: Path) -> dict:
    raise AssertionError("this host must not build")


def private_store(path: Path) -> LocalStore:
    path.mkdir(mode=0o700, exist_ok=True)
    return LocalStore(path)


def tree_bytes(entry) -> dict[str, bytes]:
    return {rel: (entry.path / rel).read_bytes() for rel in entry.files}


def one_error_line(result, prefix: str = "error: ") -> str:
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(prefix), result.stderr
    return lines[0]


def assert_local_clean(store: LocalStore) -> None:
    entries, _ = store.scan()
    assert entries == []
    for sub in ("staging", "quarantine"):
        assert list((store.base / sub).iterdir()) == [], sub


def fingerprint_of(private_key: Path) -> str:
    return fingerprint(Path(f"{private_key}.pub").read_text())


def envelope_of(remote: S3Store, key: str) -> dict:
    return json.loads(remote.get(f"v1/{key}/manifest.json", limit=1 << 20))


def strip_signature(remote: S3Store, key: str) -> None:
    """Replace a signed remote manifest by its bare payload: an unsigned entry."""
    payload = base64.b64decode(envelope_of(remote, key)["manifest"])
    remote.put(f"v1/{key}/manifest.json", payload)
