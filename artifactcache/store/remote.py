"""The remote tier: a shared S3 bucket in front of which every host keeps its LocalStore.

Remote layout under ``s3://bucket/prefix``::

    v1/<key>/manifest.json          the manifest in a signed envelope (signing.py); written LAST
    v1/<key>/<tree>/<relpath>       the entry's files; <tree> = sha256 of {relpath: digest}[:16]

Files go up first and the manifest last, with a conditional put (If-None-Match:
``*``), so a reader that finds a manifest finds every file it names, and the
first manifest to land wins. Files sit under a ``<tree>`` directory named by
their digests: two hosts whose builds of one key differ byte-wise (torch.compile
is not always deterministic) write to different trees and can never overwrite
each other's files under the winning manifest; hosts with identical builds write
identical bytes to the same tree. The loser of a race deletes its own tree.

A pushed manifest is signed with the builder's Ed25519 key (``signing.py``): the
remote ``manifest.json`` is then an envelope around the manifest bytes. A reader
checks the signature against the keys it trusts before it downloads a file, and
a pull downloads into a local staging dir where ``LocalStore.publish_dir`` checks
every file against the manifest's digests before the entry appears locally. A
remote failure in a build or load path is one warning line, a ``remote_error``
stat, and a miss (``tiered.py``). docs/remote.md names the test behind each of
these promises.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Protocol

from ..errors import IntegrityError, RemoteError
from . import manifest as schema
from . import provenance, signing
from .entry import Entry, check_manifest
from .keyformat import compute_key, is_full_key
from .s3 import S3Store, parse_url
from .signing import Opened, Signer, Trust

__all__ = [
    "RemoteStore",
    "S3Store",
    "check_remote",
    "fetch_manifest",
    "list_entries",
    "list_remote",
    "parse_url",
    "pull_entry",
    "push_entry",
    "read_manifest",
]

LAYOUT_DIR = "v1"
MANIFEST = "manifest.json"
# Tests set this to act between push stages ("file:<relpath>", "manifest"); None in normal use.
PUSH_HOOK: Callable[[str], None] | None = None


class RemoteStore(Protocol):
    """Object access the tier needs; paths are relative to the remote's prefix."""

    url: str

    def get(self, path: str, *, limit: int) -> bytes | None: ...
    def put(self, path: str, data: bytes, *, create: bool = False) -> bool: ...
    def exists(self, path: str) -> bool: ...
    def list(self, prefix: str = "", *, dirs: bool = False) -> list[str]: ...
    def delete(self, paths: list[str]) -> None: ...
    def check(self) -> dict[str, Any]: ...
    def upload_file(self, path: str, src: Path, size: int, digest: str) -> None: ...
    def download_file(self, path: str, dest: Path, size: int) -> None: ...


# ------------------------------------------------------------- layout --


def tree_id(manifest: dict[str, Any]) -> str:
    files = {rel: info["digest"] for rel, info in manifest["files"].items()}
    return hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()[:16]


def manifest_path(key: str) -> str:
    return f"{LAYOUT_DIR}/{key}/{MANIFEST}"


def file_path(key: str, tree: str, rel: str) -> str:
    return f"{LAYOUT_DIR}/{key}/{tree}/{rel}"


def _hook(stage: str) -> None:
    if PUSH_HOOK is not None:
        PUSH_HOOK(stage)


# Files up to this size move several at a time (a compiled package can hold dozens
# of small files, each a round trip); bigger ones one at a time, each with parallel parts.
SMALL_FILE = 16 << 20
FILE_CONCURRENCY = 8


def _for_each_file(fn: Callable[[str, dict], None], files: dict[str, dict]) -> None:
    items = sorted(files.items())
    small = [(r, i) for r, i in items if int(i["size"]) <= SMALL_FILE]
    with ThreadPoolExecutor(FILE_CONCURRENCY) as pool:
        futures = [pool.submit(fn, r, i) for r, i in small]
        try:
            for fut in futures:
                fut.result()
        except BaseException:
            for fut in futures:
                fut.cancel()  # fail fast: do not start the rest against a broken remote
            raise
    for rel, info in items:
        if int(info["size"]) > SMALL_FILE:
            fn(rel, info)


# ---------------------------------------------------- manifest helpers --


def read_manifest(remote: RemoteStore, key: str) -> tuple[dict[str, Any], Opened] | None:
    """The remote manifest of ``key`` and its signature, None if absent.

    IntegrityError if the object is unusable. The signature is NOT checked against
    any trust: for listing and housekeeping only, never for a pull.
    """
    data = remote.get(manifest_path(key), limit=schema.ENVELOPE_MAX_BYTES)
    if data is None:
        return None
    opened = signing.open_envelope(data, key)
    try:
        manifest = schema.parse(opened.payload)
    except ValueError:
        raise IntegrityError(f"remote manifest of {key[:12]} is not valid JSON") from None
    if problem := check_manifest(manifest, key):
        raise IntegrityError(f"remote manifest of {key[:12]} is unusable ({problem})")
    # As for bundles: a manifest may only name the key its own factors hash to, so a
    # writable bucket cannot plant an artifact under another entry's key.
    try:
        ok = compute_key(manifest["factors"]) == key
    except (KeyError, TypeError):
        ok = False
    if not ok:
        raise IntegrityError(f"remote manifest of {key[:12]}: its factors do not hash to the key")
    return manifest, opened


def fetch_manifest(remote: RemoteStore, key: str, trust: Trust) -> dict[str, Any] | None:
    """The remote manifest of ``key`` if ``trust`` accepts its signature, None if absent.

    IntegrityError if unusable, UntrustedEntry (an IntegrityError) if unsigned or
    not signed by a trusted key.
    """
    found = read_manifest(remote, key)
    if found is None:
        return None
    manifest, opened = found
    trust.check(key, opened)
    return manifest


def push_entry(
    remote: RemoteStore,
    entry: Entry,
    *,
    signer: Signer | None,
    trust: Trust,
    replace: bool = False,
) -> str:
    """Upload files, then the manifest; "pushed", or "exists" when a manifest was there first.

    The manifest is signed by ``signer`` (None: pushed unsigned, the caller's
    choice). Every file is hashed while it is uploaded and must match the manifest
    (IntegrityError otherwise). ``replace`` overwrites the remote copy (a repair,
    when a remote file is known to be corrupt). A remote manifest that does not
    parse, or that ``trust`` refuses (unsigned, or signed by a key this host does
    not trust), is replaced always: this host would not use it either.
    """
    key, manifest = entry.key, entry.manifest
    old: dict[str, Any] | None = None
    try:
        old = fetch_manifest(remote, key, trust)
    except IntegrityError:
        replace = True  # unusable or untrusted here: a verified, signed copy takes its place
        with contextlib.suppress(IntegrityError):
            old = (read_manifest(remote, key) or (None,))[0]  # for deleting its files below
    if old is not None and not replace:
        return "exists"  # first manifest wins, whatever its bytes
    tree = tree_id(manifest)
    # Provenance is this host's record of the entry, not part of it: never signed or sent.
    data = json.dumps(schema.content(manifest), indent=1, sort_keys=True).encode()
    if len(data) > schema.MAX_BYTES:  # no host would pull it: refused before any upload
        raise IntegrityError(
            f"push of {key[:12]} refused: its manifest is {len(data)} bytes, more than the "
            f"{schema.MAX_BYTES} a remote manifest may have"
        )

    def upload(rel: str, info: dict) -> None:
        remote.upload_file(
            file_path(key, tree, rel), entry.path / rel, info["size"], info["digest"]
        )
        _hook(f"file:{rel}")

    _for_each_file(upload, manifest["files"])
    _hook("manifest")
    if signer is not None:
        data = signer.seal(key, data)
    if remote.put(manifest_path(key), data, create=not replace):
        if old is not None and tree_id(old) != tree:  # replaced: its files are garbage now
            remote.delete([file_path(key, tree_id(old), rel) for rel in old["files"]])
        return "pushed"
    # Lost the race: another host's manifest landed between our check and our put.
    try:
        winner = (read_manifest(remote, key) or (None,))[0]
    except IntegrityError:
        winner = None
    if winner is not None and tree_id(winner) != tree:
        remote.delete([file_path(key, tree, rel) for rel in manifest["files"]])
    return "exists"


def pull_entry(remote: RemoteStore, local: Any, key: str, trust: Trust) -> Entry | None:
    """Download ``key`` into staging, verify it, publish it locally; None if the remote lacks it.

    The signature is checked before any file is downloaded: UntrustedEntry when
    ``trust`` refuses it, IntegrityError when the manifest or any file is corrupt;
    either way nothing is published.
    """
    found = read_manifest(remote, key)
    if found is None:
        return None
    manifest, opened = found
    trust.check(key, opened)
    tree = tree_id(manifest)
    with local.new_staging_dir() as staging:
        for rel in manifest["files"]:
            try:
                (staging / rel).parent.mkdir(parents=True, exist_ok=True)
            except OSError:  # "a" and "a/b" both listed: not a tree we can publish
                raise IntegrityError(f"remote manifest of {key[:12]} lists {rel!r} twice") from None

        def download(rel: str, info: dict) -> None:
            remote.download_file(file_path(key, tree, rel), staging / rel, int(info["size"]))

        _for_each_file(download, manifest["files"])
        # Checks every digest, or publishes nothing; the provenance records the signer.
        entry = local.publish_dir(
            staging, manifest, provenance=provenance.pulled(remote.url, opened)
        )
    local.record("pulled", key, entry.build_seconds, entry.size)
    return entry


def list_entries(remote: RemoteStore) -> list[dict[str, Any]]:
    """One row per remote key: complete entries carry their manifest's summary and signer.

    ``signature`` is the signer's fingerprint, "unsigned", or "invalid"; whether
    a host trusts that signer is for the host to say (a pull checks it).
    """
    keys = sorted(k for k in remote.list(LAYOUT_DIR, dirs=True) if is_full_key(k))

    def row(key: str) -> dict[str, Any]:
        try:
            found = read_manifest(remote, key)
        except IntegrityError as e:
            return {"key": key, "complete": False, "problem": str(e)}
        if found is None:  # files without a manifest: an upload in progress or abandoned
            return {"key": key, "complete": False, "problem": "no manifest"}
        m, opened = found
        files = m["files"]
        if opened.signer is None:
            signature = "unsigned"
        else:
            signature = opened.signer if opened.signature_ok else "invalid"
        return {
            "key": key,
            "complete": True,
            "label": m.get("label") or {},
            "size": sum(int(f["size"]) for f in files.values()),
            "files": len(files),
            "created": float(m.get("created", 0.0)),
            "build_seconds": float(m.get("build_seconds", 0.0)),
            "signature": signature,
        }

    with ThreadPoolExecutor(8) as pool:
        return list(pool.map(row, keys))


# ---------------------------------------------------------- entry points --


def open_remote(url: str) -> S3Store:
    """The remote for ``url`` (s3://bucket/prefix); RemoteError if the URL is malformed."""
    return S3Store(url)


def list_remote(url: str) -> list[dict[str, Any]]:
    return list_entries(open_remote(url))


def check_remote(url: str) -> dict[str, Any]:
    """For `acache doctor`: {url, reachable, readable, writable, error}; never raises."""
    try:
        remote = open_remote(url)
    except RemoteError as e:
        return {
            "url": url,
            "reachable": False,
            "readable": False,
            "writable": False,
            "error": str(e),
        }
    res = remote.check()
    return {k: res[k] for k in ("url", "reachable", "readable", "writable", "error")}
