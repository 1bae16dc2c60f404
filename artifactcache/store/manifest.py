"""The one schema of ``manifest.json``: every manifest is checked by :func:`problem`.

It runs wherever a manifest is read: each load (``LocalStore._verify``), each scan
(``ls``, ``stats``, ``gc``; a malformed entry is a warning there, never a crash),
``publish_dir`` (bundle import, remote pull), and the remote's ``read_manifest``
before a pull downloads anything. Plain Python on purpose: the store imports
neither torch nor a validation library.

Fields (docs/cache.md shows a manifest)::

    key             the 64-hex key; must be the key it is stored under
    files           {relpath: {"size": int >= 0, "digest": "blake3:<64 hex>"}}
    factors         a dict (bundles and pulls also check that it hashes to key)
    layout          1                        label, meta   dicts (or absent)
    created         finite number            build_seconds finite number >= 0
    arch_key        str or null              acache_version str
    depends_on      [64-hex keys]            provenance    see below (local only)

A relpath is a relative POSIX path: no leading ``/``, no ``.``, ``..`` or empty
part, no backslash or NUL, not ``manifest.json``, and no file that is also
another file's folder. ``meta`` is the backend's, but the fields that name files
of the entry (:data:`FILE_FIELDS`) must name listed files; loaders open them only
through :func:`artifactcache.store.entry.entry_file`.

``provenance`` says where the local copy came from; the local store writes it
when the entry arrives and never takes it from an incoming manifest::

    {"source": "built"}
    {"source": "pulled", "remote": url, "signer": fingerprint | None, "envelope": {...}}
    {"source": "imported", "bundle": name, "signer": fingerprint | None, "envelope": {...}}

``envelope`` (present iff there is a signer) is the signed envelope the entry came
with (signing.py), kept so that an export carries a signature an importer can check.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

MANIFEST = "manifest.json"
LAYOUT = 1
# Every size limit on a manifest, here and derived from one number.
# A manifest alone (pushed, signed, in a bundle): each file costs ~150 bytes, so this is
# tens of thousands of files (an Inductor entry carries a few thousand at most).
MAX_BYTES = 8 << 20
# A remote manifest object: the signed envelope holds the manifest in base64 (4/3 of its
# size), a signature and a public key.
ENVELOPE_MAX_BYTES = 2 * MAX_BYTES
# A local manifest.json (and a bundle's, which export writes from it): the manifest,
# indented, plus the envelope a pulled or signed-imported entry keeps in its provenance.
# The local store refuses to publish a manifest.json larger than this, so every entry
# it publishes loads again.
STORED_MAX_BYTES = 2 * MAX_BYTES + ENVELOPE_MAX_BYTES
SOURCES = ("built", "pulled", "imported")
# meta fields whose string values name files of the entry: aoti's {"step": relpath}
# and the module aoti backend's library. Inductor's "steps" maps names to sizes (ints).
FILE_FIELDS = ("library", "steps")

_KEY = re.compile("[0-9a-f]{64}")
_DIGEST = re.compile("blake3:[0-9a-f]{64}")
_FINGERPRINT = re.compile("SHA256:[A-Za-z0-9+/]{43}")
_MAX_SIZE = 1 << 62


def parse(data: bytes, limit: int = MAX_BYTES) -> Any:
    """JSON of a manifest (or, with a larger limit, an envelope); ValueError if
    oversized, malformed or nested too deeply."""
    if len(data) > limit:
        raise ValueError(f"{len(data)} bytes, more than the {limit} a manifest may have")
    try:
        return json.loads(data)
    except RecursionError:
        raise ValueError("nested too deeply") from None


def path_problem(rel: Any) -> str | None:
    """Why ``rel`` cannot name a file inside an entry, or None."""
    if not isinstance(rel, str):
        return f"{rel!r} is not a path"
    parts = rel.split("/")
    if (
        rel == MANIFEST
        or rel.startswith("/")
        or "\\" in rel
        or "\0" in rel
        or any(p in ("", ".", "..") for p in parts)
    ):
        return f"unsafe path {rel!r}"
    return None


def _number(m: dict, field: str, *, minimum: float | None = None) -> str | None:
    v = m.get(field, 0.0)
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    if not ok or (minimum is not None and v < minimum):
        return f"manifest.json has a malformed {field} ({v!r:.40})"
    return None


def _files_problem(files: Any) -> str | None:
    if not isinstance(files, dict):
        return "manifest.json has no file list"
    for rel, info in files.items():
        if why := path_problem(rel):
            return f"manifest.json lists an {why}"
        if not isinstance(info, dict):
            return f"manifest.json has no size for {rel}"
        size = info.get("size")
        if not (isinstance(size, int) and not isinstance(size, bool) and 0 <= size < _MAX_SIZE):
            return f"manifest.json has no size for {rel}"
        if not (isinstance(info.get("digest"), str) and _DIGEST.fullmatch(info["digest"])):
            return f"manifest.json has no blake3 digest for {rel}"
    folders = {"/".join(rel.split("/")[:i]) for rel in files for i in range(1, rel.count("/") + 1)}
    if both := sorted(folders & set(files)):
        return f"manifest.json lists {both[0]!r} as a file and as a folder"
    return None


def _meta_problem(meta: Any, files: dict) -> str | None:
    if not isinstance(meta, dict):
        return "manifest.json has a malformed meta"
    for field in FILE_FIELDS:
        value = meta.get(field)
        if value is None:
            continue
        if field == "steps" and isinstance(value, dict):
            named = [v for v in value.values() if isinstance(v, str)]
        elif isinstance(value, str):
            named = [value]
        else:
            return f"manifest.json has a malformed meta.{field}"
        for rel in named:
            if why := path_problem(rel):
                return f"manifest.json meta.{field} names an {why}"
            if rel not in files:
                return f"manifest.json meta.{field} names {rel!r}, which is not one of its files"
    return None


def provenance_problem(prov: Any) -> str | None:
    if not (isinstance(prov, dict) and prov.get("source") in SOURCES):
        return "manifest.json has a malformed provenance"
    signer = prov.get("signer")
    if signer is not None and not (isinstance(signer, str) and _FINGERPRINT.fullmatch(signer)):
        return "manifest.json has a malformed provenance signer"
    if not all(isinstance(prov.get(f, ""), str) for f in ("remote", "bundle")):
        return "manifest.json has a malformed provenance"
    envelope = prov.get("envelope")
    if envelope is not None and not (isinstance(envelope, dict) and signer is not None):
        return "manifest.json has a malformed provenance envelope"
    return None


def problem(manifest: Any, key: str) -> str | None:
    """Why ``manifest`` is not a usable manifest of entry ``key``, or None."""
    if not isinstance(manifest, dict) or manifest.get("key") != key:
        return "manifest.json does not describe this key"
    files = manifest.get("files")
    if why := _files_problem(files):
        return why
    if manifest.get("layout", LAYOUT) != LAYOUT:
        return f"manifest.json has an unsupported layout {manifest.get('layout')!r:.20}"
    if not isinstance(manifest.get("factors"), dict):
        return "manifest.json has no factors"
    if manifest.get("label") is not None and not isinstance(manifest["label"], dict):
        return "manifest.json has a malformed label"
    if why := _meta_problem(manifest.get("meta", {}), files):
        return why
    for field, minimum in (("created", None), ("build_seconds", 0.0)):
        if why := _number(manifest, field, minimum=minimum):
            return why
    for field in ("arch_key", "acache_version"):
        if not isinstance(manifest.get(field, ""), (str, type(None))):
            return f"manifest.json has a malformed {field}"
    deps = manifest.get("depends_on", [])
    if not (isinstance(deps, list) and all(isinstance(d, str) and _KEY.fullmatch(d) for d in deps)):
        return "manifest.json has a malformed depends_on"
    if "provenance" in manifest and (why := provenance_problem(manifest["provenance"])):
        return why
    return None


def content(manifest: dict[str, Any]) -> dict[str, Any]:
    """The manifest without its local provenance: what is signed, pushed and compared."""
    return {k: v for k, v in manifest.items() if k != "provenance"}
