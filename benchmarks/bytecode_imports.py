"""What importing costs with and without cached bytecode, in fresh processes (issue 31).

A warm inductor load imports ~1,300 modules that ``import torch`` does not (Dynamo,
Inductor, AOTAutograd, sympy, networkx, torch.distributed, ...). On a machine whose
Python writes no bytecode (``PYTHONDONTWRITEBYTECODE=1``, no ``__pycache__`` in
site-packages) every process compiles each of them from source. How much of a warm
start is that? Per scenario, ``--runs`` fresh processes time ``import torch`` alone,
then the import of every module listed in ``--modules`` (one dotted name a line, e.g.
the modules a profiled warm load executed), each module that fails to import counted
and skipped:

- ``as_is``: the environment as it is;
- ``bytecode``: ``PYTHONDONTWRITEBYTECODE`` removed and ``PYTHONPYCACHEPREFIX`` set to a
  fresh folder, which one untimed process fills first, as ``pip install`` writes the
  ``.pyc`` files of a normal install.

    python benchmarks/bytecode_imports.py --modules FILE --runs 3 --out OUT.json

To see the cost of a Python without bytecode on a machine whose packages have it, run
with ``PYTHONDONTWRITEBYTECODE=1 PYTHONPYCACHEPREFIX=$(mktemp -d)``: Python then looks
for bytecode only in that empty folder, so ``as_is`` compiles every module.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CHILD = """
import importlib, json, sys, time
t0 = time.perf_counter()
import torch
t1 = time.perf_counter()
failed = 0
for name in open(sys.argv[1]).read().split():
    try:
        importlib.import_module(name)
    except Exception:
        failed += 1
t2 = time.perf_counter()
print(json.dumps({"import_torch_s": t1 - t0, "modules_s": t2 - t1, "failed": failed,
                  "modules_loaded": len(sys.modules)}))
"""


def run_child(modules: Path, env: dict[str, str]) -> dict[str, float]:
    out = subprocess.run([sys.executable, "-c", CHILD, str(modules)], env=env,
                         capture_output=True, text=True, check=True)  # fmt: skip
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--modules", type=Path, required=True)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    plain = dict(os.environ)
    cached = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    cached["PYTHONPYCACHEPREFIX"] = tempfile.mkdtemp(prefix="acache-pyc-")
    run_child(args.modules, cached)  # writes the bytecode, untimed
    result: dict[str, object] = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "python": sys.version.split()[0],
        "PYTHONDONTWRITEBYTECODE": os.environ.get("PYTHONDONTWRITEBYTECODE"),
        "modules_listed": len(args.modules.read_text().split()),
    }
    runs: dict[str, list[dict[str, float]]] = {"as_is": [], "bytecode": []}
    for _ in range(args.runs):  # interleaved, so both see the same machine
        for name, env in (("as_is", plain), ("bytecode", cached)):
            runs[name].append(run_child(args.modules, env))
            # A line per process as it ends, so a run cut by a time limit keeps the others.
            print(json.dumps({name: runs[name][-1]}), flush=True)
    result["runs"] = runs
    result["median"] = {
        name: {k: round(statistics.median(r[k] for r in rows), 3)
               for k in ("import_torch_s", "modules_s")}
        for name, rows in runs.items()
    }  # fmt: skip
    args.out.write_text(json.dumps(result, indent=1))
    print(json.dumps(result["median"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
