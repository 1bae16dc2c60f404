"""Provenance against today's trusted keys: no trust laundering through push, and
revocation of entries pulled earlier. Server-less: an in-memory bucket stands in for
S3 (the protocol itself is tested against SeaweedFS in test_store_signing_remote.py)."""

from __future__ import annotations

import io
import json
import os
import re
import tarfile
from pathlib import Path

import pytest

from artifactcache.errors import BundleError, RemoteError, UntrustedEntry
from artifactcache.store.bundle import export, import_bundle
from artifactcache.store.keyformat import compute_key
from artifactcache.store.local import LocalStore
from artifactcache.store.signing import configure, fingerprint, generate_key
from artifactcache.store.tiered import TieredStore
from tests._memory_bucket import MemoryBucket

FACTORS = {"test": "provenance", "n": 1}
KEY = compute_key(FACTORS)
OTHER_FACTORS = {"test": "provenance", "n": 2}
OTHER = compute_key(OTHER_FACTORS)


@pytest.fixture(autouse=True)
def _no_key_env(monkeypatch):
    for name in ("ACACHE_SIGNING_KEY", "ACACHE_TRUSTED_KEYS", "ACACHE_REMOTE_TRUST_UNSIGNED"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def keys(tmp_path) -> dict[str, Path]:
    out = {}
    for name in ("fleet", "other"):
        out[name] = tmp_path / "keys" / name
        out[name].parent.mkdir(exist_ok=True)
        generate_key(out[name], name)
    return out


def _pub(key: Path) -> str:
    return f"{key}.pub"


def _fp(key: Path) -> str:
    return fingerprint(Path(_pub(key)).read_text())


def host(root: Path, bucket, *, signer: Path | None = None, trusted: tuple[Path, ...] = (),
         rebuild_untrusted: bool = False) -> TieredStore:  # fmt: skip
    root.mkdir(mode=0o700, exist_ok=True)
    sign, trust = configure(signer or "", [_pub(k) for k in trusted], False)
    local = LocalStore(root, rebuild_untrusted=rebuild_untrusted)
    return TieredStore(local, bucket, trust=trust, signer=sign)


def build(payload: bytes = b"weights"):
    def write(d: Path) -> dict:
        (d / "model.bin").write_bytes(payload * 100)
        return {}

    return write


def never_build(d: Path) -> dict:
    raise AssertionError("this host must not build")


def _unsigned_bundle(tmp_path: Path) -> Path:
    """A bundle of an entry built on some machine this fleet knows nothing about."""
    stranger = LocalStore(tmp_path / "stranger")
    stranger.get_or_build(OTHER, OTHER_FACTORS, build(b"stranger"))
    export(stranger, [OTHER], tmp_path / "stranger.tar")
    return tmp_path / "stranger.tar"


def test_push_signs_only_what_was_built_here_or_arrived_signed_by_a_trusted_key(tmp_path, keys):
    fleet, mirror = MemoryBucket(), MemoryBucket("mem://mirror")
    a = host(tmp_path / "a", fleet, signer=keys["fleet"], trusted=(keys["fleet"],))
    assert a.get_or_build(KEY, FACTORS, build())[1] == "built"  # built and pushed, signed
    b = host(tmp_path / "b", fleet, signer=keys["other"], trusted=(keys["fleet"],))
    assert b.pull(KEY)["status"] == "pulled"
    # B imports a stranger's unsigned bundle: served here, but never pushed (signed by B).
    import_bundle(b.local, _unsigned_bundle(tmp_path))
    assert b.local.get(OTHER) is not None
    to_mirror = host(tmp_path / "b", mirror, signer=keys["other"], trusted=(keys["fleet"],))
    with pytest.raises(RemoteError, match=f"push of {OTHER[:12]} refused.*imported.*unsigned"):
        to_mirror.push(OTHER)
    assert not [p for p in mirror.writes if OTHER in p]  # nothing of it was sent
    # What arrived signed by a key trusted today goes on, signed by B.
    assert to_mirror.push(KEY)["status"] == "pushed"
    # Once the fleet key is no longer trusted, B pushes nothing it signed.
    mirror2 = MemoryBucket("mem://mirror2")
    untrusting = host(tmp_path / "b", mirror2, signer=keys["other"], trusted=())
    signer = re.escape(_fp(keys["fleet"]))
    with pytest.raises(RemoteError, match=f"push of {KEY[:12]} refused.*{signer}"):
        untrusting.push(KEY)
    assert mirror2.writes == []


def test_a_pulled_entry_whose_signer_is_revoked_is_not_served(tmp_path, keys, monkeypatch):
    fleet = MemoryBucket()
    a = host(tmp_path / "a", fleet, signer=keys["fleet"], trusted=(keys["fleet"],))
    a.get_or_build(KEY, FACTORS, build())
    b = host(tmp_path / "b", fleet, trusted=(keys["fleet"],))
    assert b.get_or_build(KEY, FACTORS, never_build)[1] == "pulled"
    # The fleet key is revoked: B's trusted-keys file now holds another key only.
    revoked = host(tmp_path / "b", fleet, trusted=(keys["other"],))
    for lookup in (
        lambda: revoked.get_or_build(KEY, FACTORS, never_build),
        lambda: revoked.get(KEY),
        lambda: revoked.open(KEY),
        lambda: revoked.local.open(KEY[:12]),
    ):
        with pytest.raises(UntrustedEntry, match="no longer a trusted key") as err:
            lookup()
        assert _fp(keys["fleet"]) in str(err.value) and "\n" not in str(err.value)
    # Without a remote, the local store checks the same trust (ACACHE_TRUSTED_KEYS).
    monkeypatch.setenv("ACACHE_TRUSTED_KEYS", _pub(keys["other"]))
    with pytest.raises(UntrustedEntry):
        LocalStore(tmp_path / "b").get(KEY)
    monkeypatch.setenv("ACACHE_TRUSTED_KEYS", _pub(keys["fleet"]))
    assert LocalStore(tmp_path / "b").get(KEY) is not None  # trusted again: served again


def test_rebuild_untrusted_replaces_a_revoked_entry_with_a_local_build(tmp_path, keys):
    fleet = MemoryBucket()
    host(tmp_path / "a", fleet, signer=keys["fleet"], trusted=(keys["fleet"],)).get_or_build(
        KEY, FACTORS, build()
    )
    host(tmp_path / "b", fleet, trusted=(keys["fleet"],)).pull(KEY)
    b = host(tmp_path / "b", fleet, trusted=(keys["other"],), rebuild_untrusted=True)
    assert b.get(KEY) is None  # a miss, not an error
    entry, source = b.get_or_build(KEY, FACTORS, build(b"rebuilt"))
    assert source == "built" and entry.provenance == {"source": "built"}
    assert (entry.path / "model.bin").read_bytes() == b"rebuilt" * 100
    assert host(tmp_path / "b", fleet, trusted=(keys["other"],)).get(KEY) is not None


def test_an_explicit_pull_replaces_a_revoked_copy_with_one_signed_by_a_trusted_key(tmp_path, keys):
    fleet = MemoryBucket()
    host(tmp_path / "a", fleet, signer=keys["fleet"], trusted=(keys["fleet"],)).get_or_build(
        KEY, FACTORS, build()
    )
    host(tmp_path / "c", fleet, trusted=(keys["fleet"],)).pull(KEY)
    # The fleet moves to a new key, and a builder re-signs the entry with it.
    new_builder = host(tmp_path / "a2", fleet, signer=keys["other"], trusted=(keys["other"],))
    new_builder.get_or_build(KEY, FACTORS, build(), force=True)
    c = host(tmp_path / "c", fleet, trusted=(keys["other"],))
    with pytest.raises(UntrustedEntry):
        c.get(KEY)
    assert c.pull(KEY)["status"] == "pulled"
    assert c.get(KEY).provenance["signer"] == _fp(keys["other"])  # type: ignore[union-attr]


def test_a_signed_entry_keeps_its_verified_signer_through_export_and_import(tmp_path, keys):
    fleet = MemoryBucket()
    host(tmp_path / "a", fleet, signer=keys["fleet"], trusted=(keys["fleet"],)).get_or_build(
        KEY, FACTORS, build()
    )
    b = host(tmp_path / "b", fleet, trusted=(keys["fleet"],))
    b.pull(KEY)
    pulled = b.local.open(KEY).provenance
    assert pulled == {"source": "pulled", "remote": "mem://fleet", "signer": _fp(keys["fleet"])}
    out = tmp_path / "signed.tar"
    export(b.local, [KEY], out)
    c = LocalStore(tmp_path / "c")
    import_bundle(c, out)
    want = {"source": "imported", "bundle": "signed.tar", "signer": _fp(keys["fleet"])}
    assert c.open(KEY).provenance == want
    # C may push it on (signed by C) while it trusts the fleet key.
    mirror = MemoryBucket("mem://mirror")
    assert (
        host(tmp_path / "c", mirror, signer=keys["other"], trusted=(keys["fleet"],)).push(KEY)[
            "status"
        ]
        == "pushed"
    )
    # A bundle whose manifest was changed under the carried signature is refused.
    with tarfile.open(out) as tf:
        members = [(m, tf.extractfile(m).read()) for m in tf.getmembers()]  # type: ignore[union-attr]
    forged = tmp_path / "forged.tar"
    with tarfile.open(forged, "w") as tf:
        for m, data in members:
            if m.name.endswith("manifest.json"):
                manifest = json.loads(data)
                manifest["label"] = {"recipe": "planted"}
                data = json.dumps(manifest).encode()
                m.size = len(data)
            tf.addfile(m, io.BytesIO(data))
    d = LocalStore(tmp_path / "d")
    with pytest.raises(BundleError, match="signature that does not verify"):
        import_bundle(d, forged)
    assert d.scan() == ([], []) and os.listdir(d.base / "staging") == []
