"""LocalStore: publish, one build per key, crash safety, verification, gc, prune, stats."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import blake3
import pytest

from artifactcache.errors import CacheRootError, IntegrityError, KeyLookupError
from artifactcache.store import _fs
from artifactcache.store import local as local_mod
from artifactcache.store.keyformat import compute_key
from artifactcache.store.local import LocalStore

WORKER = str(Path(__file__).with_name("_store_worker.py"))


def kf(i: int) -> tuple[str, dict]:
    factors = {"schema": 1, "n": i}
    return compute_key(factors), factors


def writer(payload: bytes = b"artifact" * 512, extra: dict | None = None):
    def build(d: Path) -> dict:
        (d / "model.bin").write_bytes(payload)
        (d / "nested").mkdir()
        (d / "nested" / "config.json").write_text("{}")
        return extra or {"backend_meta": 1}

    return build


def tree(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.lstat().st_size for p in sorted(root.rglob("*"))}


@pytest.fixture
def store(cache_dir) -> LocalStore:
    return LocalStore(cache_dir)


def test_publish_writes_complete_manifest(store, cache_dir):
    key, factors = kf(1)
    entry, source = store.get_or_build(key, factors, writer(), label={"recipe": "r"})
    assert source == "built"
    assert entry.path == cache_dir / "v1" / "entries" / key[:2] / key
    m = json.loads((entry.path / "manifest.json").read_text())
    assert m["key"] == key and m["factors"] == factors and m["label"] == {"recipe": "r"}
    assert m["meta"] == {"backend_meta": 1} and m["layout"] == 1 and m["acache_version"]
    assert m["build_seconds"] >= 0 and m["created"] > 0
    want = "blake3:" + blake3.blake3(b"artifact" * 512).hexdigest()
    assert m["files"]["model.bin"] == {"size": 4096, "digest": want}
    assert set(m["files"]) == {"model.bin", "nested/config.json"}
    assert stat.S_IMODE(cache_dir.stat().st_mode) == 0o700
    assert os.listdir(cache_dir / "v1" / "staging") == []
    again, source = store.get_or_build(key, factors, writer())
    assert source == "local" and again.manifest == entry.manifest


def test_failed_build_publishes_nothing(store, cache_dir):
    key, factors = kf(2)

    def broken(d: Path) -> dict:
        (d / "half.bin").write_bytes(b"x" * 100)
        raise RuntimeError("compiler crashed")

    with pytest.raises(RuntimeError, match="compiler crashed"):
        store.get_or_build(key, factors, broken)
    assert store.get(key) is None
    assert os.listdir(cache_dir / "v1" / "staging") == []
    assert not store.entry_path(key).exists()


def test_force_rebuild_replaces_entry(store, cache_dir):
    key, factors = kf(3)
    old, _ = store.get_or_build(key, factors, writer(b"old"))
    new, source = store.get_or_build(key, factors, writer(b"new!"), force=True)
    assert source == "built" and (new.path / "model.bin").read_bytes() == b"new!"
    assert store.get(key).files == new.files != old.files
    assert os.listdir(cache_dir / "v1" / "staging") == []


def test_forced_rebuild_waits_for_readers_of_the_entry(store, cache_dir, monkeypatch):
    import threading

    from artifactcache.errors import EntryInUse
    from artifactcache.store import locks

    key, factors = kf(30)
    store.get_or_build(key, factors, writer(b"old"))
    model = store.entry_path(key) / "model.bin"
    done = threading.Event()

    def force(payload: bytes) -> None:
        LocalStore(cache_dir).get_or_build(key, factors, writer(payload), force=True)
        done.set()

    with store.reading(key):  # a loader mid-load: its files must not change under it
        t = threading.Thread(target=force, args=(b"new!",))
        t.start()
        assert not done.wait(1.0)
        assert model.read_bytes() == b"old"
    assert done.wait(30)
    t.join()
    assert model.read_bytes() == b"new!"

    # A rebuild asked for from inside this thread's own load (a stale artifact) does not
    # wait for itself, and the load keeps its reader lock afterwards.
    with store.reading(key):
        store.get_or_build(key, factors, writer(b"mine"), force=True)
        with _fs.flock_file(store.readers_lock_path(key), blocking=False) as free:
            assert not free
    assert model.read_bytes() == b"mine"

    # A loader that never lets go: the rebuild gives up in one line and replaces nothing.
    monkeypatch.setattr(locks, "READERS_WAIT_S", 0.3)
    with store.reading(key):
        with pytest.raises(EntryInUse, match="being loaded"):
            LocalStore(cache_dir).get_or_build(key, factors, writer(b"late"), force=True)
    assert model.read_bytes() == b"mine" and store.get(key) is not None
    assert os.listdir(cache_dir / "v1" / "staging") == []


def loaders_meanwhile(first, second, *, head_start: float = 0.5):
    """Run ``first`` in a thread; once its build has started, ``second`` in another.

    Each is called with an Event that the build of ``first`` waits for: set after
    ``second`` had ``head_start`` seconds to take its reader lock and wait for the
    key's lock. Returns (results, errors, seconds).
    """
    import threading

    go = threading.Event()
    started = threading.Event()
    results: dict[str, object] = {}
    errors: list[BaseException] = []

    def run(name, fn):
        try:
            results[name] = fn(go, started)
        except BaseException as e:  # reported by the test
            errors.append(e)

    t0 = time.monotonic()
    t1 = threading.Thread(target=run, args=("first", first))
    t1.start()
    assert started.wait(30)
    t2 = threading.Thread(target=run, args=("second", second))
    t2.start()
    time.sleep(head_start)
    go.set()
    t1.join(60)
    t2.join(60)
    return results, errors, time.monotonic() - t0


def gated(payload: bytes, builds: list):
    """A build that says it started, then waits for the test's go."""

    def make(go, started):
        def build(d: Path) -> dict:
            builds.append(payload)
            started.set()
            assert go.wait(30)
            return writer(payload)(d)

        return build

    return make


def test_a_loader_waiting_for_a_build_does_not_stall_the_builder(cache_dir, monkeypatch):
    """api.load holds the key's reader lock while it waits for the key's lock. A build
    publishing where no entry is (even a forced one) must not wait for that loader,
    and a build replacing an entry must not either: the loader lets its reader lock go
    while it waits. Before: a 120 s stall, then EntryInUse and the build thrown away."""
    from artifactcache.store import locks
    from artifactcache.store.signing import Trust

    monkeypatch.setattr(locks, "READERS_WAIT_S", 3.0)
    key, factors = kf(31)
    builds: list = []
    make = gated(b"new", builds)

    def builder(force: bool, **kw):
        def run(go, started):
            s = LocalStore(cache_dir, **kw)
            with s.reading(key):
                return s.get_or_build(key, factors, make(go, started), force=force)[1]

        return run

    def loader(**kw):
        def run(go, started):
            s = LocalStore(cache_dir, **kw)
            with s.reading(key):
                entry, source = s.get_or_build(key, factors, make(go, started))
                return source, (entry.path / "model.bin").read_bytes()

        return run

    # A cold key: a forced build and a plain load at once.
    results, errors, secs = loaders_meanwhile(builder(True), loader())
    assert not errors, errors
    assert results == {"first": "built", "second": ("local", b"new")} and len(builds) == 1
    assert secs < 3.0

    # Replacing an entry this host may no longer serve, while another loader waits.
    staging = cache_dir.parent / "pulled"
    old = LocalStore(cache_dir).entry_path(key)
    shutil.copytree(old, staging)
    manifest = json.loads((old / "manifest.json").read_text())
    store = LocalStore(cache_dir)
    store.remove([key])
    store.publish_dir(staging, manifest, provenance={"source": "pulled", "remote": "mem://x"})
    revoked = {"trust": Trust(), "rebuild_untrusted": True}
    builds.clear()
    results, errors, secs = loaders_meanwhile(builder(False, **revoked), loader(**revoked))
    assert not errors, errors
    assert results == {"first": "built", "second": ("local", b"new")} and len(builds) == 1
    assert secs < 3.0
    assert LocalStore(cache_dir).open(key).provenance["source"] == "built"


def test_the_largest_pullable_manifest_loads_once_pulled(cache_dir, tmp_path):
    """The manifest limits come from one place: a manifest as large as a remote accepts,
    signed, pulled and stored with its envelope, loads again (before: the local read
    limit equalled the manifest-alone one, so such an entry failed to load, was
    quarantined and pulled again, forever). One that would not load is refused
    before it is published."""
    from artifactcache.store import manifest as schema
    from artifactcache.store import provenance
    from artifactcache.store.signing import configure, generate_key, open_envelope

    generate_key(tmp_path / "k", "fleet")
    signer, trust = configure(tmp_path / "k", [f"{tmp_path / 'k'}.pub"], False)
    key, factors = kf(40)
    origin = LocalStore(tmp_path / "origin")
    entry, _ = origin.get_or_build(key, factors, writer())
    content = schema.content(entry.manifest)
    pushed = lambda m: json.dumps(m, indent=1, sort_keys=True).encode()  # noqa: E731
    content["label"] = {"pad": "x" * (schema.MAX_BYTES - len(pushed(content)) - 64)}
    payload = pushed(content)
    assert schema.MAX_BYTES - 100 < len(payload) <= schema.MAX_BYTES  # what a remote takes
    envelope = signer.seal(key, payload)  # type: ignore[union-attr]
    assert len(envelope) <= schema.ENVELOPE_MAX_BYTES
    prov = provenance.pulled("mem://fleet", open_envelope(envelope, key))
    store = LocalStore(cache_dir, trust=trust)
    staging = tmp_path / "staging"
    shutil.copytree(entry.path, staging)
    store.publish_dir(staging, content, provenance=prov)
    stored = (store.entry_path(key) / "manifest.json").stat().st_size
    assert stored > 2 * schema.MAX_BYTES  # the manifest and its envelope
    got = LocalStore(cache_dir, trust=trust).get(key)
    assert got is not None and got.label == content["label"]
    assert os.listdir(cache_dir / "v1" / "quarantine") == []

    # Past what loads: refused, nothing published.
    other, other_factors = kf(41)
    big = dict(schema.content(entry.manifest), key=other, factors=other_factors)
    big["label"] = {"pad": "x" * schema.STORED_MAX_BYTES}
    shutil.copytree(entry.path, tmp_path / "big")
    with pytest.raises(IntegrityError, match="more than the .* a stored manifest may have"):
        store.publish_dir(tmp_path / "big", big)
    assert not store.entry_path(other).exists()


def test_build_output_with_symlink_is_rejected(store, cache_dir):
    key, factors = kf(4)

    def linky(d: Path) -> dict:
        (d / "link").symlink_to("/etc/passwd")
        return {}

    with pytest.raises(IntegrityError, match="symlink"):
        store.get_or_build(key, factors, linky)
    assert store.get(key) is None


def test_eight_processes_build_once(cache_dir, tmp_path):
    key, _ = kf(5)
    marker = str(tmp_path / "m")
    procs = [
        subprocess.Popen(
            [sys.executable, WORKER, "race", str(cache_dir), key, marker],
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(8)
    ]
    deadline = time.time() + 60
    while (Path(marker).read_text().count("ready") if Path(marker).exists() else 0) < 8:
        assert time.time() < deadline, "workers did not start"
        time.sleep(0.01)
    Path(marker + ".go").touch()
    results = [json.loads(p.communicate(timeout=60)[0]) for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert sorted(r["source"] for r in results) == ["built"] + ["local"] * 7
    assert len(Path(marker + ".builds").read_text().split()) == 1
    same = {json.dumps({**r, "source": None}, sort_keys=True) for r in results}
    assert len(same) == 1  # all eight hold the same entry
    store = LocalStore(cache_dir)
    assert [r.ok for r in store.verify([key])] == [True]
    assert os.listdir(cache_dir / "v1" / "staging") == []


def test_sigkill_during_build_and_publish(cache_dir, tmp_path):
    store = LocalStore(cache_dir)
    key, factors = kf(6)
    rng = random.Random(1234)
    trials, landed = 24, []
    for i in range(trials):
        marker = tmp_path / f"m{i}"
        p = subprocess.Popen([sys.executable, WORKER, "slow", str(cache_dir), key, str(marker)])
        while not (marker.exists() and "start" in marker.read_text()):
            assert p.poll() is None, "worker died before starting"
            time.sleep(0.002)
        # Build ~0.1 s, then publish stages 30 ms apart: spread kills over both.
        time.sleep(0.3 * (i + rng.random()) / trials)
        p.send_signal(signal.SIGKILL)
        p.wait()
        landed.append(marker.read_text().split()[-1])
        # No partial entry: either nothing, or an entry that fully verifies.
        if store.entry_path(key).exists():
            assert [r.ok for r in store.verify([key])] == [True]
        assert os.listdir(cache_dir / "v1" / "quarantine") == []
        entry, _ = store.get_or_build(key, factors, writer())  # the next build succeeds
        assert store.open(key) == entry
        store.remove([key])
    in_build = sum(s in ("start", "build") for s in landed)
    in_publish = sum(s in ("built", "manifest", "fsynced") for s in landed)
    assert in_build and in_publish, landed
    leftovers = os.listdir(cache_dir / "v1" / "staging")
    assert leftovers  # killed builds leave staging dirs behind ...
    res = store.prune()
    assert res.staging == len(leftovers)  # ... which prune reclaims
    assert os.listdir(cache_dir / "v1" / "staging") == []
    assert os.listdir(cache_dir / "v1" / "locks") == []


def corrupt_flip(p: Path) -> None:
    st = p.stat()
    data = bytearray(p.read_bytes())
    data[len(data) // 2] ^= 0x01
    p.write_bytes(bytes(data))
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))  # a forged mtime must not fool the memo


def corrupt_truncate(p: Path) -> None:
    with open(p, "r+b") as f:
        f.truncate(100)


def corrupt_extra(p: Path) -> None:
    (p.parent / "evil.so").write_bytes(b"x")


def corrupt_symlink(p: Path) -> None:
    data = p.read_bytes()
    target = p.parent.parent / "outside.bin"
    target.write_bytes(data)
    p.unlink()
    p.symlink_to(target)


def corrupt_missing(p: Path) -> None:
    p.unlink()


CORRUPTIONS = [corrupt_flip, corrupt_truncate, corrupt_extra, corrupt_symlink, corrupt_missing]


@pytest.mark.parametrize("corrupt", CORRUPTIONS, ids=lambda f: f.__name__)
def test_corruption_detected_before_load(store, cache_dir, corrupt):
    key, factors = kf(7)
    entry, _ = store.get_or_build(key, factors, writer())
    assert store.get(key) is not None  # memoized verification in place
    corrupt(entry.path / "model.bin")
    with pytest.raises(IntegrityError) as err:
        store.open(key)
    assert "\n" not in str(err.value) and "quarantined" in str(err.value)
    assert not entry.path.exists()
    assert [p for p in os.listdir(cache_dir / "v1" / "quarantine") if p.startswith(key)]
    again, source = store.get_or_build(key, factors, writer())  # a load rebuilds
    assert source == "built" and store.get(key) is not None


def test_verify_reports_corruption_and_get_quarantines(store, cache_dir):
    key, factors = kf(8)
    good_key, good_factors = kf(9)
    entry, _ = store.get_or_build(key, factors, writer())
    store.get_or_build(good_key, good_factors, writer())
    corrupt_flip(entry.path / "model.bin")
    results = {r.key: r for r in store.verify()}
    assert results[good_key].ok and not results[key].ok
    assert "digest" in results[key].problem
    assert store.get(key) is None


def test_memo_skips_rehash_until_file_changes(store, monkeypatch):
    key, factors = kf(10)
    entry, _ = store.get_or_build(key, factors, writer())
    calls = []
    real = _fs.digest_file
    monkeypatch.setattr(_fs, "digest_file", lambda p: calls.append(p) or real(p))
    assert store.get(key) is not None and calls == []  # publish memoized every file
    (entry.path / "model.bin").chmod(0o600)  # any inode change (ctime) invalidates
    assert store.get(key) is not None and [p.name for p in calls] == ["model.bin"]
    calls.clear()
    assert store.get(key) is not None and calls == []
    assert LocalStore(store.root, full_verify=True).get(key) is not None and len(calls) == 2


def test_resolve_prefixes(store):
    a, b = "abcdef01" + "0" * 56, "abcdef01" + "1" * 56
    for k in (a, b):
        store.get_or_build(k, {"k": k}, writer())
    assert store.resolve(a[:9]) == a and store.resolve(b.upper()) == b
    for bad, why in [("abcdef01", "ambiguous"), ("abc", "8 to 64"), ("zzzzzzzzz", "8 to 64")]:
        with pytest.raises(KeyLookupError, match=why):
            store.resolve(bad)
    with pytest.raises(KeyLookupError, match="no entry"):
        store.resolve("12345678")
    with pytest.raises(KeyLookupError):
        store.open("../../../etc")


def test_root_symlink_refused(tmp_path):
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    link = tmp_path / "link"
    link.symlink_to(real)
    with pytest.raises(CacheRootError, match="symlink"):
        LocalStore(link)
    assert os.listdir(real) == []  # nothing written
    assert LocalStore(link, allow_shared_root=True).base.is_dir()


def test_root_world_writable_refused(tmp_path, monkeypatch):
    root = tmp_path / "shared"
    root.mkdir()
    root.chmod(0o777)
    with pytest.raises(CacheRootError, match="chmod 700"):
        LocalStore(root)
    assert os.listdir(root) == []
    monkeypatch.setenv("ACACHE_ALLOW_SHARED_ROOT", "1")
    assert LocalStore(root).base.is_dir()


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")
def test_root_foreign_owner_refused(tmp_path):
    root = tmp_path / "theirs"
    root.mkdir(mode=0o700)
    os.chown(root, 65534, 65534)
    with pytest.raises(CacheRootError, match="owned by uid 65534"):
        LocalStore(root)


def test_root_unusable_refused(tmp_path):
    afile = tmp_path / "file"
    afile.write_text("x")
    with pytest.raises(CacheRootError, match="not a directory"):
        LocalStore(afile)
    with pytest.raises(CacheRootError, match="cannot create"):
        LocalStore(afile / "sub")  # parent is a file: cannot be created or written


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores directory permissions")
def test_root_unwritable_refused(tmp_path):
    root = tmp_path / "ro"
    root.mkdir(mode=0o500)
    with pytest.raises(CacheRootError, match="not readable and writable"):
        LocalStore(root)


def test_new_root_created_0700(tmp_path):
    store = LocalStore(tmp_path / "a" / "b")
    assert stat.S_IMODE(store.root.stat().st_mode) == 0o700


def _aged(store: LocalStore, n: int) -> list[str]:
    keys = []
    for i in range(n):
        key, factors = kf(100 + i)
        entry, _ = store.get_or_build(key, factors, writer(bytes(1000)))
        t = time.time() - 3600 * (n - i)  # key 0 is the least recently used
        os.utime(entry.path, (t, t))
        keys.append(key)
    return keys


def test_gc_max_size_evicts_lru_first(store):
    keys = _aged(store, 4)
    store.get(keys[0])  # a hit makes the oldest the most recently used
    size = store.peek(keys[0]).size
    plan = store.gc_plan(max_size=2 * size)
    assert [e.key for e in plan.entries] == [keys[1], keys[2]]
    assert plan.bytes == 2 * size
    assert len(store.scan()[0]) == 4  # a plan (dry run) deletes nothing
    store.get(keys[2])  # used after the plan was made: execute keeps it
    done = store.execute(plan)
    assert sorted(e.key for e in store.scan()[0]) == sorted([keys[0], keys[2], keys[3]])
    assert done.evicted == [keys[1]] and done.kept == [keys[2]] and done.in_use == []
    assert done.freed > size  # the artifact and its manifest, of one entry


def test_gc_older_than(store):
    keys = _aged(store, 3)
    plan = store.gc_plan(older_than=2.5 * 3600)
    assert [e.key for e in plan.entries] == [keys[0]]
    store.execute(plan)
    assert sorted(e.key for e in store.scan()[0]) == sorted(keys[1:])


def test_prune_keeps_live_builds_and_held_locks(store, cache_dir):
    dead = cache_dir / "v1" / "staging" / "deadbeef"
    dead.mkdir()
    (dead / "partial.bin").write_bytes(b"x" * 10)
    key, _ = kf(11)
    stale_lock = cache_dir / "v1" / "locks" / f"{kf(12)[0]}.lock"
    stale_lock.touch()
    with store.new_staging_dir() as live, store.lock(key):
        res = store.prune()
        assert live.exists() and not dead.exists()
        assert (cache_dir / "v1" / "locks" / f"{key}.lock").exists()
    assert res.staging == 1 and res.locks == 1 and res.bytes == 10
    assert not stale_lock.exists()


def test_a_dry_run_prune_counts_what_would_go_and_removes_nothing(store, cache_dir):
    root = cache_dir / "v1"
    dead = root / "staging" / "deadbeef"
    dead.mkdir()
    (dead / "partial.bin").write_bytes(b"x" * 10)
    stale_lock = root / "locks" / f"{kf(16)[0]}.lock"
    stale_lock.touch()
    bad = root / "quarantine" / "ab"
    bad.mkdir(parents=True, exist_ok=True)
    (bad / "evidence.bin").write_bytes(b"y" * 7)
    orphan = root / "state" / f"{kf(17)[0]}.memo"
    orphan.write_text("{}")
    planned = store.prune(dry_run=True)
    assert (planned.staging, planned.locks, planned.quarantine, planned.other) == (1, 1, 1, 1)
    assert planned.bytes == 17 and planned.dry_run
    assert dead.exists() and stale_lock.exists() and bad.exists() and orphan.exists()
    done = store.prune()
    assert (done.staging, done.locks, done.quarantine, done.other, done.bytes) == (1, 1, 1, 1, 17)
    assert not (dead.exists() or stale_lock.exists() or bad.exists() or orphan.exists())


def test_scan_is_tolerant(store, cache_dir):
    key, factors = kf(13)
    store.get_or_build(key, factors, writer())
    (cache_dir / "v1" / "entries" / "zz").mkdir()
    (cache_dir / "v1" / "entries" / "zz" / "junk").mkdir()
    nomani = "cd" * 32
    (cache_dir / "v1" / "entries" / "cd" / nomani).mkdir(parents=True)
    entries, warnings = store.scan()
    assert [e.key for e in entries] == [key]
    assert any("junk" in w for w in warnings) and any(nomani[:12] in w for w in warnings)


def test_stats_counts_and_seconds_saved(store):
    key, factors = kf(14)
    assert store.get(key) is None
    entry, _ = store.get_or_build(key, factors, writer())
    store.get(key)
    store.get(key)
    s = store.stats()
    assert (s["hits"], s["misses"], s["builds"], s["entries"]) == (2, 2, 1, 1)
    assert s["build_seconds_saved"] == pytest.approx(2 * entry.build_seconds, abs=1e-5)
    assert s["bytes"] == entry.size


def test_stats_safe_under_concurrency(cache_dir, tmp_path):
    key, _ = kf(15)
    procs = [
        subprocess.Popen(
            [sys.executable, WORKER, "record", str(cache_dir), key, str(tmp_path / "m"), "150"]
        )
        for _ in range(4)
    ]
    assert all(p.wait(timeout=60) == 0 for p in procs)
    s = LocalStore(cache_dir).stats()
    assert s["hits"] == 600 and s["build_seconds_saved"] == pytest.approx(600.0)
    assert (cache_dir / "v1" / "stats.json").exists()  # compaction ran while others appended


def test_publish_dir_verifies_against_manifest(store, cache_dir):
    key, factors = kf(16)
    src, _ = store.get_or_build(key, factors, writer())
    manifest = src.manifest
    store.remove([key])
    for tamper in (True, False):  # a tampered copy first: it must publish nothing
        with store.new_staging_dir() as d:
            (d / "nested").mkdir()
            (d / "nested" / "config.json").write_text("{}")
            (d / "model.bin").write_bytes(b"artifact" * 512 if not tamper else b"evil" * 1024)
            if tamper:
                with pytest.raises(IntegrityError, match="does not match"):
                    store.publish_dir(d, manifest)
                assert not store.entry_path(key).exists()
            else:
                assert store.publish_dir(d, manifest).files == manifest["files"]
    assert store.get(key) is not None


def test_store_does_not_import_torch():
    code = (
        "import sys, artifactcache.store.local, artifactcache.store.bundle;"
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_ls_index_follows_rebuilds_and_survives_damage(store, cache_dir):
    key, factors = kf(17)
    store.get_or_build(key, factors, writer(b"a" * 10), label={"recipe": "one"})
    (info,), _ = store.ls()
    assert (info.key, info.size, info.label) == (key, 10 + 2, {"recipe": "one"})
    assert (cache_dir / "v1" / "state" / "index.json").exists()
    store.get_or_build(key, factors, writer(b"b" * 20), force=True, label={"recipe": "two"})
    (info,), _ = store.ls()  # a new entry dir (inode): the index record is refreshed
    assert (info.size, info.label) == (20 + 2, {"recipe": "two"})
    (cache_dir / "v1" / "state" / "index.json").write_text("{not json")
    assert [i.key for i in store.ls()[0]] == [key]
    store.remove([key])
    assert store.ls() == ([], [])


def test_a_malformed_manifest_is_a_warning_for_scans_not_a_crash(store, cache_dir):
    bad, factors = kf(18)
    store.get_or_build(bad, factors, writer())
    good, factors = kf(19)
    store.get_or_build(good, factors, writer())
    store.ls()  # the summary index now holds both
    path = store.entry_path(bad) / "manifest.json"
    manifest = json.loads(path.read_text())
    path.write_text(json.dumps(dict(manifest, created="yesterday")))
    os.utime(store.entry_path(bad))  # as a fresh entry dir would: its index record is stale
    (cache_dir / "v1" / "state" / "index.json").unlink()
    for listing in (store.ls, store.scan):
        entries, warnings = listing()
        assert [e.key for e in entries] == [good]
        assert any(bad[:12] in w for w in warnings)
    assert store.stats()["entries"] == 1
    assert [e.key for e in store.gc_plan(max_size=0).entries] == [good]
    with pytest.raises(IntegrityError, match="created"):
        store.open(bad)  # every load checks the same schema: quarantined, one line
    assert store.remove([good]) > 0 and store.ls()[0] == []


def test_a_damaged_summary_index_record_is_reread_not_trusted(store, cache_dir):
    key, factors = kf(20)
    store.get_or_build(key, factors, writer())
    store.ls()
    index = cache_dir / "v1" / "state" / "index.json"
    records = json.loads(index.read_text())
    records[key]["created"] = "yesterday"
    records[key]["size"] = "big"
    index.write_text(json.dumps(records))
    (info,), warnings = store.ls()
    assert (info.key, info.size, warnings) == (key, 4096 + 2, [])
    assert isinstance(info.created, float)


def test_a_corrupt_entry_rebuilt_by_a_load_is_said(store, capsys):
    """Quarantined and rebuilt: one warning line, not silence (issue 33, item 5)."""
    key, factors = kf(31)
    entry, _ = store.get_or_build(key, factors, writer())
    corrupt_flip(entry.path / "model.bin")
    store.full_verify = True  # the flip keeps size and mtime: read the bytes
    again, source = store.get_or_build(key, factors, writer())
    assert source == "built"
    lines = [ln for ln in capsys.readouterr().err.splitlines() if key[:12] in ln]
    assert len(lines) == 1 and lines[0].startswith("warning: entry ")
    assert "failed verification" in lines[0] and "treated as a miss" in lines[0]


def test_waiting_on_another_build_is_said(store, capsys, monkeypatch):
    """A process that found the entry only after another's build held the key's lock says
    how long it waited, rather than passing the wait off as a plain hit."""
    monkeypatch.setattr(local_mod, "WAIT_NOTICE_S", 0.2)
    key, factors = kf(32)
    started = threading.Event()

    def other_builder() -> None:
        with store.lock(key):
            started.set()
            time.sleep(0.5)
            store.get_or_build(key, factors, writer())

    t = threading.Thread(target=other_builder)
    t.start()
    started.wait(10)
    entry, source = store.get_or_build(key, factors, writer())
    t.join()
    assert source == "local"
    err = capsys.readouterr().err
    assert "note: waited " in err and f"another build of {key[:12]}" in err
