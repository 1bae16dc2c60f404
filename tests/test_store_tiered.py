"""TieredStore's lookups under concurrency. Server-less: an in-memory bucket stands in
for S3 (the remote protocol is tested against SeaweedFS in test_store_remote*.py)."""

from __future__ import annotations

from artifactcache.store import locks
from artifactcache.store.keyformat import compute_key
from artifactcache.store.local import LocalStore
from artifactcache.store.signing import Trust
from artifactcache.store.tiered import TieredStore
from tests._memory_bucket import MemoryBucket
from tests.test_store_local import gated, loaders_meanwhile

FACTORS = {"test": "tiered", "n": 1}
KEY = compute_key(FACTORS)


def test_concurrent_cold_loads_through_the_tier_build_once_without_a_stall(cache_dir, monkeypatch):
    """Two loaders of a key neither the host nor the remote has: one builds, the other
    (holding its reader lock while it waits for the key's lock) loads what it published.
    Before: the tier built with force=True, which waited for that reader: a stall of
    READERS_WAIT_S, then EntryInUse and the build thrown away."""
    monkeypatch.setattr(locks, "READERS_WAIT_S", 3.0)
    bucket = MemoryBucket()
    builds: list = []
    make = gated(b"built", builds)

    def load(go, started):
        tier = TieredStore(LocalStore(cache_dir), bucket, trust=Trust(), read_only=True)
        with tier.reading(KEY):
            entry, source = tier.get_or_build(KEY, FACTORS, make(go, started))
            return source, (entry.path / "model.bin").read_bytes()

    results, errors, secs = loaders_meanwhile(load, load)
    assert not errors, errors
    assert results == {"first": ("built", b"built"), "second": ("local", b"built")}
    assert len(builds) == 1 and secs < 3.0
    stats = LocalStore(cache_dir).stats()
    assert (stats["builds"], stats["misses"]) == (1, 2)  # one miss each, none counted twice
