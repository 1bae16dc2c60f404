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
from artifactcache.store.keyformat import compute_key
from artifactcache.store.local import LocalStore

CHUNK = 8 << 20


def parse_size(text: str) -> int:
    from artifactcache.cli.cache import parse_size as p

    return p(text)


def paired(r: dict, group: str, fns: dict, reps: int, before=None) -> None:
    """Run ``fns`` in rounds; keep every time, so ratios can be taken per round.

    The order rotates each round, so no function always runs first (or right
    after the one that warmed a cache).
    """
    names = list(fns)
    times: dict[str, list[float]] = {k: [] for k in fns}
    for i in range(reps):
        for name in names[i % len(names) :] + names[: i % len(names)]:
            if before:
                before()
            t0 = time.perf_counter()
            fns[name]()
            times[name].append(time.perf_counter() - t0)
    r[group] = {n: {"times_s": ts, "median_s": statistics.median(ts)} for n, ts in times.items()}


def ratio(group: dict, name: str, base: str) -> float:
    """Median over rounds of time(name) / time(base) in the same round."""
    pairs = zip(group[name]["times_s"], group[base]["times_s"], strict=True)
    return statistics.median(t / b for t, b in pairs)


def span(t: dict) -> str:
    return f"{t['median_s']:.3f} ({min(t['times_s']):.3f}-{max(t['times_s']):.3f})"


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
        key = compute_key(factors)
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
        "load_before": [round(x, 2) for x in os.getloadavg()],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", default="1GiB", help="artifact size (default 1GiB)")
    ap.add_argument("--entries", type=int, default=10_000, help="entries for the ls timing")
    ap.add_argument("--ckpt-size", default="256MiB", help="real checkpoint for the key lookup")
    ap.add_argument("--sparse", default="13GB", help="sparse checkpoint for the key lookup")
    ap.add_argument("--reps", type=int, default=3, help="rounds of the write measurements")
    ap.add_argument("--read-reps", type=int, default=5, help="rounds of the read/list ones")
    ap.add_argument("--dir", default=None, help="scratch dir (default: a temp dir)")
    args = ap.parse_args()
    size = parse_size(args.size)
    work = Path(tempfile.mkdtemp(prefix="acache-bench-", dir=args.dir))
    r: dict = {"machine": machine(), "size_bytes": size, "reps": args.reps}
    r["read_reps"] = args.read_reps
    try:
        src = work / "artifact.bin"
        write_random(src, size)
        store = LocalStore(work / "cache")
        key, factors = compute_key({"bench": 1}), {"bench": 1}
        build = lambda d: shutil.copyfile(src, d / "model.bin") and None  # noqa: E731

        def put() -> None:
            store.get_or_build(key, factors, build, force=True)

        # Paired rounds: each round runs the baseline and the subjects back to
        # back, and ratios are the median of per-round ratios. On a shared
        # machine whose load drifts, that is far steadier than separate medians.
        paired(
            r,
            "write",
            {
                "copy": lambda: shutil.copyfile(src, work / "copy.bin"),
                "copy_fsync": lambda: copy_fsync(src, work / "copy.bin"),
                "put": put,
            },
            args.reps,
        )
        entry = store.open(key)
        art = entry.path / "model.bin"
        full = LocalStore(store.root, full_verify=True)

        def hit(s: LocalStore) -> None:
            e = s.get(key)
            assert e is not None
            read_all(e.path / "model.bin")

        read_all(art)  # warm
        warm = {
            "raw_read": lambda: read_all(art),
            "get_memo": lambda: hit(store),
            "get_full": lambda: hit(full),
            "digest": lambda: _fs.digest_file(art),
            "digest_1thread": lambda: digest_one_thread(art),
        }
        paired(r, "warm", warm, args.read_reps)
        cold = {k: warm[k] for k in ("raw_read", "get_memo", "get_full")}
        paired(r, "cold", cold, args.read_reps, before=lambda: drop_cache(art))

        many = LocalStore(work / "many")
        synthetic_entries(many, args.entries)
        r["entries"] = args.entries
        t0 = time.perf_counter()
        many.ls()
        r["ls_first_s"] = time.perf_counter() - t0  # reads every manifest, writes the index
        env = {**os.environ, "ACACHE_DIR": str(many.root)}

        def cli(*argv: str) -> None:
            cmd = [sys.executable, "-m", "artifactcache.cli", *argv]
            subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, check=True)

        listing = {
            "help": lambda: cli("--help"),
            "ls_json": lambda: cli("ls", "--json"),
            "ls_table": lambda: cli("ls"),
            "ls_lib": many.ls,
            "scan_lib": many.scan,
        }
        paired(r, "list", listing, args.read_reps)

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
                return compute_key({**factors, "weights": w})

            r[f"{label}_memo_lookup_s"] = timed(lookup, 20)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    r["load_after"] = [round(x, 2) for x in os.getloadavg()]
    report(r)


ROWS = [  # label, group, subject, baseline, baseline label, target
    ("put (copy in + hash + fsync + rename)", "write", "put", "copy", "plain copy", ""),
    ("put", "write", "put", "copy_fsync", "plain copy + fsync", ""),
    ("verified get + read, memo", "warm", "get_memo", "raw_read", "raw read, warm", "<= 1.1x"),
    ("verified get + read, memo", "cold", "get_memo", "raw_read", "raw read, cold", "<= 1.1x"),
    ("verified get + read, full re-hash", "warm", "get_full", "raw_read", "raw read, warm", ""),
    ("verified get + read, full re-hash", "cold", "get_full", "raw_read", "raw read, cold", ""),
    ("blake3 digest, mmap, max_threads=AUTO", "warm", "digest", "raw_read", "raw read, warm", ""),
    ("blake3 digest, mmap, one thread", "warm", "digest_1thread", "raw_read", "raw read, warm", ""),
]


def report(r: dict) -> None:
    gib, n, ls = r["size_bytes"] / 2**30, r["entries"], r["list"]
    print(
        f"Artifact: {gib:.2f} GiB of random bytes. Seconds: median (min-max) over "
        f"{r['reps']} write / {r['read_reps']} read rounds; ratio: median of per-round ratios "
        "to the baseline timed in the same round.\n"
    )
    print("| operation | cache | seconds | ratio | baseline | target |")
    print("|---|---|---:|---:|---|---|")
    for label, group, name, base, base_label, target in ROWS:
        g = r[group]
        cache = group if group in ("warm", "cold") else ""
        rat = ratio(g, name, base)
        print(f"| {label} | {cache} | {span(g[name])} | {rat:.2f}x | {base_label} | {target} |")
    gbs = lambda g, k: r["size_bytes"] / r[g][k]["median_s"] / 1e9  # noqa: E731
    print(
        f"\nThroughput (GB/s, medians): raw read warm {gbs('warm', 'raw_read'):.2f}, cold "
        f"{gbs('cold', 'raw_read'):.2f}; blake3 AUTO {gbs('warm', 'digest'):.2f}, one thread "
        f"{gbs('warm', 'digest_1thread'):.2f}; plain copy {gbs('write', 'copy'):.2f}; "
        f"copy + fsync {gbs('write', 'copy_fsync'):.2f}; put {gbs('write', 'put'):.2f}."
    )
    print("\n| listing / lookup | seconds | target |")
    print("|---|---:|---|")
    rows = [
        (f"`LocalStore.ls()` of {n} entries, in process (summary index)", "ls_lib", ""),
        (f"`LocalStore.scan()` of {n} entries, in process (every manifest)", "scan_lib", ""),
        (f"`acache ls --json`, {n} entries, whole process", "ls_json", "< 0.5 s"),
        (f"`acache ls` (table), {n} entries, whole process", "ls_table", ""),
        ("`acache --help`: process start + imports, no cache work", "help", ""),
    ]
    for label, name, target in rows:
        print(f"| {label} | {span(ls[name])} | {target} |")
    first = r["ls_first_s"]
    print(f"| first `ls()` after {n} new entries (reads manifests, writes index) | {first:.3f} | |")
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
        f"Python {m['python']}; {m['packages']}; {m['date']}; load average before "
        f"{m['load_before']}, after {r['load_after']} (a machine shared with other work)."
    )
    print(f"Command: `{m['command']}`\n")
    print("```json\n" + json.dumps(r, indent=1, sort_keys=True) + "\n```")


if __name__ == "__main__":
    main()
