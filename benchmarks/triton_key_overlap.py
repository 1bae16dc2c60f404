"""Does Triton's ``triton_key()`` hash on a thread beside a load's work (torch_private's
``prefetch_triton_key``), or wait for the GIL?

In a fresh process per run, alternating: the main thread works for ``--busy-s`` seconds,
then asks for ``triton_key()``. ``seq``: nothing before; ``thread``: the key started on a
thread first. The main thread's work is either torch ops (``--work torch``: normal fills
of 80 MB tensors, which let go of the GIL, as a load's weights set-up does) or pure Python
(``--work python``, which holds it, as unpickling does). Prints one JSON line per run and
the report (with ``--out``, also written there). Needs Triton, not a GPU.

    python benchmarks/triton_key_overlap.py --runs 3 --out OUT.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from _provenance import provenance

CHILD = """
import json, sys, threading, time
import torch
from triton.runtime.cache import triton_key
mode, work, busy_s = sys.argv[1], sys.argv[2], float(sys.argv[3])
t0 = time.perf_counter()
done = {}
if mode == "thread":
    def run():
        triton_key()
        done["thread_done_s"] = time.perf_counter() - t0
    threading.Thread(target=run, daemon=True).start()
end = t0 + busy_s
while time.perf_counter() < end:
    if work == "torch":
        torch.empty(20_000_000).normal_()
    else:
        sum(range(200))
t1 = time.perf_counter()
triton_key()
t2 = time.perf_counter()
print(json.dumps({"mode": mode, "work": work, "busy_s": round(t1 - t0, 3),
                  "key_after_busy_s": round(t2 - t1, 3), **done}))
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--busy-s", type=float, default=1.5)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    rows = []
    for work in ("torch", "python"):
        for _ in range(args.runs):
            for mode in ("seq", "thread"):
                out = subprocess.run(
                    [sys.executable, "-c", CHILD, mode, work, str(args.busy_s)],
                    capture_output=True, text=True, check=True,
                )  # fmt: skip
                rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
                print(json.dumps(rows[-1]), flush=True)
    report = {**provenance(), "runs": rows}
    if args.out:
        args.out.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
