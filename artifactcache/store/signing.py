"""Ed25519 signatures over remote manifests: keys, the signed envelope, and trust.

A builder signs each manifest it pushes with its private key; a host uses a
pulled entry only if the signature verifies under a public key it trusts.
docs/remote.md explains the choice of Ed25519 over a shared HMAC key.

Keys are the formats OpenSSH and every crypto library read:

- a private key is a PEM (PKCS#8) or OpenSSH private key file, unencrypted, mode 0600;
- a public key is one ``ssh-ed25519 AAAA... [comment]`` line; a trusted-keys file
  holds one per line (``#`` comments and blank lines are skipped), like authorized_keys.

The remote ``manifest.json`` of a signed entry is an envelope::

    {"format": "acache-signed-manifest/1", "manifest": <base64 of the manifest bytes>,
     "signer": "ssh-ed25519 AAAA...", "signature": <base64 of 64 bytes>}

The signature covers a fixed context string, the entry's key and the manifest
bytes exactly as stored, so it cannot be replayed under another key or read as
anything else. The manifest names every file's blake3 digest, so the signature
covers every byte of the entry. A plain manifest (not an envelope) is unsigned.

``cryptography`` is imported only here and only when a remote is used: the
local store works without it.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import settings
from ..errors import RemoteError, UntrustedEntry
from ..extras import install_hint
from ..limits import read_small_file
from .manifest import ENVELOPE_MAX_BYTES, parse

ENVELOPE_FORMAT = "acache-signed-manifest/1"
# Domain separation: a signature made for an acache manifest is not a valid
# signature of anything else the same key might sign, and vice versa.
CONTEXT = b"acache signed manifest v1\x00"
SSH_ED25519 = "ssh-ed25519"
INSTALL_HINT = install_hint("s3")


def _crypto() -> Any:
    """The cryptography primitives module; RemoteError (one line) if the package is missing."""
    try:
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import ed25519
    except ImportError:
        raise RemoteError(
            f"the remote tier needs cryptography to sign and check manifests: {INSTALL_HINT}"
        ) from None
    return serialization, ed25519


def signed_message(key: str, payload: bytes) -> bytes:
    return CONTEXT + key.encode("ascii") + b"\x00" + payload


def fingerprint(public_line: str) -> str:
    """``SHA256:...`` of the key blob, the same string `ssh-keygen -lf` prints."""
    blob = base64.b64decode(public_line.split()[1])
    return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")


def _public_line(public_key: Any) -> str:
    serialization, _ = _crypto()
    return public_key.public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
    ).decode()


def _raw(public_key: Any) -> bytes:
    serialization, _ = _crypto()
    return public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def parse_public_key(line: str) -> Any:
    """An Ed25519 public key from one ``ssh-ed25519 AAAA...`` line; ValueError if it is not."""
    serialization, ed25519 = _crypto()
    parts = line.split()
    if len(parts) < 2 or parts[0] != SSH_ED25519:
        raise ValueError(f"not an {SSH_ED25519} public key")
    try:
        key = serialization.load_ssh_public_key(f"{parts[0]} {parts[1]}".encode())
    except (ValueError, binascii.Error, UnicodeEncodeError):
        raise ValueError(f"not an {SSH_ED25519} public key") from None
    if not isinstance(key, ed25519.Ed25519PublicKey):
        raise ValueError(f"not an {SSH_ED25519} public key")
    return key


# ------------------------------------------------------------------ keys --


@dataclass(frozen=True)
class Signer:
    """A builder's private key: signs the manifests it pushes."""

    private_key: Any
    public_line: str  # "ssh-ed25519 AAAA...", no comment

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.public_line)

    def seal(self, key: str, payload: bytes) -> bytes:
        """The envelope that the remote stores as ``manifest.json``."""
        signature = self.private_key.sign(signed_message(key, payload))
        envelope = {
            "format": ENVELOPE_FORMAT,
            "manifest": base64.b64encode(payload).decode(),
            "signer": self.public_line,
            "signature": base64.b64encode(signature).decode(),
        }
        return json.dumps(envelope, indent=1, sort_keys=True).encode()


def generate_key(path: Path, comment: str = "acache") -> str:
    """Write a new private key to ``path`` (0600) and its public line to ``path.pub``.

    Returns the public line. Never overwrites: an existing file is a RemoteError.
    """
    serialization, ed25519 = _crypto()
    path = Path(path)
    pub_path = path.with_name(path.name + ".pub")
    for p in (path, pub_path):
        if os.path.lexists(p):
            raise RemoteError(f"{p} exists; refusing to overwrite a key (choose another path)")
    private = ed25519.Ed25519PrivateKey.generate()
    pem = private.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    public = f"{_public_line(private.public_key())} {comment}".strip()
    try:
        _write_new(path, pem, 0o600)
        _write_new(pub_path, (public + "\n").encode(), 0o644)
    except OSError as e:
        raise RemoteError(f"cannot write key {path}: {e.strerror or e}") from None
    return public


def _write_new(path: Path, data: bytes, mode: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    with open(fd, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def load_signer(path: str | os.PathLike[str]) -> Signer:
    """The private key at ``path``; RemoteError (one line) if unusable or exposed."""
    serialization, ed25519 = _crypto()
    from cryptography.exceptions import UnsupportedAlgorithm

    path = Path(path).expanduser()
    hint = "create one with `acache remote keygen PATH`"
    try:
        st = os.stat(path)  # a mounted secret is often a symlink: follow it
        if not stat.S_ISREG(st.st_mode):
            raise RemoteError(f"signing key {path} is not a regular file")
        data = path.read_bytes()
    except OSError as e:
        raise RemoteError(f"cannot read signing key {path}: {e.strerror or e}; {hint}") from None
    if st.st_mode & 0o077:
        # As ssh does: a private key others can read is no longer private.
        raise RemoteError(
            f"signing key {path} is accessible by group or others "
            f"(mode {stat.S_IMODE(st.st_mode):04o}); run chmod 600 {path}"
        )
    try:
        if data.lstrip().startswith(b"-----BEGIN OPENSSH PRIVATE KEY-----"):
            private = serialization.load_ssh_private_key(data, password=None)
        else:
            private = serialization.load_pem_private_key(data, password=None)
    except TypeError:  # the key is encrypted: a password would be asked on every build
        raise RemoteError(
            f"signing key {path} is encrypted; acache needs an unencrypted key (mode 0600)"
        ) from None
    except (ValueError, binascii.Error, UnsupportedAlgorithm):
        raise RemoteError(
            f"signing key {path} is not a PEM or OpenSSH private key; {hint}"
        ) from None
    if not isinstance(private, ed25519.Ed25519PrivateKey):
        raise RemoteError(f"signing key {path} is not an Ed25519 key; {hint}")
    return Signer(private, _public_line(private.public_key()))


def load_trusted_keys(paths: Iterable[str | os.PathLike[str]]) -> dict[bytes, str]:
    """Raw public key -> fingerprint, from files of ``ssh-ed25519`` lines."""
    keys: dict[bytes, str] = {}
    for raw_path in paths:
        path = Path(raw_path).expanduser()
        raw = read_small_file(path, "trusted keys file", RemoteError, max_bytes=1 << 20)
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise RemoteError(f"cannot read trusted keys file {path}: {e}") from None
        for n, line in enumerate(text.splitlines(), 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            try:
                key = parse_public_key(line)
            except ValueError as e:
                raise RemoteError(f"trusted keys file {path}, line {n}: {e}") from None
            keys[_raw(key)] = fingerprint(line)
    return keys


def split_paths(value: str | None) -> list[str]:
    """``ACACHE_TRUSTED_KEYS`` / ``--trusted-keys``: comma-separated paths."""
    return [p.strip() for p in (value or "").split(",") if p.strip()]


# ---------------------------------------------------------------- trust --


@dataclass(frozen=True)
class Opened:
    """A remote manifest object, unwrapped; nothing here has been trusted yet."""

    payload: bytes  # the manifest bytes
    signer: str | None  # the signer's fingerprint; None if unsigned
    signature_ok: bool  # the signature verifies under the signer's key (False if unsigned)
    signer_raw: bytes | None = None
    envelope: dict[str, Any] | None = None  # the signed envelope, kept in the provenance


def open_envelope(data: bytes, key: str) -> Opened:
    """Unwrap a remote manifest object; UntrustedEntry if it is a malformed envelope."""
    try:
        obj = parse(data, limit=ENVELOPE_MAX_BYTES)  # base64 of a manifest, and a signature
    except ValueError:
        obj = None
    if not (isinstance(obj, dict) and "format" in obj):
        return Opened(data, None, False)  # a plain manifest: unsigned
    short = key[:12]
    if obj.get("format") != ENVELOPE_FORMAT:
        raise UntrustedEntry(f"remote entry {short} has an unknown envelope {obj.get('format')!r}")
    try:
        payload = base64.b64decode(obj["manifest"], validate=True)
        signature = base64.b64decode(obj["signature"], validate=True)
        public = parse_public_key(str(obj["signer"]))
    except (KeyError, TypeError, ValueError, binascii.Error):
        raise UntrustedEntry(f"remote entry {short} has a malformed signature envelope") from None
    from cryptography.exceptions import InvalidSignature

    try:
        public.verify(signature, signed_message(key, payload))
        ok = True
    except InvalidSignature:
        ok = False
    envelope = {k: obj[k] for k in ("format", "manifest", "signer", "signature")}
    return Opened(payload, fingerprint(str(obj["signer"])), ok, _raw(public), envelope)


@dataclass(frozen=True)
class Trust:
    """Which remote entries this host uses: signed by one of ``keys``, or any if allow_unsigned."""

    keys: dict[bytes, str] = field(default_factory=dict)  # raw public key -> fingerprint
    allow_unsigned: bool = False

    def check(self, key: str, opened: Opened) -> None:
        """UntrustedEntry (one line) unless this host may use the entry."""
        short = key[:12]
        if opened.signer is not None and not opened.signature_ok:
            # Refused even with allow_unsigned: it is damage or tampering, and an
            # attacker who could use it could as easily have stripped the signature.
            raise UntrustedEntry(
                f"remote entry {short} has a signature by {opened.signer} that does not "
                "verify (tampered or damaged; a builder's next build of it replaces it)"
            )
        if self.allow_unsigned:
            return
        if opened.signer is None:
            raise UntrustedEntry(
                f"remote entry {short} is unsigned (--remote-trust-unsigned uses such entries)"
            )
        if opened.signer_raw not in self.keys:
            raise UntrustedEntry(
                f"remote entry {short} is signed by {opened.signer}, which is not a trusted key "
                "(add its public key to ACACHE_TRUSTED_KEYS, or pass --remote-trust-unsigned)"
            )


def load_trust(
    trusted_key_files: Iterable[str | os.PathLike[str]],
    *,
    signer: Signer | None = None,
    allow_unsigned: bool = False,
) -> Trust:
    """The keys in ``trusted_key_files``, plus the host's own signing key if it has one."""
    _crypto()
    keys = load_trusted_keys(trusted_key_files)
    if signer is not None:
        keys[_raw(signer.private_key.public_key())] = signer.fingerprint
    return Trust(keys, allow_unsigned)


def trust_from(
    signing_key: str | os.PathLike[str] | None = None,
    trusted_keys: str | Iterable[str | os.PathLike[str]] | None = None,
    trust_unsigned: bool | None = None,
) -> Trust:
    """Today's trust, as ``configure`` reads it, without requiring any key.

    What a local store checks pulled entries against before serving them
    (revocation). Reads no key file, and needs no cryptography, when nothing is set.
    """
    return configure(signing_key, trusted_keys, trust_unsigned, require=False)[1]


def configure(
    signing_key: str | os.PathLike[str] | None = None,
    trusted_keys: str | Iterable[str | os.PathLike[str]] | None = None,
    trust_unsigned: bool | None = None,
    *,
    require: bool = True,
) -> tuple[Signer | None, Trust]:
    """A host's signer and trust; each argument left None comes from its variable.

    ACACHE_SIGNING_KEY (a private key path), ACACHE_TRUSTED_KEYS (comma-separated
    trusted-keys files), ACACHE_REMOTE_TRUST_UNSIGNED (1/true/yes). A host that
    could never use a pulled entry (no key trusted, unsigned not allowed) is a
    RemoteError, since every pull would be refused.
    """
    if signing_key is None:
        signing_key = settings.raw("ACACHE_SIGNING_KEY").strip() or None
    if trusted_keys is None:
        trusted_keys = settings.get("ACACHE_TRUSTED_KEYS")
    if trust_unsigned is None:
        trust_unsigned = settings.get("ACACHE_REMOTE_TRUST_UNSIGNED")
    if trusted_keys is None or isinstance(trusted_keys, str):
        trusted_keys = split_paths(trusted_keys)
    if not require and not signing_key and not trusted_keys:
        return None, Trust({}, trust_unsigned)  # nothing to read: no cryptography needed
    _crypto()
    signer = load_signer(signing_key) if signing_key else None
    trust = load_trust(trusted_keys, signer=signer, allow_unsigned=trust_unsigned)
    if require and not trust.keys and not trust.allow_unsigned:
        raise RemoteError(
            "the remote tier needs keys: set ACACHE_TRUSTED_KEYS (files of ssh-ed25519 "
            "lines) to use signed entries, ACACHE_SIGNING_KEY on a builder, or "
            "--remote-trust-unsigned / ACACHE_REMOTE_TRUST_UNSIGNED=1 to skip the check"
        )
    return signer, trust
