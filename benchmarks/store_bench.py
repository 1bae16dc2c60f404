"""Store benchmark: what caching costs next to plain file I/O, as ratios from one run.

    python benchmarks/store_bench.py [--size 1GiB] [--entries 10000] [--sparse 13GB]

Measures, on one artifact of --size random bytes:

* put (build = copy into staging, then hash + fsync + rename) vs a plain copy,
  and vs a plain copy + fsync;
* verified get + reading the bytes vs a raw read of the same bytes, with the
  stat memo (the default) and with ACACHE_VERIFY=full (re-hash every hit),
  warm (page cache) and cold (the file's pages dropped with
  posix_fadvise(DONTNEED), which touches only our files, not the whole cache);
* blake3 digest throughput vs raw read throughput;
* scan / `acache ls` over --entries synthetic entries (manifests written
  directly: the cost measured is listing, not building);
* key lookup with a memoized weights digest, for a real --ckpt-size file and a
  --sparse file (sparse: its first digest hashes zeros quickly; the memoized
  lookup never reads it again).

Prints a Markdown table and the JSON it came from.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from importlib import metadata
from pathlib import Path

from artifactcache import keys
from artifactcache.store import _fs
from artifactcache.store.local import LocalStore

CHUNK = 8 << 20


def parse_size(text: str) -> int:
    from artifactcache.cli.cache import parse_size as p

    return p(text)


def timed(fn, reps: int) -> float:
    """Median wall seconds of ``reps`` calls."""
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return statistics.median(out)


def read_all(path: Path) -> int:
    buf = bytearray(CHUNK)
    n = 0
    with open(path, "rb", buffering=0) as f:
        while k := f.readinto(buf):
            n += k
    return n


def digest_one_thread(path: Path) -> str:
    """blake3 on one thread, for comparison with the store's max_threads=AUTO."""
    import mmap

    import blake3

    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        return blake3.blake3(mm, max_threads=1).hexdigest()


def drop_cache(path: Path) -> None:
    """Evict one file's clean pages (fsync first so they are clean)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def keep_dropping(path: Path, done: threading.Event) -> None:
    while not done.wait(0.2):
        drop_cache(path)


def write_random(path: Path, size: int) -> None:
    with open(path, "wb") as f:
        left = size
        while left:
            n = min(left, CHUNK)
            f.write(os.urandom(n))
            left -= n


def copy_fsync(src: Path, dst: Path) -> None:
    shutil.copyfile(src, dst)
    _fs.fsync_path(dst)


def synthetic_entries(store: LocalStore, n: int) -> None:
    tmpl = {"layout": 1, "arch_key": None, "label": {"recipe": "tiny-llama", "backend": "eager"}}
    for i in range(n):
        factors = {"schema": 1, "recipe": {"family": "llama", "i": i}, "weights": "random:0"}
        key = keys.compute_key(factors)
        d = store.entry_path(key)
        d.mkdir(parents=True)
        (d / "model.bin").write_bytes(b"x")
        digest = "blake3:" + "0" * 64
        m = {**tmpl, "key": key, "factors": factors, "meta": {}, "created": time.time()}
        m |= {"files": {"model.bin": {"size": 1, "digest": digest}}, "build_seconds": 1.0}
        (d / "manifest.json").write_text(json.dumps(m, indent=1))


def machine() -> dict:
    cpu = next(
        (
            ln.split(":", 1)[1].strip()
            for ln in Path("/proc/cpuinfo").read_text().splitlines()
            if ln.startswith("model name")
        ),
        platform.processor(),
    )
    versions = {d: metadata.version(d) for d in ("artifactcache", "blake3", "typer", "rich")}
    return {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "cpu": cpu,
        "cores": os.cpu_count(),
        "mem_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "packages": versions,
        "command": "python " + " ".join(sys.argv),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", default="1GiB", help="artifact size (default 1GiB)")
    ap.add_argument("--entries", type=int, default=10_000, help="entries for the ls timing")
    ap.add_argument("--ckpt-size", default="256MiB", help="real checkpoint for the key lookup")
    ap.add_argument("--sparse", default="13GB", help="sparse checkpoint for the key lookup")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--dir", default=None, help="scratch dir (default: a temp dir)")
    args = ap.parse_args()
    size = parse_size(args.size)
    work = Path(tempfile.mkdtemp(prefix="acache-bench-", dir=args.dir))
    r: dict = {"machine": machine(), "size_bytes": size, "reps": args.reps}
    try:
        src = work / "artifact.bin"
        write_random(src, size)
        store = LocalStore(work / "cache")
        key, factors = keys.compute_key({"bench": 1}), {"bench": 1}
        build = lambda d: shutil.copyfile(src, d / "model.bin") and None  # noqa: E731

        r["copy_s"] = timed(lambda: shutil.copyfile(src, work / "copy.bin"), args.reps)
        r["copy_fsync_s"] = timed(lambda: copy_fsync(src, work / "copy.bin"), args.reps)
        r["put_s"] = timed(lambda: store.get_or_build(key, factors, build, force=True), args.reps)
        entry = store.open(key)
        art = entry.path / "model.bin"
        full = LocalStore(store.root, full_verify=True)

        def hit(s: LocalStore) -> None:
            e = s.get(key)
            assert e is not None
            read_all(e.path / "model.bin")

        read_all(art)  # warm
        r["raw_read_warm_s"] = timed(lambda: read_all(art), args.reps)
        r["get_memo_warm_s"] = timed(lambda: hit(store), args.reps)
        r["get_full_warm_s"] = timed(lambda: hit(full), args.reps)
        r["digest_warm_s"] = timed(lambda: _fs.digest_file(art), args.reps)
        r["digest_1thread_warm_s"] = timed(lambda: digest_one_thread(art), args.reps)

        r["raw_read_cold_s"] = timed_cold(lambda: read_all(art), art, args.reps)
        r["get_memo_cold_s"] = timed_cold(lambda: hit(store), art, args.reps)
        r["get_full_cold_s"] = timed_cold(lambda: hit(full), art, args.reps)

        many = LocalStore(work / "many")
        synthetic_entries(many, args.entries)
        r["entries"] = args.entries
        r["scan_s"] = timed(lambda: many.scan(), args.reps)
        env = {**os.environ, "ACACHE_DIR": str(many.root)}
        for name, cli in (("ls_json_cli_s", ["ls", "--json"]), ("ls_table_cli_s", ["ls"])):
            cmd = [sys.executable, "-m", "artifactcache.cli", *cli]
            run = lambda c=cmd: subprocess.run(c, env=env, stdout=subprocess.DEVNULL, check=True)  # noqa: E731
            r[name] = timed(run, args.reps)
        nop = [sys.executable, "-m", "artifactcache.cli", "--help"]
        r["cli_startup_s"] = timed(
            lambda: subprocess.run(nop, stdout=subprocess.DEVNULL), args.reps
        )

        for label, sz, sparse in (("ckpt", args.ckpt_size, False), ("sparse", args.sparse, True)):
            ck = work / f"{label}.safetensors"
            n = parse_size(sz)
            if sparse:
                with open(ck, "wb") as f:
                    f.truncate(n)
            else:
                write_random(ck, n)
            memo = work / f"memo-{label}"
            # Reading a hole still fills the page cache with zero pages: drop them
            # as the first digest goes, so 13 GB of zeros never crowd the machine.
            done = threading.Event()
            dropper = threading.Thread(target=keep_dropping, args=(ck, done), daemon=True)
            dropper.start()
            t0 = time.perf_counter()
            keys.weights_digest(ck, memo_dir=memo)
            done.set()
            dropper.join()
            r[f"{label}_bytes"] = n
            r[f"{label}_first_digest_s"] = time.perf_counter() - t0

            def lookup(ck=ck, memo=memo) -> str:
                w = keys.weights_digest(ck, memo_dir=memo)
                return keys.compute_key({**factors, "weights": w})

            r[f"{label}_memo_lookup_s"] = timed(lookup, 20)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report(r)


def timed_cold(fn, path: Path, reps: int) -> float:
    out = []
    for _ in range(reps):
        drop_cache(path)
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return statistics.median(out)


def report(r: dict) -> None:
    gib = r["size_bytes"] / 2**30
    rows = [
        (
            "put (copy in + hash + fsync + rename)",
            r["put_s"],
            r["put_s"] / r["copy_fsync_s"],
            "plain copy + fsync",
            "",
        ),
        ("put", r["put_s"], r["put_s"] / r["copy_s"], "plain copy (no fsync)", ""),
        (
            "verified get + read, memo, warm",
            r["get_memo_warm_s"],
            r["get_memo_warm_s"] / r["raw_read_warm_s"],
            "raw read, warm",
            "<= 1.1x",
        ),
        (
            "verified get + read, memo, cold",
            r["get_memo_cold_s"],
            r["get_memo_cold_s"] / r["raw_read_cold_s"],
            "raw read, cold",
            "<= 1.1x",
        ),
        (
            "verified get + read, full re-hash, warm",
            r["get_full_warm_s"],
            r["get_full_warm_s"] / r["raw_read_warm_s"],
            "raw read, warm",
            "",
        ),
        (
            "verified get + read, full re-hash, cold",
            r["get_full_cold_s"],
            r["get_full_cold_s"] / r["raw_read_cold_s"],
            "raw read, cold",
            "",
        ),
        (
            "blake3 digest (mmap, all cores), warm",
            r["digest_warm_s"],
            r["digest_warm_s"] / r["raw_read_warm_s"],
            "raw read, warm",
            "",
        ),
        (
            "blake3 digest (mmap, one thread), warm",
            r["digest_1thread_warm_s"],
            r["digest_1thread_warm_s"] / r["raw_read_warm_s"],
            "raw read, warm",
            "",
        ),
    ]
    print(f"Artifact: {gib:.2f} GiB of random bytes; median of {r['reps']} runs.\n")
    print("| operation | seconds | ratio | baseline | target |")
    print("|---|---:|---:|---|---|")
    for name, s, ratio, base, target in rows:
        print(f"| {name} | {s:.3f} | {ratio:.2f}x | {base} | {target} |")
    gbs = lambda s: r["size_bytes"] / s / 1e9  # noqa: E731
    print(
        f"\nThroughput (GB/s): raw read warm {gbs(r['raw_read_warm_s']):.2f}, cold "
        f"{gbs(r['raw_read_cold_s']):.2f}; blake3 warm {gbs(r['digest_warm_s']):.2f}; "
        f"plain copy {gbs(r['copy_s']):.2f}; copy+fsync {gbs(r['copy_fsync_s']):.2f}."
    )
    print("\n| listing / lookup | seconds | target |")
    print("|---|---:|---|")
    print(f"| scan() of {r['entries']} entries, in process | {r['scan_s']:.3f} | |")
    print(
        f"| `acache ls --json`, {r['entries']} entries, whole process | {r['ls_json_cli_s']:.3f} "
        "| < 0.5 s |"
    )
    print(
        f"| `acache ls` (rich table), {r['entries']} entries, whole process "
        f"| {r['ls_table_cli_s']:.3f} | |"
    )
    print(f"| `acache --help` (process start + imports only) | {r['cli_startup_s']:.3f} | |")
    for label in ("ckpt", "sparse"):
        gb = r[f"{label}_bytes"] / 1e9
        print(
            f"| key lookup, memoized digest of a {gb:.1f} GB {label} file (first digest "
            f"{r[f'{label}_first_digest_s']:.2f} s) | {r[f'{label}_memo_lookup_s']:.4f} "
            "| < 0.05 s |"
        )
    m = r["machine"]
    print(
        f"\nMachine: {m['cpu']}, {m['cores']} cores, {m['mem_gib']} GiB, kernel {m['kernel']}; "
        f"Python {m['python']}; {m['packages']}; {m['date']}."
    )
    print(f"Command: `{m['command']}`\n")
    print("```json\n" + json.dumps(r, indent=1, sort_keys=True) + "\n```")


if __name__ == "__main__":
    main()
