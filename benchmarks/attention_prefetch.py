"""The decode attention's L2 prefetch of the next projection, swept on one GPU (issue 32).

A decode step's layers as the one-row models run them, without a compiler: acache's row
GEMV (models/gemv.py) for every projection, its norm, activation and skip folded in, and
the split-KV kernel with the rotary embedding and the cache write
(models/decode_attention.py, ``decode_attention_rope``) at the seed benchmark's average
position (106 of 256 slots). Every layer has weights of its own, so no layer finds
another's in L2. The layers are captured in one CUDA graph, as acache's decode steps
are, and timed by replays; each ``--mib`` value is a graph of its own, the attention
prefetching that many MiB of the projection after it (0: none).

Per model and MiB: the step's time, its ratio to MiB 0 in the same run, the weights'
bytes over that time against the copy bandwidth measured in the same run (% of copy),
and a profile of one replay: each kernel's mean time by its place in the layer
(the attention and the projection after it are where the prefetch shows).

    python benchmarks/attention_prefetch.py --out OUT [--models phi-2,phi-3-mini]
        [--mib 0,4,8,16] [--layers 32] [--op rope|plain]

``--op plain``: the plain split-KV op (``decode_attention``) that the llama families'
builds run (and phi-3's quantized or aoti ones), after two copies that write the step's
k and v into the caches (Inductor's kernels there also rotate q and k; these do not), in
place of the rope op every model runs by default here.

The layer shapes are the seed recipes' (benchmarks' SHAPES below), bf16. Writes
OUT/attention_prefetch.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from _provenance import provenance

from artifactcache.measure.child.timing import copy_bandwidth
from artifactcache.models import decode_attention as da
from artifactcache.models import gemv, l2_prefetch


@dataclass(frozen=True)
class Shape:
    dim: int
    heads: int
    kv_heads: int
    head_dim: int
    rot: int
    inner: int  # the MLP's width
    phi2: bool = False  # phi-2's parallel block (in/out projections), else llama's


SHAPES = {
    "phi-2": Shape(2560, 32, 32, 80, 32, 10240, phi2=True),
    "phi-3-mini": Shape(3072, 32, 32, 96, 96, 8192),
    "llama-7b": Shape(4096, 32, 32, 128, 128, 11008),
    "llama-3-8b": Shape(4096, 32, 8, 128, 128, 14336),
}
SLOTS, POSITION = 256, 106


class Layer:
    """One layer's tensors and its decode step (one row)."""

    def __init__(self, s: Shape, dev: torch.device) -> None:
        def w(n: int, k: int) -> torch.Tensor:
            return torch.randn(n, k, device=dev, dtype=torch.bfloat16) * k**-0.5

        self.s = s
        q, kv = s.heads * s.head_dim, s.kv_heads * s.head_dim
        self.sizes = [q, kv, kv]
        ones = torch.ones(s.dim, device=dev, dtype=torch.bfloat16)
        self.norm, self.norm_bias = ones, torch.zeros_like(ones)
        if s.phi2:
            self.w_in = w(q + 2 * kv + s.inner, s.dim)
            self.b_in = torch.zeros(self.w_in.shape[0], device=dev, dtype=torch.bfloat16)
            self.w_after = w(s.dim, q + s.inner)
            self.b_out = torch.zeros(s.dim, device=dev, dtype=torch.bfloat16)
        else:
            self.w_in = w(q + 2 * kv, s.dim)
            self.w_after = w(s.dim, q)
            self.w_up = w(2 * s.inner, s.dim)
            self.w_down = w(s.dim, s.inner)
        cache = (1, s.kv_heads, SLOTS, s.head_dim)
        self.k_cache = torch.randn(cache, device=dev, dtype=torch.bfloat16)
        self.v_cache = torch.randn(cache, device=dev, dtype=torch.bfloat16)

    def weight_bytes(self) -> int:
        names = ("w_in", "w_after") if self.s.phi2 else ("w_in", "w_after", "w_up", "w_down")
        return sum(getattr(self, n).numel() * 2 for n in names)

    def step(self, x, cos, sin, lo, pos, mib: int, plain: bool = False):
        s, ops = self.s, torch.ops.acache
        one = x.reshape(1, -1)
        if s.phi2:
            # fc1's GELU on the in-projection's outputs, as models/phi2.py runs it
            h = ops.row_gemv(one, self.w_in, None, self.b_in, self.norm, 1e-5, False, None,
                             self.norm_bias, True, -1, None, sum(self.sizes))  # fmt: skip
        else:
            h = ops.row_gemv(one, self.w_in, None, None, self.norm, 1e-5, False, None)
        q, k, v = (t.view(1, 1, -1, s.head_dim).transpose(1, 2)
                   for t in h[:, : sum(self.sizes)].split(self.sizes, dim=-1))  # fmt: skip
        after = self.w_after if mib else None
        if plain:
            self.k_cache[:, :, POSITION : POSITION + 1].copy_(k)
            self.v_cache[:, :, POSITION : POSITION + 1].copy_(v)
            y = ops.decode_attention(q, self.k_cache, self.v_cache, lo, pos, after, mib << 20)
        else:
            y = ops.decode_attention_rope(q, k, v, cos, sin, self.k_cache, self.v_cache, lo,
                                          pos, after, mib << 20)  # fmt: skip
        y = y.transpose(1, 2).reshape(1, -1)
        if s.phi2:
            up = h[:, sum(self.sizes) :]
            return ops.row_gemv(y, self.w_after, None, self.b_out, None, 0.0, False,
                                one.reshape(-1), None, False, -1, up)  # fmt: skip
        h = ops.row_gemv(y, self.w_after, None, None, None, 0.0, False, one.reshape(-1))
        gu = ops.row_gemv(h, self.w_up, None, None, self.norm, 1e-5, False, None)
        return ops.row_gemv(gu, self.w_down, None, None, None, 0.0, True, h.reshape(-1))


def timed_graph(
    layers: list[Layer], s: Shape, dev: torch.device, mib: int, plain: bool = False
) -> dict[str, Any]:
    x0 = torch.randn(1, s.dim, device=dev, dtype=torch.bfloat16)
    angles = torch.rand(1, s.rot // 2, device=dev) * 6.28
    cos = torch.cat([angles.cos()] * 2, dim=-1)
    sin = torch.cat([angles.sin()] * 2, dim=-1)
    lo = torch.zeros(1, dtype=torch.int64, device=dev)
    pos = torch.tensor([POSITION], device=dev)

    def run():
        x = x0
        for layer in layers:
            x = layer.step(x, cos, sin, lo, pos, mib, plain)
        return x

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):  # Triton's compiles and autotuning-free first launches
            run()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = run()
    for _ in range(10):
        graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(7):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(20):
            graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 20 * 1e3)  # us a step
    kernels = profile(graph, len(layers))
    return {"step_us": statistics.median(times), "step_us_all": times, "kernels": kernels,
            "out_finite": bool(torch.isfinite(out).all())}  # fmt: skip


def profile(graph: torch.cuda.CUDAGraph, n_layers: int) -> list[dict[str, Any]]:
    """One replay's kernels, by their place in a layer: [{name, mean_us, count}]."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
        graph.replay()
        torch.cuda.synchronize()
    events = sorted(
        (e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA),
        key=lambda e: e.time_range.start,
    )
    if not events or len(events) % n_layers:
        return [{"name": e.name, "us": e.time_range.elapsed_us()} for e in events[:12]]
    per = len(events) // n_layers
    places = []
    for i in range(per):
        mine = events[i::per]
        mean = sum(e.time_range.elapsed_us() for e in mine) / len(mine)
        places.append({"name": mine[0].name[:60], "count": len(mine), "mean_us": mean})
    return places


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--models", default="phi-2,phi-3-mini")
    ap.add_argument("--mib", default="0,4,8,12,16,24")
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument(
        "--kinds",
        default="bulk",
        help="the prefetch's forms, each swept: bulk (cp.async.bulk.prefetch, "
        "the op's), lines (prefetch.global.L2 a 128-byte line at a time)",
    )
    ap.add_argument("--chunks", default=str(l2_prefetch.PREFETCH_CHUNK),
                    help="bytes a thread prefetches (PREFETCH_CHUNK), each swept")  # fmt: skip
    ap.add_argument("--op", choices=("rope", "plain"), default="rope",
                    help="the attention op: rope (phi-2's, phi-3's) or plain")  # fmt: skip
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    dev = torch.device("cuda")
    gemv._define_kernels()
    result: dict[str, Any] = {**provenance(), "slots": SLOTS, "position": POSITION,
                              "layers": args.layers, "op": args.op, "models": {}}  # fmt: skip
    result["copy_gbps"] = copy_bandwidth(dev)["gbps"]
    mibs = [int(m) for m in args.mib.split(",")]
    for name in args.models.split(","):
        s = SHAPES[name]
        t0 = time.perf_counter()
        layers = [Layer(s, dev) for _ in range(args.layers)]
        nbytes = sum(layer.weight_bytes() for layer in layers)
        rows = {}
        default_chunk = l2_prefetch.PREFETCH_CHUNK
        for kind in args.kinds.split(","):
            l2_prefetch.PREFETCH_BY = {"bulk": 1, "lines": 3}[kind]
            for chunk in (int(c) for c in args.chunks.split(",")):
                l2_prefetch.PREFETCH_CHUNK = chunk
                for mib in mibs:
                    if mib == 0 and "0" in rows:
                        continue  # no prefetch is one row, whatever the form
                    r = timed_graph(layers, s, dev, mib, args.op == "plain")
                    r["pct_of_copy"] = (
                        100 * nbytes / (r["step_us"] * 1e-6) / (result["copy_gbps"] * 1e9)
                    )
                    form = "" if (kind, chunk) == ("bulk", default_chunk) else f"{kind}{chunk}-"
                    rows[f"{form}{mib}" if mib else "0"] = r
        l2_prefetch.PREFETCH_CHUNK = default_chunk
        base = next(iter(rows.values()))["step_us"]  # the first MiB's, in the first form
        for mib, r in rows.items():
            r["ratio_to_first"] = base / r["step_us"]
            places = ", ".join(f"{k['mean_us']:.2f}" for k in r["kernels"] if "mean_us" in k)
            print(f"{name:11s} MiB {mib!s:>8}: {r['step_us']:8.1f} us a step, "
                  f"{r['ratio_to_first']:.4f}x, {r['pct_of_copy']:.1f}% of copy; "
                  f"kernels by place (us): {places}", flush=True)  # fmt: skip
        result["models"][name] = {"weight_bytes": nbytes, "rows": rows,
                                  "seconds": time.perf_counter() - t0}  # fmt: skip
        del layers
        torch.cuda.empty_cache()
    (args.out / "attention_prefetch.json").write_text(json.dumps(result, indent=1))
    print(f"copy {result['copy_gbps']:.0f} GB/s; wrote {args.out / 'attention_prefetch.json'}")


if __name__ == "__main__":
    da._kernels()
    main()
