"""The manifest schema: one check for every manifest that arrives or is read, and the
helper through which loaders open the files a manifest names."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from artifactcache.errors import IntegrityError
from artifactcache.store.entry import check_manifest
from artifactcache.store.keyformat import compute_key
from artifactcache.store.local import LocalStore

FACTORS = {"schema": 1, "manifest": "test"}
KEY = compute_key(FACTORS)


def _built(store: LocalStore, meta: dict | None = None):
    def build(d: Path) -> dict:
        (d / "prefill.so").write_bytes(b"\x7fELF prefill")
        (d / "sub").mkdir()
        (d / "sub" / "decode.so").write_bytes(b"\x7fELF decode")
        return meta or {"steps": {"prefill": "prefill.so", "decode": "sub/decode.so"}}

    entry, _ = store.get_or_build(KEY, FACTORS, build)
    return entry


@pytest.fixture
def manifest(cache_dir) -> dict:
    return json.loads(json.dumps(_built(LocalStore(cache_dir)).manifest))


def _set(path: str, value):
    def mutate(m: dict) -> None:
        *parents, last = path.split(".")
        for p in parents:
            m = m[p]
        m[last] = value

    return mutate


def _file(rel: str, info: dict):
    return lambda m: m["files"].__setitem__(rel, info)


def _drop(field: str):
    return lambda m: m.pop(field)


MALFORMED = {
    "created-a-word": _set("created", "yesterday"),
    "created-nan": _set("created", float("nan")),
    "created-bool": _set("created", True),
    "build_seconds-negative": _set("build_seconds", -1.0),
    "build_seconds-inf": _set("build_seconds", float("inf")),
    "size-a-string": _file("prefill.so", {"size": "12", "digest": "blake3:" + "0" * 64}),
    "size-bool": _file("prefill.so", {"size": True, "digest": "blake3:" + "0" * 64}),
    "size-negative": _file("prefill.so", {"size": -1, "digest": "blake3:" + "0" * 64}),
    "digest-short": _file("prefill.so", {"size": 12, "digest": "blake3:00"}),
    "label-a-list": _set("label", ["recipe"]),
    "meta-a-string": _set("meta", "x"),
    "factors-missing": _drop("factors"),
    "factors-a-list": _set("factors", [1]),
    "arch_key-a-number": _set("arch_key", 7),
    "acache_version-a-number": _set("acache_version", 1),
    "layout-unknown": _set("layout", 99),
    "file-and-dir": _file("sub", {"size": 1, "digest": "blake3:" + "0" * 64}),
    "backslash-path": _file("a\\b", {"size": 1, "digest": "blake3:" + "0" * 64}),
    "provenance-a-string": _set("provenance", "built"),
    "provenance-unknown-source": _set("provenance", {"source": "elsewhere"}),
    "meta-steps-absolute": _set("meta.steps.prefill", "/usr/lib/evil.so"),
    "meta-steps-dotdot": _set("meta.steps.prefill", "../other/prefill.so"),
    "meta-steps-unlisted": _set("meta.steps.prefill", "not-in-the-entry.so"),
    "meta-library-absolute": _set("meta.library", "/tmp/evil.so"),
    "meta-library-not-a-string": _set("meta.library", ["prefill.so"]),
}


@pytest.mark.parametrize("mutate", MALFORMED.values(), ids=MALFORMED.keys())
def test_the_schema_refuses_a_field_of_the_wrong_type_or_an_unsafe_path(manifest, mutate):
    m = json.loads(json.dumps(manifest))
    mutate(m)
    assert check_manifest(m, KEY), "accepted a malformed manifest"


def test_the_schema_accepts_what_the_store_writes(manifest):
    assert check_manifest(manifest, KEY) is None
    legacy = {k: v for k, v in manifest.items() if k != "provenance"}  # written before it
    assert check_manifest(legacy, KEY) is None
    inductor_like = {**manifest, "meta": {"steps": {"prefill.pt2": 12}}}  # sizes, not paths
    assert check_manifest(inductor_like, KEY) is None


def test_entry_file_resolves_only_listed_files_inside_the_entry(cache_dir, tmp_path):
    from artifactcache.store.entry import entry_file

    entry = _built(LocalStore(cache_dir))
    assert entry.file("sub/decode.so") == entry.path / "sub" / "decode.so"
    assert entry_file(entry.path, "prefill.so") == entry.path / "prefill.so"
    outside = tmp_path / "evil.so"
    outside.write_bytes(b"evil")
    (entry.path / "sub" / "link.so").symlink_to(outside)
    for rel in (str(outside), "../" + entry.key + "/prefill.so", "sub/link.so", "", ".",
                "sub/../prefill.so", "manifest.json", 3, None, "nope.so"):  # fmt: skip
        with pytest.raises(IntegrityError):
            entry_file(entry.path, rel)  # type: ignore[arg-type]
    os.unlink(entry.path / "sub" / "link.so")
    # A listed file swapped for a symlink after verification is refused too.
    os.replace(entry.path / "prefill.so", tmp_path / "moved.so")
    (entry.path / "prefill.so").symlink_to(outside)
    with pytest.raises(IntegrityError, match="prefill.so"):
        entry_file(entry.path, "prefill.so")
