"""``--mode onnx`` build: ONNX parser -> builder config -> serialized engine.

Written to NVIDIA's documented TensorRT Python API (Builder, OnnxParser,
IBuilderConfig, ITimingCache) and close to its samples; unverified on real
TensorRT (see the package docstring).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...errors import BackendError
from ...keys import compute_key, make_factors
from .options import EngineOptions, PrecisionPlan, engine_options, precision_plan
from .util import gpu_identity, import_tensorrt, trt_major

if TYPE_CHECKING:
    from ...recipes import Recipe
    from ..base import BuildContext

TIMING_CACHE_FILE = "timing.cache"


def profiles_for(recipe: Recipe) -> list[dict[str, tuple[tuple[int, ...], ...]]]:
    """Optimization profiles over the step graph's dynamic inputs: (min, opt, max) shapes.

    Profile 0 serves prefill (1..prefill_len tokens, tuned for prefill_len, which is
    what the runner always sends); profile 1 serves decode (exactly one token). The
    KV-cache inputs are static [n_layers, max_batch, n_kv_heads, max_seq_len, head_dim]
    and need no profile entry.
    """
    p, b = recipe.shapes.prefill_len, recipe.shapes.max_batch
    prefill = {
        "input_ids": ((1, 1), (b, p), (b, p)),
        "input_pos": ((1,), (p,), (p,)),
    }
    decode = {"input_ids": ((1, 1), (1, 1), (1, 1)), "input_pos": ((1,), (1,), (1,))}
    return [prefill, decode]


def timing_cache_factors(
    gpu: str, compute_capability: str, trt_version: str, plan: PrecisionPlan, eo: EngineOptions
) -> dict[str, Any]:
    """Key factors of the shared timing cache: the GPU, TensorRT, and flags that change tactics.

    No recipe and no weights: timings are per layer configuration, so every model
    built on this GPU with this TensorRT and these flags shares (and grows) one cache.
    """
    return make_factors(
        recipe={},
        weights="none",
        backend="trt-timing-cache",
        options={
            "strongly_typed": plan.strongly_typed,
            "builder_flags": sorted(plan.builder_flags),
            "opt_level": eo.opt_level,
        },
        toolchain={"tensorrt": trt_version},
        hardware={"gpu": gpu, "compute_capability": compute_capability},
    )


def build_engine(
    onnx_path: Path,
    out_path: Path,
    profiles: list[dict[str, tuple[tuple[int, ...], ...]]],
    plan: PrecisionPlan,
    eo: EngineOptions,
    timing_cache: bytes | None,
) -> tuple[bytes, dict[str, Any]]:
    """ONNX parser -> builder config -> serialized engine at out_path.

    Returns the timing cache after the build (serialized) and build metadata.
    Works for any ONNX file whose dynamic inputs ``profiles`` covers.
    """
    trt = import_tensorrt()
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    flags = 0
    if plan.strongly_typed:
        flags |= 1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED)
    network = builder.create_network(flags)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(onnx_path)):
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise BackendError(f"TensorRT's ONNX parser rejected {onnx_path.name}: {errors}")
    config = builder.create_builder_config()
    for name in plan.builder_flags:
        config.set_flag(getattr(trt.BuilderFlag, name))
    if eo.allow_host_code:
        # A version-compatible engine embeds the lean runtime (host code), which a
        # runtime only deserializes with engine_host_code_allowed: opt-in only.
        config.set_flag(trt.BuilderFlag.VERSION_COMPATIBLE)
    config.builder_optimization_level = eo.opt_level
    if eo.workspace_mb is not None:
        config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, eo.workspace_mb << 20)
    for prof in profiles:
        p = builder.create_optimization_profile()
        for name, (lo, opt, hi) in prof.items():
            p.set_shape(name, lo, opt, hi)
        config.add_optimization_profile(p)
    cache = config.create_timing_cache(timing_cache or b"")
    # ignore_mismatch=False: a cache from another GPU/TensorRT is refused, not half-used
    # (its key already names both, so a mismatch means a damaged entry).
    config.set_timing_cache(cache, False)
    t0 = time.perf_counter()
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise BackendError("TensorRT failed to build the engine (see the TensorRT log above)")
    out_path.write_bytes(bytes(serialized))
    meta = {"engine_build_seconds": round(time.perf_counter() - t0, 3)}
    return bytes(config.get_timing_cache().serialize()), meta


def merge_timing_caches(old: bytes | None, new: bytes) -> bytes:
    """ITimingCache.combine: the stored cache plus what this build learned."""
    if not old:
        return new
    trt = import_tensorrt()
    config = trt.Builder(trt.Logger(trt.Logger.WARNING)).create_builder_config()
    merged = config.create_timing_cache(old)
    merged.combine(config.create_timing_cache(new), True)
    return bytes(merged.serialize())


def publish_timing_cache(store: Any, key: str, factors: dict, new: bytes, merge=None) -> None:
    """Merge ``new`` into the timing-cache entry ``key`` and republish it.

    Runs under the entry's lock (get_or_build), so concurrent builds merge one
    after another instead of overwriting each other. ``merge`` defaults to
    TensorRT's combine; it is a parameter so the store logic is testable alone.
    """
    merge = merge or merge_timing_caches

    def build(workdir: Path) -> dict[str, Any]:
        current = store.get(key)
        old = (current.path / TIMING_CACHE_FILE).read_bytes() if current else None
        (workdir / TIMING_CACHE_FILE).write_bytes(merge(old, new))
        return {"merged_builds": (current.meta.get("merged_builds", 0) if current else 0) + 1}

    store.get_or_build(key, factors, build, force=True, label={"backend": "trt-timing-cache"})


def build_step_engine(ctx: BuildContext, out_path: Path) -> dict[str, Any]:
    """The shared ONNX export -> one engine with a prefill and a decode profile."""
    from ..onnx_export import ensure_export, export_spec, has_qdq

    trt = import_tensorrt()
    opts = ctx.opts
    eo = engine_options(opts)
    plan = precision_plan(opts.dtype, trt_major(trt.__version__), eo.typing, True)
    onnx_path, ekey, emeta, _ = ensure_export(ctx, export_spec(opts, plan.export_dtype))
    plan = precision_plan(opts.dtype, trt_major(trt.__version__), eo.typing, has_qdq(onnx_path))
    gpu, cc = gpu_identity(opts.device)
    tc_key = tc_factors = None
    old_cache = None
    if eo.timing_cache and ctx.store is not None:
        tc_factors = timing_cache_factors(gpu, cc, trt.__version__, plan, eo)
        tc_key = compute_key(tc_factors)
        entry = ctx.store.get(tc_key)
        old_cache = (entry.path / TIMING_CACHE_FILE).read_bytes() if entry else None
    new_cache, meta = build_engine(
        onnx_path, out_path, profiles_for(ctx.recipe), plan, eo, old_cache
    )
    if tc_key is not None:
        publish_timing_cache(ctx.store, tc_key, tc_factors, new_cache)
    meta.update(
        {
            "tensorrt": trt.__version__,
            "compute_capability": cc,
            "gpu": gpu,
            "export_key": ekey,
            "strongly_typed": plan.strongly_typed,
            "export_dtype": plan.export_dtype,
            "builder_flags": list(plan.builder_flags),
            "timing_cache_key": tc_key,
            "timing_cache_loaded": old_cache is not None,
            "allow_host_code": eo.allow_host_code,
        }
    )
    return meta
