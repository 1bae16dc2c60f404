"""Why does a CUDA-graph capture of an AOTI decode step fail? A diagnosis, not a timing.

For each ``RECIPE:MAX_SEQ_LEN`` this builds (or loads) the aoti entry in this process,
prints the runner's ``info`` (``cuda_graph_error`` holds a failed capture's whole
message), lists the AOTI shim calls and host synchronisations that the generated C++ of
each step makes (the usual reasons a capture fails), and then captures a fresh decode
container by hand under each capture mode with the AOTI runtime's own stderr, where its
C++ exception text goes, left on this process's stderr.

    python benchmarks/capture_diag.py --cache-dir /tmp/c tiny-llama:64 small.toml:4096

Writes ``OUT/capture_diag.json`` with ``--out``.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

# Calls that cannot run while a stream captures, or that allocate outside the caching
# allocator; a host read of a device value shows up as _local_scalar_dense / item.
HOST_SYNC = re.compile(
    r"cudaStreamSynchronize|cudaDeviceSynchronize|cudaEventSynchronize|cudaMemcpy\(|"
    r"cudaMalloc\(|_local_scalar_dense|\.item\(|aoti_torch_item"
)
SHIM = re.compile(r"\b(aoti_torch_cuda_\w+|aoti_torch_\w+_out|aoti_torch_proxy\w*)\(")


def scan_sources(entry_dir: Path) -> dict[str, Any]:
    """Per step: the shim calls and host-sync lines of the generated C++ kept in the entry."""
    out: dict[str, Any] = {}
    for cpp in sorted(entry_dir.rglob("*.cpp")):
        text = cpp.read_text(errors="replace")
        step = cpp.relative_to(entry_dir).parts[0]
        shims = Counter(SHIM.findall(text))
        syncs = [ln.strip()[:200] for ln in text.splitlines() if HOST_SYNC.search(ln)]
        out.setdefault(step, []).append(
            {
                "file": str(cpp.relative_to(entry_dir)),
                "bytes": len(text),
                "shim_calls": dict(shims.most_common()),
                "host_sync_lines": syncs[:40],
            }
        )
    if not out:
        out["files"] = sorted(str(p.relative_to(entry_dir)) for p in entry_dir.rglob("*"))[:80]
    return out


def manual_captures(runner: Any, entry_dir: Path, meta: dict[str, Any]) -> list[dict]:
    """Capture a fresh decode container under each mode; what each attempt raised."""
    import torch

    from artifactcache.backends.aoti import share_constants
    from artifactcache.backends.runner import decode_examples
    from artifactcache.backends.torch_private import aoti_container_runner

    model = runner.keepalive[0]
    state = dict(model.named_parameters(remove_duplicate=False))
    state.update(dict(model.named_buffers(remove_duplicate=False)))
    dev = runner.device
    example = decode_examples(runner.recipe, dev)[0]
    results = []
    for mode in ("relaxed", "thread_local", "global"):
        cont = aoti_container_runner(entry_dir / meta["steps"]["decode"], dev)
        share_constants(cont, state, "decode")
        static = [t.clone() for t in example]
        rec: dict[str, Any] = {"mode": mode}
        try:
            side = torch.cuda.Stream(dev)
            side.wait_stream(torch.cuda.current_stream(dev))
            with torch.cuda.stream(side):
                for _ in range(2):
                    cont.run(static)
            torch.cuda.current_stream(dev).wait_stream(side)
            torch.cuda.synchronize(dev)
            print(f"--- capture mode {mode}: begin", file=sys.stderr, flush=True)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, capture_error_mode=mode):
                cont.run(static)
            graph.replay()
            torch.cuda.synchronize(dev)
            rec["ok"] = True
        except Exception as e:
            rec["ok"] = False
            rec["error"] = f"{type(e).__name__}: {e}"[:4000]
        print(f"--- capture mode {mode}: {rec}", file=sys.stderr, flush=True)
        try:
            torch.cuda.synchronize(dev)
        except Exception as e:  # a sticky error ends the probe: say so
            rec["sticky"] = str(e)[:300]
            results.append(rec)
            break
        results.append(rec)
    return results


def diagnose(spec: str, cache_dir: Path, dtype: str) -> dict[str, Any]:
    import artifactcache

    name, _, msl = spec.rpartition(":")
    rec: dict[str, Any] = {"spec": spec}
    t0 = time.perf_counter()
    runner = artifactcache.load(
        name, backend="aoti", device="cuda", dtype=dtype, max_seq_len=int(msl), cache_dir=cache_dir
    )
    rec["load_s"] = round(time.perf_counter() - t0, 1)
    rec["info"] = dict(runner.info)
    print(f"{spec}: info {json.dumps(rec['info'])[:6000]}", file=sys.stderr, flush=True)
    entries = sorted(cache_dir.rglob("aoti.json"), key=lambda p: p.stat().st_mtime)
    entry_dir = entries[-1].parent if entries else None
    rec["entry_dir"] = str(entry_dir)
    if entry_dir is not None:
        meta = json.loads((entry_dir / "aoti.json").read_text())
        for part, fn in (
            ("sources", lambda: scan_sources(entry_dir)),
            ("manual", lambda: manual_captures(runner, entry_dir, meta)),
        ):
            try:
                rec[part] = fn()
            except Exception as e:  # keep what the other parts find
                rec[part] = {"error": f"{type(e).__name__}: {e}"[:4000]}
    tokens = runner.generate([1, 15043, 29892, 590, 1024, 338], 8)
    rec["tokens"] = list(tokens)[:16] if not isinstance(tokens, dict) else tokens
    return rec


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("specs", nargs="+", help="RECIPE:MAX_SEQ_LEN")
    ap.add_argument("--cache-dir", type=Path, required=True)
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    results = []
    for spec in args.specs:
        try:
            results.append(diagnose(spec, args.cache_dir, args.dtype))
        except Exception as e:
            results.append({"spec": spec, "error": f"{type(e).__name__}: {e}"[:4000]})
        print(json.dumps(results[-1], indent=1, default=str)[:20000], flush=True)
        if args.out:
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / "capture_diag.json").write_text(
                json.dumps(results, indent=1, default=str) + "\n"
            )


if __name__ == "__main__":
    main()
