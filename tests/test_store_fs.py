"""store/_fs.py: the bounded reader of the cache's own small files."""

from __future__ import annotations

import errno
import os
import threading
from pathlib import Path

import pytest

from artifactcache.store import _fs
from artifactcache.store.keyformat import compute_key
from artifactcache.store.local import LocalStore


def _without_blocking(fn, fifo: Path):
    """fn()'s result or exception; fails (after letting the reader go) if it blocks."""
    out: list = []

    def run():
        try:
            out.append(fn())
        except Exception as e:
            out.append(e)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(30)
    if t.is_alive():
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        t.join(10)
        pytest.fail("read_small blocked on a FIFO")
    return out[0]


def test_read_small_reads_only_a_bounded_regular_file(tmp_path):
    f = tmp_path / "state.json"
    f.write_bytes(b"x" * 100)
    assert _fs.read_small(f, 100) == b"x" * 100
    with pytest.raises(ValueError, match="more than the 99 bytes"):
        _fs.read_small(f, 99)
    (tmp_path / "link").symlink_to(f)
    with pytest.raises(OSError) as e:
        _fs.read_small(tmp_path / "link", 100)
    assert e.value.errno == errno.ELOOP
    with pytest.raises(_fs.NotRegularFile):
        _fs.read_small(tmp_path, 100)
    os.mkfifo(tmp_path / "fifo")
    err = _without_blocking(lambda: _fs.read_small(tmp_path / "fifo", 100), tmp_path / "fifo")
    assert isinstance(err, _fs.NotRegularFile) and _fs.is_shape_error(err)


def test_a_fifo_in_an_entry_or_the_state_is_damage_not_a_hang(cache_dir):
    store = LocalStore(cache_dir)
    factors = {"test": "fs", "n": 1}
    key = compute_key(factors)

    def build(d: Path) -> dict:
        (d / "model.bin").write_bytes(b"m" * 100)
        return {}

    store.get_or_build(key, factors, build)
    memo = cache_dir / "v1" / "state" / f"{key}.verified"
    memo.unlink()
    os.mkfifo(memo)  # the memo is advisory: the entry is re-hashed, and still served
    assert _without_blocking(lambda: LocalStore(cache_dir).get(key), memo) is not None
    manifest = store.entry_path(key) / "manifest.json"
    manifest.unlink()
    os.mkfifo(manifest)
    assert _without_blocking(lambda: LocalStore(cache_dir).get(key), manifest) is None
    (reason,) = (cache_dir / "v1" / "quarantine").glob("*/QUARANTINE_REASON")
    assert "manifest.json is not a regular file" in reason.read_text()


def test_entries_added_to_a_memo_by_threads_at_once_are_all_kept(tmp_path):
    import threading

    from artifactcache.store._fs import add_to_memo, read_memo

    path = tmp_path / "memo.json"
    threads = [threading.Thread(target=add_to_memo, args=(path, f"k{i}", i)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert read_memo(path) == {f"k{i}": i for i in range(16)}
