"""The probe's timed loops: request latency, decode steps, a module's calls, and the
device's copy bandwidth and matmul peak. Run in the measured child only.

What the timings mean, and how the parent pools them into rates and rooflines,
is measure/bench.py's docstring.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ...errors import MeasureError
from ..bench import derived_rates

if TYPE_CHECKING:
    import torch

NO_EOS: tuple[int, ...] = ()  # the seed benchmark never stops early
# CPU copy buffer: far beyond any last-level cache, so the copy streams DRAM.
CPU_COPY_BYTES = 512 << 20
CUDA_COPY_BYTES = 2 << 30
# Square matmul sides for the FLOP peak: large enough to reach the device's dense rate.
CPU_MATMUL_N = 1024
CUDA_MATMUL_N = 8192


def sync(dev: torch.device) -> None:
    import torch

    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def measure_requests(
    runner: Any,
    prompts: Sequence[Sequence[int]],
    new_tokens: int,
    *,
    iters: int,
    warmup: int,
    device: torch.device,
) -> dict[str, Any]:
    """Warm-up requests (excluded), then ``iters`` timed (prefill, request) pairs.

    A request is ``generate_batch(prompts, ...)``; ``tokens`` is its first row.
    """
    if iters < 1:
        raise MeasureError(f"iterations must be at least 1, got {iters}")
    if warmup < 1:
        # The first full request is also how first_request is stamped; a backend
        # that compiles its decode step lazily would otherwise pollute the timings.
        raise MeasureError(f"warm-up must be at least 1 request, got {warmup}")
    rows = [list(p) for p in prompts]
    first_end = None
    for _ in range(warmup):
        runner.generate_batch(rows, new_tokens, eos_token_ids=NO_EOS)
        sync(device)
        if first_end is None:
            first_end = time.perf_counter()
    prefill: list[float] = []
    request: list[float] = []
    out: list[list[int]] = []
    for _ in range(iters):
        sync(device)
        t = time.perf_counter()
        runner.generate_batch(rows, 1, eos_token_ids=NO_EOS)
        sync(device)
        prefill.append(time.perf_counter() - t)
        t = time.perf_counter()
        out = runner.generate_batch(rows, new_tokens, eos_token_ids=NO_EOS)
        sync(device)
        request.append(time.perf_counter() - t)
    counts = sorted({len(r) for r in out})
    if len(out) != len(rows) or counts != [new_tokens]:
        raise MeasureError(
            f"the runner returned {len(out)} rows of {counts} tokens for {len(rows)} rows "
            f"of {new_tokens} asked"
        )
    return {
        "first_request_end": first_end,
        "iters": iters,
        "warmup": warmup,
        "new_tokens": new_tokens,
        "batch": len(rows),
        "prefill_s": prefill,
        "request_s": request,
        "tokens": out[0],
        **derived_rates(prefill, request, new_tokens),
    }


def measure_ttft(
    runner: Any,
    prompts: Sequence[Sequence[int]],
    *,
    iters: int,
    warmup: int,
    device: torch.device,
) -> list[dict[str, Any]]:
    """Time to first token of each prompt: ``runner.generate(ids, 1)`` (prefill + the
    first greedy pick, batch 1), ``warmup`` excluded requests of that prompt, then
    ``iters`` timed ones, each between device synchronizes. One entry per prompt, in
    order; measure/prefill.py turns them into tokens/s and % of the FLOP roofline.

    ``first_s`` is the first excluded request, timed alone: what the process paid the
    first time it met that prompt length (a compile, a graph capture, a cuDNN graph),
    which a server pays once per new length."""
    if iters < 1 or warmup < 1:
        raise MeasureError(f"--iters and --warmup must be at least 1, got {iters} and {warmup}")
    out = []
    for prompt in prompts:
        ids = list(prompt)
        # A new length may compile, capture or tune: its first request is kept apart.
        first_s = _first_token_seconds(runner, ids, device)
        for _ in range(warmup - 1):
            runner.generate(ids, 1)
        times = [_first_token_seconds(runner, ids, device) for _ in range(iters)]
        out.append({"prompt_len": len(ids), "warmup": warmup, "ttft_s": times, "first_s": first_s})
    return out


def _first_token_seconds(runner: Any, ids: list[int], device: torch.device) -> float:
    """One ``runner.generate(ids, 1)`` between device synchronizes, in seconds."""
    sync(device)
    t = time.perf_counter()
    first = runner.generate(ids, 1)
    sync(device)
    seconds = time.perf_counter() - t
    if len(first) != 1:
        raise MeasureError(f"the runner returned {len(first)} tokens for 1 asked")
    return seconds


def measure_step_latency(
    runner: Any, prompts: Sequence[Sequence[int]], new_tokens: int, device: torch.device
) -> list[float] | None:
    """Seconds of each decode step of one request (pick included), each step between
    device synchronizes; None for a runner that cannot run one step at a time."""
    steps = getattr(runner, "decode_tokens", None)
    if steps is None or new_tokens < 2:
        return None
    tokens = steps(prompts, new_tokens)
    next(tokens)  # prefill and the first pick: not a decode step
    times = []
    for _ in range(new_tokens - 1):
        sync(device)
        t = time.perf_counter()
        next(tokens)
        sync(device)
        times.append(time.perf_counter() - t)
    return times


def copy_bandwidth(dev: torch.device, nbytes: int | None = None, rounds: int = 5) -> dict[str, Any]:
    """Best-of-``rounds`` device copy bandwidth, counting bytes read + written."""
    import torch

    if nbytes is None:
        nbytes = CUDA_COPY_BYTES if dev.type == "cuda" else CPU_COPY_BYTES
        if dev.type == "cuda":
            free, _ = torch.cuda.mem_get_info(dev)
            nbytes = min(nbytes, int(free * 0.4))  # two buffers, leave headroom
    n = max(nbytes // 4, 1)
    src = torch.ones(n, dtype=torch.float32, device=dev)
    dst = torch.empty_like(src)
    # Enough copies per timed round that a synchronize's latency is noise.
    per_round = 20 if dev.type == "cuda" else 2
    dst.copy_(src)
    sync(dev)
    best = math.inf
    for _ in range(rounds):
        sync(dev)
        t = time.perf_counter()
        for _ in range(per_round):
            dst.copy_(src)
        sync(dev)
        best = min(best, (time.perf_counter() - t) / per_round)
    moved = 2 * n * 4
    del src, dst
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    return {"bytes": n * 4, "seconds": best, "gbps": moved / best / 1e9, "rounds": rounds}


def matmul_flops(dev: torch.device, dtype: str, n: int | None = None, rounds: int = 5) -> dict:
    """Best-of-``rounds`` dense matmul rate (n x n @ n x n in ``dtype``): the FLOP peak."""
    import torch

    from ...dtypes import torch_dtype

    if n is None:
        n = CUDA_MATMUL_N if dev.type == "cuda" else CPU_MATMUL_N
    a = torch.randn(n, n, device=dev).to(torch_dtype(dtype))
    b = torch.randn(n, n, device=dev).to(torch_dtype(dtype))
    per_round = 10 if dev.type == "cuda" else 2
    a @ b  # lazy init (cuBLAS handles, thread pools) outside the timer
    best = math.inf
    for _ in range(rounds):
        sync(dev)
        t = time.perf_counter()
        for _ in range(per_round):
            a @ b
        sync(dev)
        best = min(best, (time.perf_counter() - t) / per_round)
    del a, b
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    return {"n": n, "dtype": dtype, "seconds": best, "tflops": 2 * n**3 / best / 1e12,
            "rounds": rounds}  # fmt: skip


def measure_calls(
    fn: Any, inputs: tuple[Any, ...], *, iters: int, warmup: int, device: Any
) -> dict[str, Any]:
    """``warmup`` excluded calls, then ``iters`` timed ones, each bracketed by a sync."""
    if iters < 1 or warmup < 1:
        raise MeasureError(f"--iters and --warmup must be at least 1, got {iters} and {warmup}")
    first_end = None
    for _ in range(warmup):
        fn(*inputs)
        sync(device)
        if first_end is None:
            first_end = time.perf_counter()
    lat = []
    for _ in range(iters):
        sync(device)
        t = time.perf_counter()
        fn(*inputs)
        sync(device)
        lat.append(time.perf_counter() - t)
    return {"first_request_end": first_end, "iters": iters, "warmup": warmup, "request_s": lat}
