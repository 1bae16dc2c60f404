"""Where one prefill's GPU time goes: kernel time by kind, acache eager against transformers.

One process, random weights (acache's seeded ones, loaded into transformers as in
prefill_ttft.py), one prompt of ``--n`` tokens: each side runs the prompt twice, then
once under ``torch.profiler``; the CUDA kernels are summed by kind (GEMM, attention,
the rest) and the ten longest are listed. Explains a TTFT difference that
prefill_ttft.py measures.

    python benchmarks/prefill_profile.py --out OUT            # H200: llama-7b bf16, 2000
    python benchmarks/prefill_profile.py --recipe tiny-llama --device cpu --dtype fp32 \\
        --n 40 --max-seq-len 64 --out /tmp/pp                 # the CPU check (CPU ops)
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

# Substrings of kernel names, first match wins.
KINDS = (
    ("attention", ("flash", "fmha", "attention", "sdpa")),
    ("gemm", ("gemm", "xmma", "cutlass", "nvjet", "aten::mm", "aten::addmm", "aten::bmm")),
)


def kind_of(name: str) -> str:
    low = name.lower()
    return next((k for k, keys in KINDS if any(s in low for s in keys)), "other")


def profile(fn: Any, device: str) -> dict[str, Any]:
    import torch
    from torch.profiler import ProfilerActivity, profile

    cuda = device.startswith("cuda")
    for _ in range(2):
        fn()
    acts = [ProfilerActivity.CUDA] if cuda else [ProfilerActivity.CPU]
    with profile(activities=acts) as prof:
        fn()
        if cuda:
            torch.cuda.synchronize()
    per_kernel: dict[str, float] = defaultdict(float)
    for e in prof.key_averages():
        us = e.device_time_total if cuda else e.self_cpu_time_total
        if us > 0 and (cuda or e.key.startswith("aten::")):
            per_kernel[e.key] += us
    by_kind: dict[str, float] = defaultdict(float)
    for name, us in per_kernel.items():
        by_kind[kind_of(name)] += us
    top = sorted(per_kernel.items(), key=lambda kv: -kv[1])[:10]
    return {
        "total_ms": sum(per_kernel.values()) / 1e3,
        "by_kind_ms": {k: v / 1e3 for k, v in sorted(by_kind.items())},
        "top": [{"kernel": k[:160], "kind": kind_of(k), "ms": v / 1e3} for k, v in top],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--recipe", default="llama-7b")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--max-seq-len", type=int, default=4096)
    ap.add_argument("--n", type=int, default=2000, help="prompt tokens")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    import torch
    from prefill_ttft import _transformers, prompt

    import artifactcache
    from artifactcache.recipes import load_recipe

    recipe = load_recipe(a.recipe).with_shapes(max_seq_len=a.max_seq_len)
    ids = prompt(recipe.model.vocab_size, a.n)
    report: dict[str, Any] = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name() if a.device.startswith("cuda") else None,
        "settings": vars(a) | {"out": str(a.out)},
    }
    with tempfile.TemporaryDirectory() as cache:
        runner = artifactcache.load(
            a.recipe, backend="eager", device=a.device, dtype=a.dtype,
            max_seq_len=a.max_seq_len, cache_dir=cache, seed=a.seed,
        )  # fmt: skip
        report["eager"] = profile(lambda: runner.generate(ids, 1, eos_token_ids=()), a.device)
    runner = None  # its model and cache go before transformers' own
    spec = {"dtype": a.dtype, "seed": a.seed, "gen": 1}
    first, _ = _transformers(spec, recipe, torch.device(a.device), {})
    report["transformers"] = profile(lambda: first(ids), a.device)
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "prefill_profile.json").write_text(json.dumps(report, indent=2) + "\n")
    for side in ("eager", "transformers"):
        r = report[side]
        kinds = ", ".join(f"{k} {v:.1f}" for k, v in r["by_kind_ms"].items())
        print(f"{side}: {r['total_ms']:.1f} ms of kernels ({kinds})")
        for t in r["top"][:6]:
            print(f"    {t['ms']:7.2f} ms  {t['kind']:9s} {t['kernel'][:90]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
