"""Manifest signatures through a real SeaweedFS S3 server: forged, unsigned and untrusted
entries are refused, good ones round-trip, and nothing unsigned is pushed.

The server-less side (keys, envelopes, trust files): test_store_signing.py."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import blake3
import pytest
from typer.testing import CliRunner

from artifactcache.cli.app import app
from artifactcache.errors import KeyLookupError
from artifactcache.store.local import LocalStore
from artifactcache.store.remote import tree_id
from artifactcache.store.s3 import S3Store
from artifactcache.store.signing import fingerprint, generate_key, load_signer
from artifactcache.store.tiered import open_tiered
from tests import _remote_util as util
from tests import s3_server as srv
from tests._remote_util import (
    assert_local_clean,
    envelope_of,
    factors_of,
    fingerprint_of,
    key_of,
    make_build,
    never_build,
    one_error_line,
    private_store,
    remote_manifest,
    tree_bytes,
)

# The server fixtures live in tests/s3_server.py and the signing-key one in
# tests/_remote_util.py (not conftest): bind them here.
s3_server = srv.s3_server
s3_remote = srv.s3_remote
builder_key = util.builder_key

runner = CliRunner()


def _forge(remote: S3Store, key: str, how: str, attacker_key: Path) -> bytes:
    """What anyone with write access to the bucket can do: put their own bytes in
    model.bin, recompute its digest (and so the tree), upload the files under the new
    tree, and rewrite the manifest. Returns the planted bytes."""
    envelope = envelope_of(remote, key)
    original = json.loads(base64.b64decode(envelope["manifest"]))
    manifest = json.loads(json.dumps(original))
    evil = b"attacker" * 300
    manifest["files"]["model.bin"] = {
        "size": len(evil),
        "digest": f"blake3:{blake3.blake3(evil).hexdigest()}",
    }
    for rel in manifest["files"]:
        old = f"v1/{key}/{tree_id(original)}/{rel}"
        data = evil if rel == "model.bin" else remote.get(old, limit=1 << 20)
        remote.put(f"v1/{key}/{tree_id(manifest)}/{rel}", data)
    payload = json.dumps(manifest, indent=1, sort_keys=True).encode()
    if how == "old-signature":  # the builder's signature kept, over the old manifest
        envelope["manifest"] = base64.b64encode(payload).decode()
        body = json.dumps(envelope).encode()
    elif how == "unsigned":
        body = payload
    else:  # signed, validly, by a key nobody trusts
        body = load_signer(attacker_key).seal(key, payload)
    remote.put(f"v1/{key}/manifest.json", body)
    return evil


@pytest.mark.parametrize(
    ("how", "expected", "digests_alone_accept"),
    [
        ("old-signature", "does not verify", False),
        ("unsigned", "is unsigned", True),
        ("untrusted-key", "not a trusted key", True),
    ],
)
def test_tampered_file_with_recomputed_digests_is_refused(
    s3_remote, tmp_path, capsys, how, expected, digests_alone_accept
):
    key = key_of(f"forged-{how}")
    builder = open_tiered(private_store(tmp_path / "a"), s3_remote)
    good, _ = builder.get_or_build(key, factors_of(f"forged-{how}"), make_build(b"good"))
    attacker = tmp_path / "attacker"
    generate_key(attacker, "attacker")
    evil = _forge(builder.remote, key, how, attacker)

    # The forgery is consistent: a host that checks digests only takes the planted
    # bytes. (A signature that does not verify is refused even there.)
    lax = open_tiered(
        private_store(tmp_path / "lax"), s3_remote, signing_key="", trust_unsigned=True
    )
    lax_entry = lax.get(key)
    if digests_alone_accept:
        assert (lax_entry.path / "model.bin").read_bytes() == evil
    else:
        assert lax_entry is None
    capsys.readouterr()

    # A deployment host that trusts the builder's key: one warning, a miss, nothing published.
    deploy = open_tiered(private_store(tmp_path / "d"), s3_remote, read_only=True, signing_key="")
    assert deploy.get(key) is None
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("warning: ") and expected in err[0], err
    assert_local_clean(deploy.local)
    entry, source = deploy.get_or_build(key, factors_of(f"forged-{how}"), make_build(b"good"))
    assert source == "built"
    assert tree_bytes(entry) == tree_bytes(good)

    # The explicit pull: one error line, exit 1, the local cache untouched.
    b_dir = tmp_path / "b"
    res = runner.invoke(app, ["pull", key, "--remote", s3_remote, "--cache-dir", str(b_dir)])
    assert res.exit_code == 1
    line = one_error_line(res)
    assert expected in line and "nothing was pulled" in line
    # Only where it could help does the message suggest --remote-trust-unsigned.
    assert ("--remote-trust-unsigned" in line) == digests_alone_accept
    assert_local_clean(LocalStore(b_dir))


def test_unsigned_entry_is_refused_by_default_and_used_with_trust_unsigned(
    s3_remote, tmp_path, capsys, monkeypatch
):
    key = key_of("unsigned")
    # A host without a signing key that trusts unsigned entries pushes unsigned, and says so.
    lax = open_tiered(private_store(tmp_path / "a"), s3_remote, signing_key="", trust_unsigned=True)
    entry, _ = lax.get_or_build(key, factors_of("unsigned"), make_build(b"u"))
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"warning: pushing {key[:12]} unsigned"), err
    assert envelope_of(lax.remote, key)["key"] == key  # a bare manifest, no envelope

    deploy = open_tiered(private_store(tmp_path / "d"), s3_remote, read_only=True, signing_key="")
    assert deploy.get(key) is None
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is unsigned" in err[0], err
    with pytest.raises(KeyLookupError):
        deploy.open(key)
    assert_local_clean(deploy.local)

    pull = ["pull", key, "--remote", s3_remote, "--cache-dir", str(tmp_path / "b")]
    res = runner.invoke(app, pull)
    assert res.exit_code == 1
    assert "is unsigned" in one_error_line(res)
    assert_local_clean(LocalStore(tmp_path / "b"))
    res = runner.invoke(app, [*pull, "--remote-trust-unsigned"])
    assert res.exit_code == 0, res.output
    # peek: this store, without the flag, would not serve it (revocation: provenance.py)
    assert tree_bytes(LocalStore(tmp_path / "b").peek(key)) == tree_bytes(entry)

    monkeypatch.setenv("ACACHE_REMOTE_TRUST_UNSIGNED", "1")  # the flag's variable
    env_host = open_tiered(private_store(tmp_path / "e"), s3_remote, read_only=True, signing_key="")
    assert tree_bytes(env_host.get(key)) == tree_bytes(entry)


def test_entry_signed_by_an_untrusted_key_is_refused_until_its_key_is_trusted(
    s3_remote, tmp_path, capsys, builder_key
):
    key = key_of("other-builder")
    other = tmp_path / "other"
    generate_key(other, "other-builder")
    host_x = open_tiered(
        private_store(tmp_path / "x"), s3_remote, signing_key=other, trusted_keys=[]
    )
    entry, _ = host_x.get_or_build(key, factors_of("other-builder"), make_build(b"x"))
    assert envelope_of(host_x.remote, key)["signer"].split()[1] in Path(f"{other}.pub").read_text()

    # This host trusts only the fleet's builder key.
    deploy = open_tiered(private_store(tmp_path / "d"), s3_remote, read_only=True, signing_key="")
    assert deploy.get(key) is None
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not a trusted key" in err[0] and fingerprint_of(other) in err[0]
    assert_local_clean(deploy.local)

    # One trusted-keys file may hold several keys (comments and blank lines allowed),
    # and --trusted-keys takes several files.
    fleet = tmp_path / "fleet.pub"
    fleet.write_text(f"# the fleet's builders\n{Path(f'{builder_key}.pub').read_text()}\n\n")
    fleet.write_text(fleet.read_text() + Path(f"{other}.pub").read_text())
    both = open_tiered(
        private_store(tmp_path / "e"), s3_remote, signing_key="", trusted_keys=str(fleet)
    )
    assert tree_bytes(both.get(key)) == tree_bytes(entry)
    res = runner.invoke(
        app,
        ["pull", key, "--remote", s3_remote, "--cache-dir", str(tmp_path / "f")]
        + ["--trusted-keys", f"{builder_key}.pub,{other}.pub"],
    )
    assert res.exit_code == 0, res.output
    # peek: ACACHE_TRUSTED_KEYS (the builder's key only) would not serve it here
    assert tree_bytes(LocalStore(tmp_path / "f").peek(key)) == tree_bytes(entry)


def test_a_good_signed_entry_round_trips_to_a_host_with_only_the_public_key(
    s3_remote, tmp_path, builder_key
):
    key = key_of("signed")
    builder = open_tiered(private_store(tmp_path / "a"), s3_remote)
    entry, _ = builder.get_or_build(key, factors_of("signed"), make_build(b"s"))
    envelope = envelope_of(builder.remote, key)
    assert envelope["format"] == "acache-signed-manifest/1"
    assert fingerprint(envelope["signer"]) == fingerprint_of(builder_key)
    deploy = open_tiered(private_store(tmp_path / "d"), s3_remote, read_only=True, signing_key="")
    pulled, source = deploy.get_or_build(key, factors_of("signed"), never_build)
    assert source == "pulled" and tree_bytes(pulled) == tree_bytes(entry)
    # The local manifest is the signed payload, byte for byte in meaning, plus where the
    # copy came from: the signer and its envelope, never the builder's own provenance.
    signed = json.loads(base64.b64decode(envelope["manifest"]))
    assert "provenance" not in signed and entry.provenance == {"source": "built"}
    assert {k: v for k, v in pulled.manifest.items() if k != "provenance"} == signed
    assert pulled.manifest["provenance"] == {
        "source": "pulled", "remote": s3_remote, "signer": fingerprint_of(builder_key),
        "envelope": envelope,
    }  # fmt: skip


def test_a_builder_replaces_an_unsigned_remote_copy_with_a_signed_one(
    s3_remote, tmp_path, capsys, builder_key
):
    key = key_of("migrate")
    lax = open_tiered(
        private_store(tmp_path / "old"), s3_remote, signing_key="", trust_unsigned=True
    )
    lax.get_or_build(key, factors_of("migrate"), make_build(b"m"))
    capsys.readouterr()
    builder = open_tiered(private_store(tmp_path / "a"), s3_remote)
    entry, source = builder.get_or_build(key, factors_of("migrate"), make_build(b"m"))
    assert source == "built"
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is unsigned" in err[0], err  # the refusal; the push is silent
    assert fingerprint(envelope_of(builder.remote, key)["signer"]) == fingerprint_of(builder_key)
    deploy = open_tiered(private_store(tmp_path / "d"), s3_remote, read_only=True, signing_key="")
    assert deploy.get_or_build(key, factors_of("migrate"), never_build)[1] == "pulled"


def test_push_without_a_signing_key_is_refused(s3_remote, tmp_path, capsys, monkeypatch):
    key = key_of("no-signing-key")
    host = open_tiered(private_store(tmp_path / "a"), s3_remote, signing_key="")
    entry, source = host.get_or_build(key, factors_of("no-signing-key"), make_build(b"n"))
    assert source == "built"
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "skipped: no signing key" in err[0], err
    assert remote_manifest(host.remote, key) is None  # nothing unsigned reached the fleet

    monkeypatch.delenv("ACACHE_SIGNING_KEY")
    res = runner.invoke(
        app, ["push", key, "--remote", s3_remote, "--cache-dir", str(tmp_path / "a")]
    )
    assert res.exit_code == 1
    assert "no signing key" in one_error_line(res)
    assert S3Store(s3_remote).list(f"v1/{key}") == []
