"""Bundles: export/import round trip, and refusal of unsafe or damaged tars."""

from __future__ import annotations

import errno
import io
import json
import os
import shutil
import tarfile
from pathlib import Path

import pytest

from artifactcache.errors import BundleError, FilesystemError
from artifactcache.store import bundle as bundle_mod
from artifactcache.store.bundle import ImportResult, check_export_target, export, import_bundle
from artifactcache.store.keyformat import compute_key
from artifactcache.store.local import LocalStore
from artifactcache.store.manifest import content


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
    assert import_bundle(dst, out) == ImportResult(imported=[a.key, b.key], present=[])
    for e in (a, b):
        got = dst.open(e.key)
        assert content(got.manifest) == content(e.manifest)  # provenance: the importer's own
        assert (got.path / "model.bin").read_bytes() == (e.path / "model.bin").read_bytes()
    # Again: already there, still fine, and said so; the entry there is kept.
    assert import_bundle(dst, out) == ImportResult(imported=[], present=[a.key, b.key])
    assert os.listdir(dst.base / "staging") == []
    dst.remove([a.key])
    assert import_bundle(dst, out) == ImportResult(imported=[a.key], present=[b.key])


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


@pytest.mark.parametrize(
    "data,words",
    [
        (b'{"key": "', "is not valid JSON"),
        (b"\xff\xfe{}", "is not valid JSON"),
        (b"[1, 2]", "is not a JSON object"),
    ],
    ids=["truncated", "not-utf8", "array"],
)
def test_a_manifest_that_is_not_json_is_named_so(src, dst, tmp_path, data, words, extracted):
    """Not "does not match its key": the manifest could not be read at all."""
    entry = built(src, 13)
    members = _valid_members(entry)
    members[0] = (members[0][0], data)
    with pytest.raises(BundleError, match=words) as err:
        import_bundle(dst, _tar(tmp_path / "nj.tar", members))
    msg = str(err.value)
    assert "\n" not in msg and "refusing" in msg and "match its key" not in msg
    assert f"entry {entry.key[:12]}" in msg
    assert extracted == [] and dst.scan() == ([], []) and os.listdir(dst.base / "staging") == []


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


def test_export_target_check_is_one_rule(src, tmp_path):
    """One check for the CLI and the store: a regular file only with overwrite; a
    symlink (to a file or a directory), a directory or a missing folder never."""
    entry = built(src, 7)
    (tmp_path / "d").mkdir()
    (tmp_path / "f.tar").write_bytes(b"old")
    (tmp_path / "to-dir").symlink_to(tmp_path / "d", target_is_directory=True)
    (tmp_path / "to-file").symlink_to(tmp_path / "f.tar")
    assert check_export_target(tmp_path / "new.tar") == tmp_path / "new.tar"
    assert check_export_target(tmp_path / "f.tar", overwrite=True) == tmp_path / "f.tar"
    refused = {
        "f.tar": "already exists",
        "d": "is a directory, not a file",
        "to-dir": "is a symlink to a directory, not a file",
        "to-file": "is a symlink, not a file",
        "no/x.tar": "does not exist",
    }
    for name, words in refused.items():
        for overwrite in (False, True):
            if name == "f.tar" and overwrite:
                continue
            with pytest.raises(BundleError, match=words) as ei:
                check_export_target(tmp_path / name, overwrite=overwrite)
            assert "\n" not in str(ei.value)
            with pytest.raises(BundleError, match=words):
                export(src, [entry.key], tmp_path / name, overwrite=overwrite)
    with pytest.raises(BundleError, match="inside the cache"):
        check_export_target(src.root / "x.tar", root=src.root)
    assert os.listdir(tmp_path / "d") == [] and (tmp_path / "f.tar").read_bytes() == b"old"


# ------------------------------------------------------- trust boundaries --


@pytest.fixture
def extracted(monkeypatch) -> list[str]:
    """Keys whose members import_bundle started writing into staging."""
    calls: list[str] = []
    real = bundle_mod._extract

    def spy(tf, members, key, *a, **k):
        calls.append(key)
        return real(tf, members, key, *a, **k)

    monkeypatch.setattr(bundle_mod, "_extract", spy)
    return calls


OVERSIZED = {
    # 2 MiB more than the manifest says: its header size is known before any byte is read.
    "file": lambda m: (m[0], m[1] + b"\0" * (2 << 20)),
    # Valid JSON (trailing whitespace), 32 MiB: it would be parsed whole.
    "manifest": lambda m: (m[0], m[1] + b" " * (32 << 20)),
}


@pytest.mark.parametrize("kind", sorted(OVERSIZED))
def test_a_member_larger_than_its_manifest_says_is_refused_before_writing(
    src, dst, tmp_path, kind, extracted
):
    entry = built(src, 7)
    members = _valid_members(entry)
    i = 0 if kind == "manifest" else next(n for n, m in enumerate(members) if "model" in m[0].name)
    members[i] = OVERSIZED[kind](members[i])
    with pytest.raises(BundleError, match="bytes") as err:
        import_bundle(dst, _tar(tmp_path / "big.tar", members))
    assert "refusing" in str(err.value)
    assert extracted == []  # refused from the tar headers, before anything was written
    assert dst.scan() == ([], []) and os.listdir(dst.base / "staging") == []


def test_a_bundle_with_one_bad_entry_publishes_nothing(src, dst, tmp_path):
    good, bad = built(src, 8), built(src, 9)
    bad_members = _valid_members(bad)
    i = next(n for n, m in enumerate(bad_members) if "model" in m[0].name)
    bad_members[i] = (bad_members[i][0], b"tampered" + bad_members[i][1][8:])
    bundle = _tar(tmp_path / "half.tar", _valid_members(good) + bad_members)
    with pytest.raises(BundleError, match=bad.key[:12]) as err:
        import_bundle(dst, bundle)
    assert dst.scan() == ([], []) and os.listdir(dst.base / "staging") == []
    assert "nothing was imported" in str(err.value)


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT], ids=["ENOSPC", "EDQUOT"])
def test_a_full_disk_during_import_is_not_a_damaged_bundle(src, dst, tmp_path, monkeypatch, code):
    a, b = built(src, 10), built(src, 11)
    bundle = tmp_path / "ok.tar"
    export(src, [a.key, b.key], bundle)
    with tarfile.open(bundle) as tf:
        needed = sum(m.size for m in tf.getmembers() if m.isreg())

    def full(*a, **k):
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(bundle_mod, "_extract", full)
    with pytest.raises(FilesystemError) as err:
        import_bundle(dst, bundle)
    msg = str(err.value)
    assert "no space left on device" in msg and "damaged" not in msg
    assert str(dst.base) in msg and f"{needed} bytes" in msg
    assert dst.scan() == ([], []) and os.listdir(dst.base / "staging") == []


def _with_second_manifest(entry) -> list[tuple[tarfile.TarInfo, bytes]]:
    members = _valid_members(entry)
    other = dict(entry.manifest, label={"recipe": "planted"})  # same key, other manifest
    return [*members, (_member(f"{entry.key}/manifest.json"), json.dumps(other).encode())]


DUPLICATES = {
    "manifest": _with_second_manifest,
    "file": lambda e: [*_valid_members(e), _valid_members(e)[1]],
    "file-and-folder": lambda e: [*_valid_members(e), (_member(f"{e.key}/sub"), b"x")],
}


@pytest.mark.parametrize("kind", sorted(DUPLICATES))
def test_a_bundle_that_names_a_member_twice_is_refused(src, dst, tmp_path, kind, extracted):
    entry = built(src, 12)
    with pytest.raises(BundleError, match="refusing") as err:
        import_bundle(dst, _tar(tmp_path / "dup.tar", DUPLICATES[kind](entry)))
    assert "twice" in str(err.value)
    assert extracted == [] and dst.scan() == ([], [])


# ---------------------------------------------- manifest schema, provenance --


def _with_manifest(entry, manifest: dict) -> list[tuple[tarfile.TarInfo, bytes]]:
    members = _valid_members(entry)
    members[0] = (members[0][0], json.dumps(manifest).encode())
    return members


@pytest.mark.parametrize(
    "field,value",
    [("created", "yesterday"), ("build_seconds", [1]), ("label", "x"), ("depends_on", "k")],
)
def test_a_manifest_field_of_the_wrong_type_is_refused_at_import(src, dst, tmp_path, field, value):
    entry = built(src, 20)
    bundle = _tar(tmp_path / "m.tar", _with_manifest(entry, dict(entry.manifest, **{field: value})))
    with pytest.raises(BundleError, match=field) as err:
        import_bundle(dst, bundle)
    assert "\n" not in str(err.value)
    assert dst.scan() == ([], []) and os.listdir(dst.base / "staging") == []


def test_an_import_records_its_own_provenance_not_the_bundles(src, dst, tmp_path):
    entry = built(src, 21)
    assert entry.provenance == {"source": "built"}
    out = tmp_path / "p.tar"
    export(src, [entry.key], out)
    (key,) = import_bundle(dst, out).imported
    got = dst.open(key)
    assert got.provenance == {"source": "imported", "bundle": "p.tar", "signer": None}
    assert content(got.manifest) == content(entry.manifest)
    # A bundle that claims its entry was pulled signed, without a signature, is not believed.
    claim = {"source": "pulled", "remote": "s3://fleet/x", "signer": "SHA256:" + "A" * 43}
    dst.remove([key])
    forged = _tar(tmp_path / "f.tar", _with_manifest(entry, dict(entry.manifest, provenance=claim)))
    import_bundle(dst, forged)
    assert dst.open(key).provenance == {"source": "imported", "bundle": "f.tar", "signer": None}


def _pulled(store: LocalStore, tmp_path: Path, i: int):
    """An entry published in ``store`` as pulled, unsigned, from a remote."""
    elsewhere = LocalStore(tmp_path / f"elsewhere{i}")
    entry = built(elsewhere, i)
    staging = tmp_path / f"pulled{i}"
    shutil.copytree(entry.path, staging)
    prov = {"source": "pulled", "remote": "mem://fleet", "signer": None}
    return store.publish_dir(staging, entry.manifest, provenance=prov)


def test_export_copies_a_pulled_entry_this_host_would_not_serve(tmp_path, dst, monkeypatch):
    """Exporting copies bytes, it loads nothing: the serve-trust check (which knows only
    the env's trusted keys here, and so refused an entry pulled with flags, suggesting a
    flag export lacks) is the importer's to apply. Digests are still verified."""
    from artifactcache.errors import IntegrityError
    from artifactcache.store.signing import Trust

    monkeypatch.delenv("ACACHE_REMOTE_TRUST_UNSIGNED", raising=False)
    src = LocalStore(tmp_path / "src", trust=Trust())  # trusts no unsigned entry
    entry = _pulled(src, tmp_path, 30)
    out = tmp_path / "pulled.tar"
    assert export(src, [entry.key], out) == [entry.key]
    (key,) = import_bundle(dst, out).imported
    want = {"source": "imported", "bundle": "pulled.tar", "signer": None}
    assert dst.open(key).provenance == want
    # Verified all the same: a damaged entry is not exported.
    (entry.path / "model.bin").write_bytes(b"x" * 3000)
    with pytest.raises(IntegrityError, match="failed verification"):
        export(src, [entry.key], tmp_path / "damaged.tar")
    assert not (tmp_path / "damaged.tar").exists()


def test_an_entry_there_that_may_no_longer_be_served_is_replaced_and_counted_imported(
    tmp_path, monkeypatch
):
    from artifactcache.store.signing import Trust

    monkeypatch.delenv("ACACHE_REMOTE_TRUST_UNSIGNED", raising=False)
    dst = LocalStore(tmp_path / "dst", trust=Trust())  # trusts no unsigned pulled entry
    entry = _pulled(dst, tmp_path, 33)
    out = tmp_path / "again.tar"
    export(LocalStore(tmp_path / "elsewhere33"), [entry.key], out)
    assert import_bundle(dst, out) == ImportResult(imported=[entry.key], present=[])
    assert dst.open(entry.key).provenance["source"] == "imported"


def test_export_holds_the_entry_and_writes_what_it_verified(src, dst, tmp_path, monkeypatch):
    """The reader lock is held while the tar is written (rm/gc/a forced rebuild wait or
    skip), the manifest written is the one verified, not re-read from disk, each member
    is copied at its manifest's size and hashed, and the bundle is private (0600)."""
    from artifactcache.errors import EntryInUse, IntegrityError

    entry = built(src, 31)
    seen: list = []

    def progress(done: int, total: int) -> None:
        with pytest.raises(EntryInUse):  # rm of an entry being exported skips it
            LocalStore(src.root).remove([entry.key])
        seen.append(done)

    opened = src.open

    def open_then_rewrite(key: str, **kw):
        got = opened(key, **kw)
        on_disk = json.loads((got.path / "manifest.json").read_text())
        on_disk["label"] = {"recipe": "planted after verification"}
        (got.path / "manifest.json").write_text(json.dumps(on_disk))
        return got

    monkeypatch.setattr(src, "open", open_then_rewrite)
    out = tmp_path / "held.tar"
    export(src, [entry.key], out, progress=progress)
    assert seen and os.stat(out).st_mode & 0o777 == 0o600
    with tarfile.open(out) as tf:
        written = json.loads(tf.extractfile(f"{entry.key}/manifest.json").read())  # type: ignore[union-attr]
    assert written == entry.manifest
    import_bundle(dst, out)
    assert dst.open(entry.key).label == entry.label

    # A file that grew after verification: refused, not copied at its new size.
    monkeypatch.setattr(src, "open", opened)
    src.remove([entry.key])
    entry = built(src, 31)

    def open_then_append(key: str, **kw):
        got = opened(key, **kw)
        with open(got.path / "model.bin", "ab") as f:
            f.write(b"more")
        return got

    monkeypatch.setattr(src, "open", open_then_append)
    with pytest.raises(IntegrityError, match="model.bin no longer matches its manifest"):
        export(src, [entry.key], tmp_path / "grown.tar")
    assert not (tmp_path / "grown.tar").exists()
    assert [p for p in os.listdir(tmp_path) if p.endswith(".tmp")] == []


def test_a_compressed_bundle_is_refused_unread(src, dst, tmp_path):
    """Export writes a plain tar; a gzipped one would decompress past every bound."""
    import gzip

    entry = built(src, 32)
    out = tmp_path / "b.tar"
    export(src, [entry.key], out)
    gz = tmp_path / "b.tar.gz"
    gz.write_bytes(gzip.compress(out.read_bytes()))
    with pytest.raises(BundleError, match="is not a readable tar bundle") as err:
        import_bundle(dst, gz)
    assert "\n" not in str(err.value)
    assert dst.scan() == ([], [])
