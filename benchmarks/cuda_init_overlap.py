"""Does creating the CUDA context in a thread while ``import torch`` runs save time?

The premise of docs/perf-notes.md's warm-start attempt 3: a warm aoti start spends
~3 s importing torch and then ~1+ s creating the CUDA context, one after the other.
The driver's primary context is what the CUDA runtime (and so torch) adopts, so a
thread that calls the driver's ``cuInit`` + ``cuDevicePrimaryCtxRetain`` through
ctypes (which releases the GIL) can build it while the main thread imports.

Each trial is a fresh interpreter (the thing being timed is process start-up):

* ``serial``:  import torch; then ``torch.empty(1, device="cuda")`` + synchronize;
* ``overlap``: start the driver thread, import torch, join, then the same tensor.

Prints one JSON object: per mode, the median and every trial of ``import_s``
(process start -> torch imported) and ``ready_s`` (process start -> first tensor on
the device), alternating modes so drift hits both. Needs a CUDA GPU.

    python benchmarks/cuda_init_overlap.py --trials 5
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

CHILD = r"""
import sys, time, json
t0 = float(sys.argv[2])
mode = sys.argv[1]
if mode == "overlap":
    import ctypes, threading
    done = {}
    def _ctx():
        s = time.monotonic()
        cu = ctypes.CDLL("libcuda.so.1")
        rc = cu.cuInit(0)
        dev, ctx = ctypes.c_int(), ctypes.c_void_p()
        rc = rc or cu.cuDeviceGet(ctypes.byref(dev), 0)
        rc = rc or cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev)
        done["rc"], done["ctx_s"] = rc, time.monotonic() - s
    th = threading.Thread(target=_ctx, daemon=True)
    th.start()
import torch
t_import = time.monotonic()
if mode == "overlap":
    th.join()
x = torch.empty(1, device="cuda")
torch.cuda.synchronize()
t_ready = time.monotonic()
print(json.dumps({"import_s": t_import - t0, "ready_s": t_ready - t0,
                  "driver": done if mode == "overlap" else None}))
"""


def trial(mode: str) -> dict:
    t0 = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-c", CHILD, mode, repr(t0)], capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--trials", type=int, default=5)
    args = p.parse_args()
    trial("serial")  # page cache warm for both modes: the first process pays disk reads
    res: dict[str, list[dict]] = {"serial": [], "overlap": []}
    for _ in range(args.trials):
        for mode in ("serial", "overlap"):
            res[mode].append(trial(mode))
    summary = {
        mode: {
            "median_import_s": round(statistics.median(r["import_s"] for r in rs), 3),
            "median_ready_s": round(statistics.median(r["ready_s"] for r in rs), 3),
            "trials": rs,
        }
        for mode, rs in res.items()
    }
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
