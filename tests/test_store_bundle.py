"""Bundles: export/import round trip, and refusal of unsafe or damaged tars."""

from __future__ import annotations

import io
import json
import os
import tarfile
from pathlib import Path

import pytest

from artifactcache.errors import BundleError
from artifactcache.keys import compute_key
from artifactcache.store.bundle import export, import_bundle
from artifactcache.store.local import LocalStore


def built(store: LocalStore, i: int):
    factors = {"schema": 1, "bundle": i}

    def build(d: Path) -> dict:
        (d / "model.bin").write_bytes(os.urandom(3000))
        (d / "sub").mkdir()
        (d / "sub" / "cfg.txt").write_text(f"cfg {i}")
        return {"i": i}

    entry, _ = store.get_or_build(compute_key(factors), factors, build)
    return entry


def tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


@pytest.fixture
def src(tmp_path) -> LocalStore:
    return LocalStore(tmp_path / "src")


@pytest.fixture
def dst(tmp_path) -> LocalStore:
    return LocalStore(tmp_path / "dst")


def test_round_trip(src, dst, tmp_path):
    a, b = built(src, 1), built(src, 2)
    out = tmp_path / "b.tar"
    assert export(src, [a.key[:10], b.key], out) == [a.key, b.key]
    assert sorted(import_bundle(dst, out)) == sorted([a.key, b.key])
    for e in (a, b):
        got = dst.open(e.key)
        assert got.manifest == e.manifest
        assert (got.path / "model.bin").read_bytes() == (e.path / "model.bin").read_bytes()
    assert import_bundle(dst, out) == [a.key, b.key]  # again: already there, still fine
    assert os.listdir(dst.base / "staging") == []


def _tar(path: Path, members: list[tuple[tarfile.TarInfo, bytes | None]]) -> Path:
    with tarfile.open(path, "w") as tf:
        for info, data in members:
            if data is not None:
                info.size = len(data)
            tf.addfile(info, io.BytesIO(data) if data is not None else None)
    return path


def _member(name: str, kind: bytes = tarfile.REGTYPE, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = link
    return info


def _valid_members(entry) -> list[tuple[tarfile.TarInfo, bytes]]:
    out = []
    for rel in ["manifest.json", *entry.files]:
        out.append((_member(f"{entry.key}/{rel}"), (entry.path / rel).read_bytes()))
    return out


UNSAFE = {
    "dotdot": lambda k: [(_member(f"{k}/../../escaped.txt"), b"x")],
    "absolute": lambda k: [(_member("/tmp/acache-escaped.txt"), b"x")],
    "symlink": lambda k: [(_member(f"{k}/model.bin", tarfile.SYMTYPE, "/etc/passwd"), None)],
    "hardlink": lambda k: [(_member(f"{k}/model.bin", tarfile.LNKTYPE, "/etc/passwd"), None)],
    "device": lambda k: [(_member(f"{k}/dev", tarfile.CHRTYPE), None)],
    "fifo": lambda k: [(_member(f"{k}/pipe", tarfile.FIFOTYPE), None)],
    "outside-key": lambda k: [(_member("notakey/file.bin"), b"x")],
}


@pytest.mark.parametrize("kind", sorted(UNSAFE))
def test_unsafe_members_rejected_and_nothing_written(src, dst, tmp_path, kind):
    entry = built(src, 3)
    bundle = _tar(tmp_path / "evil.tar", _valid_members(entry) + UNSAFE[kind](entry.key))
    before = tree(tmp_path)
    with pytest.raises(BundleError, match="refusing") as err:
        import_bundle(dst, bundle)
    assert "\n" not in str(err.value)
    assert tree(tmp_path) == before and not Path("/tmp/acache-escaped.txt").exists()
    assert dst.scan() == ([], [])


def test_tampered_file_rejected(src, dst, tmp_path):
    entry = built(src, 4)
    members = _valid_members(entry)
    members[1] = (members[1][0], b"tampered" + members[1][1][8:])
    with pytest.raises(BundleError, match="does not match its manifest"):
        import_bundle(dst, _tar(tmp_path / "t.tar", members))
    assert dst.scan()[0] == [] and os.listdir(dst.base / "staging") == []


def test_key_not_matching_factors_rejected(src, dst, tmp_path):
    """A bundle cannot plant an artifact under another artifact's key."""
    entry = built(src, 5)
    manifest = dict(entry.manifest, factors={"schema": 1, "bundle": 999})
    members = _valid_members(entry)
    members[0] = (members[0][0], json.dumps(manifest).encode())
    with pytest.raises(BundleError, match="does not match its key"):
        import_bundle(dst, _tar(tmp_path / "k.tar", members))


@pytest.mark.parametrize("content", [b"", b"this is not a tar file" * 100], ids=["empty", "junk"])
def test_malformed_bundle(dst, tmp_path, content):
    bad = tmp_path / "bad.tar"
    bad.write_bytes(content)
    with pytest.raises(BundleError) as err:
        import_bundle(dst, bad)
    assert "\n" not in str(err.value)
    assert dst.scan() == ([], [])


def test_truncated_bundle(src, dst, tmp_path):
    entry = built(src, 6)
    out = tmp_path / "full.tar"
    export(src, [entry.key], out)
    cut = tmp_path / "cut.tar"
    cut.write_bytes(out.read_bytes()[:1500])
    with pytest.raises(BundleError):
        import_bundle(dst, cut)
    assert dst.scan()[0] == [] and os.listdir(dst.base / "staging") == []


def test_missing_bundle(dst, tmp_path):
    with pytest.raises(BundleError, match="does not exist"):
        import_bundle(dst, tmp_path / "nope.tar")
