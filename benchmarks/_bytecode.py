"""Bytecode for the packages a build imports, written before anything is timed.

A ``pip install`` writes each module's bytecode. The GPU image does not: its Python runs
with ``PYTHONDONTWRITEBYTECODE=1`` over site-packages without ``__pycache__``, and the
device calls set ``PYTHONPYCACHEPREFIX`` to an empty folder of a fresh machine. The
first process of a call then compiles the source of every module it imports. On the
2-core VM, a tiny-llama aoti build with three workers took 51.5-54.1 s with an empty
prefix against 41.8-42.6 s with a filled one, each worker's export 11.1-13.4 s against
4.0-5.2 s (docs/perf-notes.md, attempt 49). A cold build timed as a call's first work
would include that, where a user's would not.

``prime(env)`` runs ``compileall`` over those packages' folders into the environment's
prefix, in a child with ``env``, and says what it did. Without ``PYTHONPYCACHEPREFIX``
it does nothing: bytecode would then go next to the sources, which on the image are
read-only. ``python3 benchmarks/_bytecode.py`` does the same for a call's environment
(after ``export PYTHONPYCACHEPREFIX=...``) and prints the result as JSON.
"""

from __future__ import annotations

import subprocess
import sys
import time
from typing import Any

# What an aoti or inductor build imports (torch's and Triton's own lazily loaded modules
# included: compileall takes the packages whole), and the standard library.
PACKAGES = (
    "torch", "triton", "sympy", "mpmath", "networkx", "jinja2", "markupsafe", "filelock",
    "fsspec", "typing_extensions", "safetensors", "numpy", "artifactcache",
)  # fmt: skip

_CHILD = """
import importlib.util, os, sysconfig, sys
dirs = [sysconfig.get_paths()["stdlib"]]
for name in sys.argv[1:]:
    spec = importlib.util.find_spec(name)
    if spec is not None and spec.submodule_search_locations:
        dirs.extend(spec.submodule_search_locations)
    elif spec is not None and spec.origin and spec.origin.endswith(".py"):
        dirs.append(spec.origin)
print("\\n".join(d for d in dirs if os.path.exists(d)))
"""


def prime(env: dict[str, str]) -> dict[str, Any]:
    """Bytecode of PACKAGES and the standard library into ``env``'s PYTHONPYCACHEPREFIX;
    {"prefix", "seconds", "dirs", "rc"}, or {"prefix": None, "skipped": why}."""
    prefix = env.get("PYTHONPYCACHEPREFIX")
    if not prefix:
        return {"prefix": None, "skipped": "PYTHONPYCACHEPREFIX is not set"}
    start = time.perf_counter()
    found = subprocess.run(
        [sys.executable, "-c", _CHILD, *PACKAGES],
        env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    dirs = found.stdout.split()
    # -j 0: every core; tests and build scripts excluded (no build imports them).
    done = subprocess.run(
        [sys.executable, "-m", "compileall", "-q", "-j", "0", "-x", r"/(tests?|testing)/", *dirs],
        env=env, capture_output=True, text=True,
    )  # fmt: skip
    return {
        "prefix": prefix,
        "seconds": round(time.perf_counter() - start, 1),
        "dirs": len(dirs),
        "rc": done.returncode,  # non-zero where a file does not compile (py2 leftovers)
    }


if __name__ == "__main__":  # the first line of a device call: python3 benchmarks/_bytecode.py
    import json
    import os

    print(json.dumps(prime(dict(os.environ))))
