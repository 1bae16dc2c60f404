"""Fuzzing the manifest and bundle readers with hypothesis (bounded: CI runs it).

Real manifests and real bundles, made from tiny entries (no compile), are mutated
at the JSON level, at the byte level and at the tar-member level. Whatever comes
in, the readers raise nothing but AcacheError subclasses, write nothing outside
the cache root (and, on a refusal, nothing outside its staging area), and read no
more bytes from a bundle than it holds.
"""

from __future__ import annotations

import copy
import io
import json
import os
import shutil
import tarfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from artifactcache.errors import AcacheError
from artifactcache.store.bundle import export, import_bundle
from artifactcache.store.entry import Entry, EntryInfo, check_manifest
from artifactcache.store.keyformat import compute_key
from artifactcache.store.local import LocalStore
from artifactcache.store.manifest import parse

FUZZ = settings(
    max_examples=200,
    deadline=None,
    database=None,  # nothing written into the working tree
    derandomize=True,  # the same examples on every run: a failure reproduces
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
FACTORS = {"schema": 1, "fuzz": 1}
KEY = compute_key(FACTORS)

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=12)
    | st.sampled_from(["/etc/passwd", "../x", "a/../b", "", ".", "manifest.json", "blake3:"]),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=6,
)


def _build(d: Path) -> dict:
    (d / "model.bin").write_bytes(b"weights" * 50)
    (d / "sub").mkdir()
    (d / "sub" / "lib.so").write_bytes(b"\x7fELF")
    return {"library": "sub/lib.so", "steps": {"prefill": "sub/lib.so"}}


@pytest.fixture(scope="module")
def template(tmp_path_factory) -> dict[str, Any]:
    """A store holding one entry, its manifest, and a bundle of it."""
    base = tmp_path_factory.mktemp("fuzz-template")
    root = base / "cache"
    entry, _ = LocalStore(root).get_or_build(KEY, FACTORS, _build, label={"recipe": "r"})
    export(LocalStore(root), [KEY], base / "b.tar")
    return {"root": root, "manifest": entry.manifest, "bundle": base / "b.tar"}


def _paths(obj: Any, at: tuple = ()) -> Iterator[tuple]:
    yield at
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _paths(v, (*at, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _paths(v, (*at, i))


@st.composite
def mutated_manifests(draw, base: dict) -> dict:
    m = copy.deepcopy(base)
    for _ in range(draw(st.integers(1, 4))):
        path = draw(st.sampled_from([p for p in _paths(m) if p]))
        parent = m
        for p in path[:-1]:
            parent = parent[p]
        action = draw(st.sampled_from(["replace", "delete", "add"]))
        if action == "delete" and isinstance(parent, dict):
            del parent[path[-1]]
        elif action == "add" and isinstance(parent, dict):
            parent[draw(st.text(max_size=10))] = draw(json_values)
        else:
            parent[path[-1]] = draw(json_values)
    return m


def _snapshot(top: Path, skip: Path) -> dict[str, int]:
    out = {}
    for p in sorted(top.rglob("*")):
        if skip == p or skip in p.parents:
            continue
        out[str(p)] = p.lstat().st_size
    return out


@pytest.fixture
def workdir(tmp_path) -> Iterator[Path]:
    yield tmp_path


def _fresh(workdir: Path) -> Path:
    d = workdir / uuid.uuid4().hex
    d.mkdir()
    return d


# ------------------------------------------------------------- manifests --


@FUZZ
@given(data=st.data())
def test_mutated_manifests_are_refused_or_usable_never_a_crash(template, workdir, data):
    m = data.draw(mutated_manifests(template["manifest"]))
    problem = check_manifest(m, KEY)
    assert problem is None or isinstance(problem, str)
    if problem is None:  # everything ls, show and gc read of it works
        e = Entry(KEY, Path("/nonexistent"), m)
        json.dumps(e.summary(), allow_nan=False)
        EntryInfo.record(m)
    # The same manifest inside a real cache: every reader either uses it or skips it.
    d = _fresh(workdir)
    root = d / "cache"
    shutil.copytree(template["root"], root)
    (root / "v1" / "state" / "index.json").unlink(missing_ok=True)
    manifest_file = root / "v1" / "entries" / KEY[:2] / KEY / "manifest.json"
    manifest_file.write_text(json.dumps(m))
    store = LocalStore(root)
    entries, warnings = store.ls()
    assert [e.key for e in entries] == ([KEY] if problem is None else [])
    assert bool(warnings) == (problem is not None)
    store.scan()
    store.stats()
    store.gc_plan(max_size=0)
    for name in ("peek", "open"):
        try:
            getattr(store, name)(KEY)
        except AcacheError:
            assert problem is not None or name == "open"  # a listed file may no longer match
    assert _snapshot(d, root) == {}


@FUZZ
@given(cut=st.integers(0, 4000), junk=st.binary(max_size=64), depth=st.integers(0, 3000))
def test_manifest_bytes_parse_or_raise_value_error(template, cut, junk, depth):
    raw = json.dumps(template["manifest"]).encode()
    for data in (raw[:cut] + junk + raw[cut:], b"[" * depth + b"]" * depth, junk):
        try:
            m = parse(data)
        except ValueError:
            continue
        problem = check_manifest(m, KEY)  # returns, never raises
        assert problem is None or (isinstance(problem, str) and problem and "\n" not in problem)
        if data == raw:
            assert problem is None  # the real manifest, untouched, is accepted
        if problem is None:  # accepted: every reader of a manifest takes it
            json.dumps(Entry(KEY, Path("/nonexistent"), m).summary(), allow_nan=False)
            EntryInfo.record(m)


# --------------------------------------------------------------- bundles --


class _Counting:
    """Counts the bytes the bundle reader takes out of tar members."""

    def __init__(self) -> None:
        self.total = 0

    def wrap(self, real):
        counter = self

        def extractfile(tf, member):
            f = real(tf, member)
            if f is None:
                return None
            read = f.read

            def counted(*args):
                out = read(*args)
                counter.total += len(out)
                return out

            f.read = counted
            return f

        return extractfile


def _import(workdir: Path, data: bytes, monkeypatch) -> None:
    """Import ``data`` as a bundle into a fresh cache and check the invariants."""
    d = _fresh(workdir)
    root = d / "cache"
    store = LocalStore(root)
    bundle = d / "fuzzed.tar"
    bundle.write_bytes(data)
    before = _snapshot(d, root)
    counting = _Counting()
    monkeypatch.setattr(tarfile.TarFile, "extractfile", counting.wrap(tarfile.TarFile.extractfile))
    try:
        keys = import_bundle(store, bundle).imported  # a fresh cache: none already present
    except AcacheError as e:
        assert "\n" not in str(e)
        assert store.scan()[0] == []  # all or nothing
        keys = []
    finally:
        monkeypatch.undo()
    assert _snapshot(d, root) == before  # nothing written outside the cache root
    assert os.listdir(store.base / "staging") == []
    assert counting.total <= len(data)  # never more than the bundle holds
    for key in keys:  # what was imported verifies, and its files are inside its entry
        entry = store.open(key)
        for rel in entry.files:
            assert entry.file(rel).is_relative_to(store.base / "entries")


@FUZZ
@given(data=st.data())
def test_byte_mutated_bundles_are_refused_or_imported_safely(template, workdir, monkeypatch, data):
    raw = bytearray(template["bundle"].read_bytes())
    for _ in range(data.draw(st.integers(1, 6))):
        at = data.draw(st.integers(0, len(raw) - 1))
        op = data.draw(st.sampled_from(["flip", "cut", "insert"]))
        if op == "flip":
            raw[at] ^= data.draw(st.integers(1, 255))
        elif op == "cut":
            del raw[at:]
            break
        else:
            raw[at:at] = data.draw(st.binary(min_size=1, max_size=16))
    _import(workdir, bytes(raw), monkeypatch)


member_names = st.one_of(
    st.sampled_from(["model.bin", "sub/lib.so", "manifest.json", "sub"]).map(
        lambda rel: f"{KEY}/{rel}"
    ),
    st.sampled_from(
        [
            f"{KEY}/../x",
            "/tmp/acache-fuzz-escape",
            f"{KEY}//a",
            f"{KEY}/./a",
            "x" * 64 + "/a",
            f"{KEY}\\a",
            KEY,
            f"{KEY}/sub/lib.so/x",
            f"{'0' * 64}/manifest.json",
        ]
    ),  # fmt: skip
    st.text(min_size=1, max_size=20).map(lambda t: f"{KEY}/{t}"),
)


@FUZZ
@given(data=st.data())
def test_member_mutated_bundles_are_refused_or_imported_safely(
    template, workdir, monkeypatch, data
):
    with tarfile.open(template["bundle"]) as tf:
        members = [(m.name, tf.extractfile(m).read()) for m in tf.getmembers()]  # type: ignore[union-attr]
    for _ in range(data.draw(st.integers(1, 3))):
        i = data.draw(st.integers(0, len(members) - 1))
        op = data.draw(st.sampled_from(["manifest", "rename", "add", "drop", "resize"]))
        name, body = members[i]
        if op == "manifest":
            m = json.dumps(data.draw(mutated_manifests(template["manifest"]))).encode()
            members = [(n, m if n == f"{KEY}/manifest.json" else b) for n, b in members]
        elif op == "rename":
            members[i] = (data.draw(member_names), body)
        elif op == "add":
            members.append((data.draw(member_names), data.draw(st.binary(max_size=32))))
        elif op == "drop" and len(members) > 1:
            members.pop(i)
        else:
            members[i] = (name, body + data.draw(st.binary(min_size=1, max_size=8)))
    kinds = data.draw(st.lists(st.sampled_from([tarfile.REGTYPE] * 4 + [tarfile.SYMTYPE,
                                tarfile.LNKTYPE, tarfile.DIRTYPE, tarfile.FIFOTYPE]),
                                min_size=len(members), max_size=len(members)))  # fmt: skip
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as out:
        for (name, body), kind in zip(members, kinds, strict=True):
            info = tarfile.TarInfo(name)
            info.type = kind
            info.linkname = "/etc/passwd" if kind in (tarfile.SYMTYPE, tarfile.LNKTYPE) else ""
            info.size = len(body) if kind == tarfile.REGTYPE else 0
            out.addfile(info, io.BytesIO(body) if kind == tarfile.REGTYPE else None)
    _import(workdir, buf.getvalue(), monkeypatch)
    assert not Path("/tmp/acache-fuzz-escape").exists()
