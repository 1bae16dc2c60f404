"""The split-KV decode kernel on a GPU: its agreement with SDPA, its cost per layer, and
the torch backends built with it against eager.

1. ``kernel``: for each shape below, the kernel (models/decode_attention.py) against
   SDPA under the causal mask (bf16; max abs difference), and the time of one layer's
   decode attention: 32 calls over 32 distinct caches (so L2 serves nothing) captured
   in one CUDA graph, the median of ``--iters`` replays / 32. Beside it SDPA as the
   bucketed decode step runs it (the cache view up to the bucket, with the bool mask),
   and SDPA over the whole allocated cache. GB/s counts the filled KV only.
2. ``backends``: tiny recipes built on the GPU (fp32, max_seq_len 256, max_batch 4)
   with aoti and inductor (split-KV, the CUDA default) and eager (SDPA): greedy tokens
   of a batch of four prompts (150, 17, 5 and 120 tokens) must be identical to eager's,
   and each decode step must have its CUDA graph.

    python benchmarks/split_kv_check.py --out OUT [--iters 50] [--skip-backends]

Writes OUT/split_kv_check.json and prints markdown tables.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import statistics
import time
from pathlib import Path
from typing import Any

# (label, batch, heads, kv heads, head_dim, allocated slots, position)
SHAPES = [
    ("llama-7b, 4096 allocated, pos 200", 1, 32, 32, 128, 4096, 200),
    ("llama-7b, 4096 allocated, pos 1000", 1, 32, 32, 128, 4096, 1000),
    ("llama-7b, 4096 allocated, pos 4000", 1, 32, 32, 128, 4096, 4000),
    ("llama-7b, 256 allocated, pos 200", 1, 32, 32, 128, 256, 200),
    ("llama-7b batch 32, 256 allocated, pos 200", 32, 32, 32, 128, 256, 200),
    ("llama-7b batch 32, 4096 allocated, pos 200", 32, 32, 32, 128, 4096, 200),
    ("llama-3-8b (GQA 4), 4096 allocated, pos 1000", 1, 32, 8, 128, 4096, 1000),
    ("phi-2 (head_dim 80), 2048 allocated, pos 200", 1, 32, 32, 80, 2048, 200),
    ("phi-3 (head_dim 96), 4096 allocated, pos 200", 1, 32, 32, 96, 4096, 200),
]
LAYERS = 32
# (split, block_n, num_warps, stages): the cuts launch_config's rule is chosen from.
SWEEP = [(64, 64, 4, 3), (128, 64, 4, 3), (256, 64, 4, 3), (512, 64, 4, 3),
         (128, 64, 4, 2), (256, 32, 4, 4), (256, 128, 8, 2), (512, 64, 8, 3)]  # fmt: skip


def _label(cut: tuple[int, int, int, int]) -> str:
    return "s{}b{}w{}p{}".format(*cut)


def _graph_time(fn: Any, iters: int) -> float:
    """Seconds per call of ``fn`` (which makes LAYERS calls) under one CUDA graph."""
    import torch

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / 1e3)
    return statistics.median(times) / LAYERS


def kernel_rows(iters: int) -> list[dict[str, Any]]:
    import torch

    from artifactcache.kv_buckets import kv_bucket
    from artifactcache.models import decode_attention as da
    from artifactcache.models.common import attention_mask, decode_lo, sdpa
    from artifactcache.models.decode_attention import decode_attention

    dev = torch.device("cuda")
    rows = []
    for label, B, H, Hkv, D, S, p in SHAPES:
        torch.manual_seed(0)
        q = torch.randn(B, H, 1, D, device=dev, dtype=torch.bfloat16)
        bf16 = torch.bfloat16
        ks = [torch.randn(B, Hkv, S + 1, D, device=dev, dtype=bf16) for _ in range(LAYERS)]
        vs = [torch.randn_like(k) for k in ks]
        pos = torch.tensor([p], device=dev)
        row_start = torch.zeros(B, dtype=torch.int64, device=dev)
        lo = decode_lo(pos, row_start, None, B)
        full_k = [k[:, :, :S] for k in ks]  # the split-KV cache has no spare slot
        full_v = [v[:, :, :S] for v in vs]
        got = decode_attention(q, full_k[0], full_v[0], lo, pos)
        keys = torch.arange(S, device=dev)
        want = sdpa(q, full_k[0], full_v[0], attention_mask(pos, keys, None, row_start), H // Hkv)
        err = (got.float() - want.float()).abs().max().item()
        bucket = kv_bucket(p + 1, S)
        bmask = attention_mask(pos, keys[:bucket], None, row_start)
        fmask = attention_mask(pos, keys, None, row_start)
        rep = H // Hkv

        def split_kv(full_k=full_k, full_v=full_v, lo=lo, pos=pos, q=q):
            for k, v in zip(full_k, full_v, strict=True):
                decode_attention(q, k, v, lo, pos)

        def bucketed(ks=ks, vs=vs, bucket=bucket, bmask=bmask, q=q, rep=rep):
            for k, v in zip(ks, vs, strict=True):
                sdpa(q, k[:, :, :bucket], v[:, :, :bucket], bmask, rep)

        def whole(full_k=full_k, full_v=full_v, fmask=fmask, q=q, rep=rep):
            for k, v in zip(full_k, full_v, strict=True):
                sdpa(q, k, v, fmask, rep)

        filled = 2 * B * Hkv * (p + 1) * D * 2
        cut = da.launch_config(B, Hkv, full_k[0].shape[2])
        row = {"shape": label, "max_abs_diff_vs_sdpa": err, "filled_kv_bytes": filled,
               "launch": _label((cut.split, cut.block_n, cut.num_warps, cut.stages))}  # fmt: skip
        for name, fn in (("split_kv", split_kv), ("sdpa_bucket", bucketed), ("sdpa_whole", whole)):
            t = _graph_time(fn, iters)
            row[f"{name}_us"] = round(t * 1e6, 2)
            row[f"{name}_gbps"] = round(filled / t / 1e9, 1)
        chosen = da.launch_config
        for c in SWEEP:  # the kernel at each cut, for choosing launch_config's rule
            da.launch_config = lambda rows, heads, slots, c=c: da.Launch(*c)
            try:
                err_c = decode_attention(q, full_k[0], full_v[0], lo, pos).float() - want.float()
                row[f"{_label(c)}_max_diff"] = err_c.abs().max().item()
                row[f"{_label(c)}_us"] = round(_graph_time(split_kv, iters) * 1e6, 2)
            except Exception as e:  # noqa: BLE001 - a cut that fails is a cell, not the end
                row[f"{_label(c)}_us"] = f"{type(e).__name__}: {str(e)[:200]}"
            finally:
                da.launch_config = chosen
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


PROMPT_LENS = (150, 17, 5, 120)


def backend_rows(
    recipes: list[str], new_tokens: int, backends: tuple[str, ...] = ("aoti", "inductor")
) -> list[dict[str, Any]]:
    import torch

    import artifactcache

    out = []
    for recipe in recipes:
        prompts = [[(7 * i + 3 * j) % 250 + 3 for j in range(n)] for i, n in enumerate(PROMPT_LENS)]
        ref = None
        for backend in ("eager", *backends):
            t0 = time.perf_counter()
            try:
                r = artifactcache.load(
                    recipe, backend, device="cuda", dtype="fp32", max_seq_len=256, max_batch=4
                )
                toks = r.generate_batch(prompts, new_tokens, eos_token_ids=())
                row: dict[str, Any] = {
                    "recipe": recipe,
                    "backend": backend,
                    "seconds": round(time.perf_counter() - t0, 1),
                    "info": {k: v for k, v in r.info.items() if isinstance(v, (bool, int, str))},
                }
                if ref is None:
                    ref = toks
                row["tokens_equal_eager"] = toks == ref
                row["rows_equal"] = [a == b for a, b in zip(toks, ref, strict=True)]
            except Exception as e:  # noqa: BLE001 - a failed build is a row, not the end
                row = {"recipe": recipe, "backend": backend, "error": f"{type(e).__name__}: {e}"}
            out.append(row)
            print(json.dumps(row), flush=True)
            torch.cuda.empty_cache()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--recipes", default="tiny-llama,tiny-mistral,tiny-phi-2,tiny-qwen3")
    ap.add_argument("--new-tokens", type=int, default=48)
    ap.add_argument("--skip-backends", action="store_true")
    ap.add_argument("--skip-kernel", action="store_true")
    ap.add_argument("--backends", default="aoti,inductor", help="compared with eager")
    args = ap.parse_args()
    import torch
    import triton

    args.out.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "python": platform.python_version(),
        "command": "python benchmarks/split_kv_check.py --out OUT --recipes " + args.recipes,
    }
    report["kernel"] = [] if args.skip_kernel else kernel_rows(args.iters)
    path = args.out / "split_kv_check.json"
    path.write_text(json.dumps(report, indent=2) + "\n")
    if not args.skip_backends:
        backends = tuple(args.backends.split(","))
        report["backends"] = backend_rows(args.recipes.split(","), args.new_tokens, backends)
        path.write_text(json.dumps(report, indent=2) + "\n")
    sweep = " | ".join(f"{_label(c)} µs" for c in SWEEP)
    print(f"\n| shape | max diff | split-KV µs (GB/s) | SDPA bucket µs | SDPA whole µs | {sweep} |")
    print("|---|---:|---:|---:|---:|" + "---:|" * len(SWEEP))
    for r in report["kernel"]:
        cells = " | ".join(str(r[f"{_label(c)}_us"]) for c in SWEEP)
        print(
            f"| {r['shape']} ({r['launch']}) | {r['max_abs_diff_vs_sdpa']:.1e} "
            f"| {r['split_kv_us']} "
            f"({r['split_kv_gbps']}) | {r['sdpa_bucket_us']} | {r['sdpa_whole_us']} | {cells} |"
        )
    for r in report.get("backends", []):
        print(r)


if __name__ == "__main__":
    main()
