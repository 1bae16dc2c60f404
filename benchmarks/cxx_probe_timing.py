"""The C++ compiler probe's wall time with two candidates, one after the other against
side by side (backends/shared/cxx.py, ``_probe_at_once``), in fresh processes.

The H200 image's case is made here: ``$CXX`` is a compiler whose code crashes (the
tests' g++ wrapper, tests/_backend_util.fake_cxx, building a probe that raises SIGSEGV), so
the choice needs both its probe and g++'s. No memo: every run probes.

    python benchmarks/cxx_probe_timing.py --runs 3 [--out OUT.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
from _backend_util import CRASHING_PROBE, fake_cxx  # noqa: E402  (the tests' crashing $CXX)
from _provenance import provenance  # noqa: E402

CHILD = """
import sys, time, torch
from artifactcache.backends.shared import cxx
if sys.argv[1] == "serial":
    cxx._probe_at_once = lambda *a, **k: (None, {})
t = time.perf_counter()
chosen, rejected = cxx.compiler_choice()
print(time.perf_counter() - t, chosen, len(rejected))
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    results: dict[str, list[float]] = {"serial": [], "side_by_side": []}
    with tempfile.TemporaryDirectory() as d:
        bad = fake_cxx(Path(d), "crashing-g++", CRASHING_PROBE)
        env = dict(os.environ, CXX=bad, PYTHONPATH=str(REPO))
        for _ in range(args.runs):
            for mode in results:  # alternating, so drift hits both alike
                start = time.perf_counter()
                out = subprocess.run(
                    [sys.executable, "-c", CHILD, mode], env=env, capture_output=True,
                    text=True, check=True,
                )  # fmt: skip
                seconds, chosen, n_rejected = out.stdout.split()
                assert n_rejected == "1" and "crashing" not in chosen, out.stdout
                results[mode].append(round(float(seconds), 2))
                print(
                    f"{mode}: choice {seconds[:5]} s (process {time.perf_counter() - start:.1f} s)"
                )
    report = {**provenance(), "choice_seconds": results}
    print(json.dumps(report["choice_seconds"]))
    if args.out:
        args.out.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
