"""Manifest signatures without a server: keys, envelopes, trust, and the one-line errors
of a bad key configuration (which must fail before anything is built or written)."""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519, rsa
from typer.testing import CliRunner

from artifactcache.cli.app import app
from artifactcache.errors import RemoteError, UntrustedEntry
from artifactcache.store.local import LocalStore
from artifactcache.store.signing import (
    Trust,
    configure,
    fingerprint,
    generate_key,
    load_signer,
    load_trust,
    load_trusted_keys,
    open_envelope,
)

REPO = Path(__file__).resolve().parents[1]
KEY_A = "a" * 64
KEY_B = "b" * 64
PAYLOAD = json.dumps({"key": KEY_A, "files": {}}, indent=1, sort_keys=True).encode()
runner = CliRunner()


@pytest.fixture(autouse=True)
def _no_key_env(monkeypatch):
    for name in ("ACACHE_SIGNING_KEY", "ACACHE_TRUSTED_KEYS", "ACACHE_REMOTE_TRUST_UNSIGNED"):
        monkeypatch.delenv(name, raising=False)


def _key(tmp_path: Path, name: str = "builder") -> Path:
    path = tmp_path / name
    generate_key(path, name)
    return path


def _pub(path: Path) -> str:
    return Path(f"{path}.pub").read_text()


def _one_line(result) -> str:
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


# ----------------------------------------------------------------- keys --


def test_generate_key_writes_a_private_key_only_its_owner_reads(tmp_path):
    path = tmp_path / "k"
    public = generate_key(path, "ci-builder")
    assert (path.stat().st_mode & 0o777) == 0o600
    assert public.startswith("ssh-ed25519 AAAA") and public.endswith(" ci-builder")
    assert _pub(path) == public + "\n"
    signer = load_signer(path)
    assert signer.public_line == " ".join(public.split()[:2])
    assert signer.fingerprint == fingerprint(public) and signer.fingerprint.startswith("SHA256:")


@pytest.mark.parametrize("existing", ["private", "public"])
def test_generate_key_never_overwrites(tmp_path, existing):
    path = tmp_path / "k"
    target = path if existing == "private" else Path(f"{path}.pub")
    target.write_text("keep me")
    with pytest.raises(RemoteError, match="refusing to overwrite"):
        generate_key(path)
    assert target.read_text() == "keep me"
    assert not (Path(f"{path}.pub") if existing == "private" else path).exists()


def test_an_openssh_private_key_is_accepted(tmp_path):
    private = ed25519.Ed25519PrivateKey.generate()
    path = tmp_path / "id_ed25519"
    path.write_bytes(
        private.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.OpenSSH,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)
    public = private.public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
    )
    assert load_signer(path).public_line == public.decode()


def _write_private(path: Path, data: bytes, mode: int = 0o600) -> Path:
    path.write_bytes(data)
    path.chmod(mode)
    return path


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("missing", "cannot read signing key"),
        ("directory", "not a regular file"),
        ("group-readable", "chmod 600"),
        ("encrypted", "is encrypted"),
        ("rsa", "not an Ed25519 key"),
        ("garbage", "not a PEM or OpenSSH private key"),
    ],
)
def test_unusable_signing_keys_are_one_line_errors(tmp_path, case, expected):
    path = tmp_path / "key"
    if case == "directory":
        path.mkdir()
    elif case == "group-readable":
        generate_key(path)
        path.chmod(0o640)
    elif case == "encrypted":
        pem = ed25519.Ed25519PrivateKey.generate().private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(b"secret"),
        )
        _write_private(path, pem)
    elif case == "rsa":
        pem = rsa.generate_private_key(public_exponent=65537, key_size=1024).private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        _write_private(path, pem)
    elif case == "garbage":
        _write_private(path, b"not a key\n")
    with pytest.raises(RemoteError, match=expected) as info:
        load_signer(path)
    assert "\n" not in str(info.value)


def test_trusted_keys_files_hold_keys_comments_and_blank_lines(tmp_path):
    a, b = _key(tmp_path, "a"), _key(tmp_path, "b")
    fleet = tmp_path / "fleet.pub"
    fleet.write_text(f"# builders\n\n{_pub(a)}  \n")
    single = tmp_path / "b-only.pub"
    single.write_text(_pub(b))
    keys = load_trusted_keys([fleet, single])
    assert sorted(keys.values()) == sorted([fingerprint(_pub(a)), fingerprint(_pub(b))])


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAABAQ user\n", "line 1: not an ssh-ed25519"),
        ("# ok\nssh-ed25519 not-base64!\n", "line 2: not an ssh-ed25519"),
        ("ssh-ed25519\n", "line 1: not an ssh-ed25519"),
        (None, "cannot read trusted keys file"),
    ],
)
def test_bad_trusted_keys_files_are_one_line_errors(tmp_path, content, expected):
    path = tmp_path / "trusted.pub"
    if content is not None:
        path.write_text(content)
    with pytest.raises(RemoteError, match=expected):
        load_trusted_keys([path])


# ------------------------------------------------------------- envelopes --


def test_a_sealed_manifest_opens_under_its_key_and_a_trusted_signer(tmp_path):
    signer = load_signer(_key(tmp_path))
    opened = open_envelope(signer.seal(KEY_A, PAYLOAD), KEY_A)
    assert (opened.payload, opened.signer, opened.signature_ok) == (
        PAYLOAD,
        signer.fingerprint,
        True,
    )
    load_trust([], signer=signer).check(KEY_A, opened)  # a builder trusts its own key


def test_a_changed_manifest_byte_breaks_the_signature_even_for_trust_unsigned(tmp_path):
    signer = load_signer(_key(tmp_path))
    envelope = json.loads(signer.seal(KEY_A, PAYLOAD))
    changed = PAYLOAD.replace(b'"files": {}', b'"files": {} ')
    envelope["manifest"] = base64.b64encode(changed).decode()
    opened = open_envelope(json.dumps(envelope).encode(), KEY_A)
    assert opened.payload == changed and not opened.signature_ok
    for allow_unsigned in (False, True):
        trust = load_trust([], signer=signer, allow_unsigned=allow_unsigned)
        with pytest.raises(UntrustedEntry, match="does not verify"):
            trust.check(KEY_A, opened)


def test_a_signature_cannot_be_moved_to_another_key(tmp_path):
    signer = load_signer(_key(tmp_path))
    opened = open_envelope(signer.seal(KEY_A, PAYLOAD), KEY_B)
    assert not opened.signature_ok
    with pytest.raises(UntrustedEntry, match="does not verify"):
        load_trust([], signer=signer).check(KEY_B, opened)


def test_a_signature_from_a_key_not_trusted_is_refused(tmp_path):
    stranger = load_signer(_key(tmp_path, "stranger"))
    host = _key(tmp_path, "host")
    opened = open_envelope(stranger.seal(KEY_A, PAYLOAD), KEY_A)
    assert opened.signature_ok
    expected = f"signed by {re.escape(stranger.fingerprint)}.*not a trusted"
    with pytest.raises(UntrustedEntry, match=expected):
        load_trust([f"{host}.pub"]).check(KEY_A, opened)
    load_trust([f"{host}.pub"], allow_unsigned=True).check(KEY_A, opened)


def test_a_plain_manifest_is_unsigned(tmp_path):
    opened = open_envelope(PAYLOAD, KEY_A)
    assert (opened.payload, opened.signer, opened.signature_ok) == (PAYLOAD, None, False)
    trusted = load_trust([f"{_key(tmp_path)}.pub"])
    with pytest.raises(UntrustedEntry, match="is unsigned"):
        trusted.check(KEY_A, opened)
    Trust(allow_unsigned=True).check(KEY_A, opened)


@pytest.mark.parametrize(
    "envelope",
    [
        {"format": "acache-signed-manifest/99", "manifest": "", "signer": "", "signature": ""},
        {"format": "acache-signed-manifest/1", "manifest": "e30="},
        {"format": "acache-signed-manifest/1", "manifest": "!!", "signer": "x", "signature": ""},
        {
            "format": "acache-signed-manifest/1",
            "manifest": "e30=",
            "signer": "ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAABAQ",
            "signature": "AAAA",
        },
    ],
    ids=["unknown-format", "no-signature", "bad-base64", "not-ed25519"],
)
def test_malformed_envelopes_are_refused(envelope):
    with pytest.raises(UntrustedEntry):
        open_envelope(json.dumps(envelope).encode(), KEY_A)


# --------------------------------------------------------- configuration --


def test_configure_reads_the_variables(tmp_path, monkeypatch):
    builder, other = _key(tmp_path, "builder"), _key(tmp_path, "other")
    monkeypatch.setenv("ACACHE_SIGNING_KEY", str(builder))
    monkeypatch.setenv("ACACHE_TRUSTED_KEYS", f" {other}.pub , ")
    signer, trust = configure()
    assert signer is not None and signer.fingerprint == fingerprint(_pub(builder))
    assert sorted(trust.keys.values()) == sorted([signer.fingerprint, fingerprint(_pub(other))])
    assert not trust.allow_unsigned
    monkeypatch.setenv("ACACHE_REMOTE_TRUST_UNSIGNED", "yes")
    assert configure(signing_key="", trusted_keys="")[1].allow_unsigned
    assert not configure(trust_unsigned=False)[1].allow_unsigned  # an argument beats the variable


def test_a_host_that_trusts_nothing_is_refused_up_front():
    with pytest.raises(RemoteError, match="ACACHE_TRUSTED_KEYS.*--remote-trust-unsigned"):
        configure()
    assert configure(trust_unsigned=True)[1].allow_unsigned


def test_the_store_imports_cryptography_only_for_a_remote_and_never_torch():
    code = (
        "import sys, artifactcache.store.local, artifactcache.store.remote, "
        "artifactcache.store.tiered; assert 'cryptography' not in sys.modules, 'imported'\n"
        "from artifactcache.store.signing import configure; configure(trust_unsigned=True)\n"
        "assert 'cryptography' in sys.modules and 'torch' not in sys.modules"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr


def test_a_remote_without_cryptography_is_a_one_line_error(tmp_path, monkeypatch):
    for name in [m for m in sys.modules if m == "cryptography" or m.startswith("cryptography.")]:
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setitem(sys.modules, "cryptography", None)
    with pytest.raises(RemoteError, match=r"artifactcache\[s3\]"):
        configure(trust_unsigned=True)
    cache = tmp_path / "c"
    res = runner.invoke(
        app, ["pull", "a" * 64, "--remote", "s3://acache-test/p", "--cache-dir", str(cache)]
    )
    assert res.exit_code == 1
    assert "artifactcache[s3]" in _one_line(res)


# ------------------------------------------------------------------- CLI --


def test_cli_keygen_prints_the_public_key_and_refuses_to_overwrite(tmp_path):
    path = tmp_path / "builder.key"
    res = runner.invoke(app, ["remote", "keygen", str(path), "--comment", "ci"])
    assert res.exit_code == 0, res.output
    assert res.stdout.strip() == _pub(path).strip() and res.stdout.startswith("ssh-ed25519 ")
    assert (path.stat().st_mode & 0o777) == 0o600
    before = path.read_bytes()
    res = runner.invoke(app, ["remote", "keygen", str(path)])
    assert res.exit_code == 1
    assert "refusing to overwrite" in _one_line(res)
    assert path.read_bytes() == before
    res = runner.invoke(app, ["remote", "keygen", str(tmp_path / "no-dir" / "k")])
    assert res.exit_code == 1
    assert "cannot write key" in _one_line(res)


@pytest.mark.parametrize(
    ("command", "case", "expected"),
    [
        ("push", "exposed-signing-key", "chmod 600"),
        ("pull", "missing-trusted-keys", "cannot read trusted keys file"),
        ("prewarm", "bad-trusted-keys", "line 1: not an ssh-ed25519"),
        ("pull", "no-keys", "the remote tier needs keys"),
        ("build", "missing-trusted-keys", "cannot read trusted keys file"),
    ],
)
def test_bad_key_configuration_fails_before_anything_is_written(tmp_path, command, case, expected):
    cache = tmp_path / "cache"
    opts = ["--remote", "s3://acache-test/p", "--cache-dir", str(cache)]
    if case == "exposed-signing-key":
        key = _key(tmp_path)
        key.chmod(0o644)
        opts += ["--signing-key", str(key)]
    elif case == "missing-trusted-keys":
        opts += ["--trusted-keys", str(tmp_path / "nowhere.pub")]
    elif case == "bad-trusted-keys":
        bad = tmp_path / "bad.pub"
        bad.write_text("ssh-dss AAAA\n")
        opts += ["--trusted-keys", str(bad)]
    args = {
        "push": ["push", "a" * 64],
        "pull": ["pull", "a" * 64],
        "prewarm": ["prewarm", "tiny-llama", "--backend", "eager"],
        "build": ["build", "tiny-llama", "--backend", "eager"],
    }[command]
    res = runner.invoke(app, [*args, *opts])
    assert res.exit_code == 1, res.output
    assert expected in _one_line(res)
    if cache.exists():
        assert LocalStore(cache).scan()[0] == []
