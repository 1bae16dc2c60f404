"""The top functions of each build worker's profile (workerprofile/sitecustomize.py), by
cumulative and by own time.

    python benchmarks/workerprofile/top.py FOLDER [--n 25]
"""

from __future__ import annotations

import argparse
import io
import pstats
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folder", type=Path)
    ap.add_argument("--n", type=int, default=25)
    args = ap.parse_args()
    for path in sorted(args.folder.glob("worker-*.prof")):
        for key in ("cumulative", "tottime"):
            out = io.StringIO()
            pstats.Stats(str(path), stream=out).sort_stats(key).print_stats(args.n)
            print(f"== {path.name}, by {key}\n{out.getvalue()}")


if __name__ == "__main__":
    main()
