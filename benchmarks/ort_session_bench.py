"""ORT session creation: exported model with all graph optimizations (cold) vs the
cached optimized model with optimizations off (warm), median of N, in one run.

    python benchmarks/ort_session_bench.py [--recipe tiny-phi-2] [--n 9]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--recipe", default="tiny-phi-2")
    ap.add_argument("--n", type=int, default=9)
    args = ap.parse_args()

    from artifactcache import api
    from artifactcache.backends.onnx import backend as ortb
    from artifactcache.backends.onnx import export as ox
    from artifactcache.store.local import LocalStore

    root = Path(tempfile.mkdtemp(prefix="ortbench-"))
    os.chmod(root, 0o700)
    store = LocalStore(root)
    res = api.build(args.recipe, "ort", store=store)
    raw = store.get(res.entry.meta["export_key"]).path / ox.MODEL_FILE
    opt = res.entry.path / ortb.OPT_MODEL
    ort = ortb.onnxruntime_module()

    def median_s(path: Path, level: str) -> float:
        times = []
        for _ in range(args.n):
            t0 = time.perf_counter()
            ort.InferenceSession(
                str(path), ortb.session_options(level), providers=["CPUExecutionProvider"]
            )
            times.append(time.perf_counter() - t0)
        return sorted(times)[len(times) // 2]

    cold, warm = median_s(raw, "all"), median_s(opt, "none")
    print(
        json.dumps(
            {
                "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
                "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
                "onnxruntime": ort.__version__,
                "recipe": args.recipe,
                "n": args.n,
                "cold_session_ms": round(cold * 1e3, 1),
                "warm_session_ms": round(warm * 1e3, 1),
                "ratio": round(cold / warm, 2),
                "command": "python benchmarks/ort_session_bench.py " + " ".join(sys.argv[1:]),
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
