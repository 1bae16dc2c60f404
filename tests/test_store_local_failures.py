"""LocalStore under failure: OS errors are not corruption, entries in use or needed stay.

Covers: a transient OSError while verifying (entry kept, one-line error), the
reader lock that keeps gc/rm off an entry being loaded (a real second process),
recorded dependencies that gc and rm respect, and a disk that fills or refuses
writes while building or publishing (nothing half-published).
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from artifactcache.errors import EntryInUse, FilesystemError
from artifactcache.store import _fs
from artifactcache.store.keyformat import compute_key
from artifactcache.store.local import LocalStore

WORKER = str(Path(__file__).with_name("_store_worker.py"))
TRANSIENT = [errno.EACCES, errno.EMFILE, errno.EIO, errno.ENOSPC, errno.EPERM, errno.ENFILE]


def kf(i: int) -> tuple[str, dict]:
    factors = {"schema": 1, "failures": i}
    return compute_key(factors), factors


def writer(payload: bytes = b"artifact" * 512):
    def build(d: Path) -> dict:
        (d / "model.bin").write_bytes(payload)
        (d / "sub").mkdir()
        (d / "sub" / "config.json").write_text("{}")
        return {}

    return build


@pytest.fixture
def store(cache_dir) -> LocalStore:
    return LocalStore(cache_dir)


def _raiser(code: int):
    def fail(path, *a, **k):
        raise OSError(code, os.strerror(code), str(path))

    return fail


def _quarantined(store: LocalStore) -> list[str]:
    return os.listdir(store.base / "quarantine")


# ------------------------------------------------ transient errors in verify --


@pytest.mark.parametrize("where", ["digest_file", "read_small", "walk_files"])
@pytest.mark.parametrize("code", TRANSIENT, ids=errno.errorcode.get)
def test_transient_os_error_during_verify_keeps_the_entry(store, monkeypatch, where, code):
    key, factors = kf(1)
    entry, _ = store.get_or_build(key, factors, writer())
    monkeypatch.setattr(_fs, where, _raiser(code))
    full = LocalStore(store.root, full_verify=True)  # re-hashes, so digest_file is reached
    with pytest.raises(FilesystemError) as err:
        full.get(key)
    msg = str(err.value)
    assert "\n" not in msg and os.strerror(code) in msg and "left in place" in msg
    with pytest.raises(FilesystemError):
        full.get_or_build(key, factors, writer())  # never rebuilt over a good entry
    [res] = store.verify()
    assert not res.ok and not res.quarantined and os.strerror(code) in res.problem
    assert entry.path.is_dir() and _quarantined(store) == []
    monkeypatch.undo()
    assert store.open(key).key == key  # the cause gone, the same entry serves again


def test_a_real_mismatch_still_quarantines(store):
    key, factors = kf(2)
    entry, _ = store.get_or_build(key, factors, writer())
    (entry.path / "sub" / "config.json").write_text("{} ")
    [res] = store.verify()
    assert not res.ok and res.quarantined and "bytes" in res.problem
    assert not entry.path.exists() and len(_quarantined(store)) == 1


def test_manifest_that_is_a_directory_is_corruption(store):
    key, factors = kf(3)
    entry, _ = store.get_or_build(key, factors, writer())
    (entry.path / "manifest.json").unlink()
    (entry.path / "manifest.json").mkdir()
    assert store.get(key) is None and len(_quarantined(store)) == 1


# ------------------------------------------------------- entries in use --


def _start_reader(root: Path, key: str, marker: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen([sys.executable, WORKER, "read", str(root), key, str(marker)], env=env)
    deadline = time.monotonic() + 60
    while not (marker.exists() and "reading" in marker.read_text()):
        assert proc.poll() is None, "reader died"
        assert time.monotonic() < deadline, "reader never started"
        time.sleep(0.01)
    return proc


def test_gc_and_rm_skip_an_entry_another_process_is_loading(store, cache_dir, tmp_path):
    key, factors = kf(4)
    other, other_factors = kf(5)
    entry, _ = store.get_or_build(key, factors, writer())
    store.get_or_build(other, other_factors, writer())
    marker = tmp_path / "marker"
    proc = _start_reader(cache_dir, key, marker)
    try:
        with pytest.raises(EntryInUse, match="being loaded by another process") as err:
            store.remove([key, other])
        assert "\n" not in str(err.value)
        assert entry.path.is_dir() and not store.entry_path(other).exists()  # the other went
        done = store.execute(store.gc_plan(max_size=0))
        assert done.in_use == [key] and done.evicted == [] and entry.path.is_dir()
        assert store.open(key).key == key
    finally:
        (tmp_path / "marker.go").touch()
        assert proc.wait(timeout=60) == 0
    done = store.execute(store.gc_plan(max_size=0))  # the load is over: now it goes
    assert done.evicted == [key] and not entry.path.exists()


def test_api_load_holds_the_reader_lock_until_loaded(store, monkeypatch):
    pytest.importorskip("torch")
    from artifactcache import api
    from artifactcache.backends.eager import backend as eager

    result = api.build("tiny-llama", "eager", store=store)
    seen: list[str] = []
    real_load = eager.EagerBackend.load

    def load(self, ctx, entry_dir, meta):
        status, _ = store._remove(result.key)  # what gc or rm would get right now
        seen.append(status)
        return real_load(self, ctx, entry_dir, meta)

    monkeypatch.setattr(eager.EagerBackend, "load", load)
    api.load("tiny-llama", "eager", store=store)
    assert seen == ["in_use"] and store.entry_path(result.key).is_dir()
    monkeypatch.undo()
    assert store._remove(result.key)[0] == "removed"  # released once load returned


# ---------------------------------------------------------- dependencies --


def _dependent(store: LocalStore, i: int, on: str) -> str:
    key, factors = kf(i)

    def build(d: Path) -> dict:
        store.record_dependency(on)
        return writer()(d)

    entry, _ = store.get_or_build(key, factors, build)
    assert entry.depends_on == (on,)
    assert json.loads((entry.path / "manifest.json").read_text())["depends_on"] == [on]
    return key


def _age(store: LocalStore, key: str, hours_ago: float) -> None:
    t = time.time() - hours_ago * 3600
    os.utime(store.entry_path(key), (t, t))


def test_nested_build_records_dependency_on_the_outer_entry(store):
    dep, dep_factors = kf(10)
    outer, outer_factors = kf(11)

    def build(d: Path) -> dict:
        inner, _ = store.get_or_build(dep, dep_factors, writer())  # like ensure_export
        store.record_dependency(inner.key)
        return writer()(d)

    entry, _ = store.get_or_build(outer, outer_factors, build)
    assert entry.depends_on == (dep,) and store.open(dep).depends_on == ()
    with pytest.raises(RuntimeError):
        store.record_dependency(dep)  # outside any build


def test_gc_never_evicts_a_dependency_while_its_dependent_stays(store):
    dep, dep_factors = kf(12)
    store.get_or_build(dep, dep_factors, writer())
    dependent = _dependent(store, 13, dep)
    loner, loner_factors = kf(14)
    store.get_or_build(loner, loner_factors, writer())
    _age(store, dep, 5)  # the dependency is the least recently used
    _age(store, dependent, 1)
    _age(store, loner, 3)
    plan = store.gc_plan(older_than=2 * 3600)
    assert [e.key for e in plan.entries] == [loner]  # dep is old, but its dependent stays
    size = store.peek(loner).size
    plan = store.gc_plan(max_size=2 * size)  # one must go: not dep, the next LRU
    assert [e.key for e in plan.entries] == [loner]
    plan = store.gc_plan(max_size=size)  # two must go: a dependent may go before its dep
    assert {e.key for e in plan.entries} == {loner, dependent}
    plan = store.gc_plan(max_size=0)  # all must go: the dependent takes dep along
    assert {e.key for e in plan.entries} == {dep, dependent, loner}
    done = store.execute(plan)
    assert done.evicted.index(dependent) < done.evicted.index(dep)  # dependent first
    assert store.scan()[0] == []


def test_gc_keeps_the_dependency_of_a_dependent_it_had_to_keep(store):
    dep, dep_factors = kf(15)
    store.get_or_build(dep, dep_factors, writer())
    dependent = _dependent(store, 16, dep)
    _age(store, dep, 5)
    _age(store, dependent, 4)
    plan = store.gc_plan(older_than=3600)
    assert {e.key for e in plan.entries} == {dep, dependent}
    store.get(dependent)  # a hit after the plan: the dependent stays, so must dep
    done = store.execute(plan)
    assert done.evicted == [] and sorted(done.kept) == sorted([dep, dependent])
    assert store.open(dep) and store.open(dependent)


def test_rm_of_a_dependency_says_what_needs_it(store):
    dep, dep_factors = kf(17)
    store.get_or_build(dep, dep_factors, writer())
    dependent = _dependent(store, 18, dep)
    with pytest.raises(EntryInUse, match=f"needed by entry {dependent[:12]}") as err:
        store.remove([dep])
    assert "\n" not in str(err.value) and store.open(dep)
    assert store.remove([dep, dependent]) > 0  # together, dependent first: fine
    assert store.scan()[0] == []


# --------------------------------------------------- a disk that fills up --


def _leftovers(store: LocalStore) -> list[str]:
    return os.listdir(store.base / "staging") + os.listdir(store.base / "entries")


def test_build_on_a_full_disk_is_one_line_and_publishes_nothing(store):
    key, factors = kf(20)

    def build(d: Path) -> dict:
        (d / "half.bin").write_bytes(b"x" * 100)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(d / "model.bin"))

    with pytest.raises(FilesystemError) as err:
        store.get_or_build(key, factors, build)
    msg = str(err.value)
    assert "\n" not in msg and "No space left on device" in msg and "nothing was cached" in msg
    assert _leftovers(store) == [] and store.get(key) is None


@pytest.mark.parametrize("stage", ["fsync_path", "write_atomic"])
def test_publish_into_a_full_disk_publishes_nothing(store, monkeypatch, stage):
    key, factors = kf(21)
    monkeypatch.setattr(_fs, stage, _raiser(errno.ENOSPC))
    if stage == "write_atomic":  # the memo is best effort: a full disk there is no failure
        entry, _ = store.get_or_build(key, factors, writer())
        assert entry.path.is_dir()
        return
    with pytest.raises(FilesystemError, match="No space left on device"):
        store.get_or_build(key, factors, writer())
    assert _leftovers(store) == []
    staged = store.base / "staging" / "import"
    staged.mkdir()
    (staged / "model.bin").write_bytes(b"x")
    manifest = {
        "key": key,
        "factors": factors,
        "files": {"model.bin": {"size": 1, "digest": _fs.digest_file(staged / "model.bin")[0]}},
    }
    with pytest.raises(FilesystemError, match="No space left on device"):
        store.publish_dir(staged, manifest)
    assert os.listdir(store.base / "entries") == []


def test_unwritable_cache_is_one_line(store, monkeypatch):
    key, factors = kf(22)
    entry, _ = store.get_or_build(key, factors, writer())
    monkeypatch.setattr(os, "mkdir", _raiser(errno.EROFS))
    with pytest.raises(FilesystemError, match="Read-only file system"):
        store.get_or_build(kf(23)[0], kf(23)[1], writer())
    monkeypatch.setattr(os, "rename", _raiser(errno.EACCES))
    with pytest.raises(FilesystemError, match=f"cannot remove entry {key[:12]}.*Permission"):
        store.remove([key])
    assert store.open(key) == entry  # a hit still works on a cache we cannot write
