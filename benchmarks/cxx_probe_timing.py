"""The C++ compiler probe's wall time with two candidates, one after the other against
side by side (backends/shared/cxx.py, ``_probe_at_once``), in fresh processes.

The H200 image's case is made here: ``$CXX`` is a compiler whose code crashes (a g++
wrapper building a probe that raises SIGSEGV, as tests/_backend_util.fake_cxx does), so
the choice needs both its probe and g++'s. No memo: every run probes.

    python benchmarks/cxx_probe_timing.py --runs 3 [--out OUT.json]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CRASHING = '#include <signal.h>\nextern "C" int acache_regex_probe(void){raise(SIGSEGV);return 0;}'
CHILD = """
import sys, time, torch
from artifactcache.backends.shared import cxx
if sys.argv[1] == "serial":
    cxx._probe_at_once = lambda *a, **k: None
t = time.perf_counter()
chosen, rejected = cxx.compiler_choice()
print(time.perf_counter() - t, chosen, len(rejected))
"""


def crashing_cxx(folder: Path) -> str:
    src = folder / "crash.cpp"
    src.write_text(CRASHING)
    script = folder / "crashing-g++"
    script.write_text(
        "#!/bin/sh\n"
        'out=""; prev=""; for a in "$@"; do [ "$prev" = "-o" ] && out="$a"; prev="$a"; done\n'
        f'exec g++ -shared -fPIC -o "$out" {src}\n'
    )
    script.chmod(0o755)
    return str(script)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    results: dict[str, list[float]] = {"serial": [], "side_by_side": []}
    with tempfile.TemporaryDirectory() as d:
        env = dict(os.environ, CXX=crashing_cxx(Path(d)), PYTHONPATH=str(REPO))
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
    report = {
        "command": "python benchmarks/cxx_probe_timing.py " + " ".join(sys.argv[1:]),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": {
            "host": platform.node(),
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
        },  # fmt: skip
        "choice_seconds": results,
    }
    print(json.dumps(report["choice_seconds"]))
    if args.out:
        args.out.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
