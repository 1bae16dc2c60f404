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
from ...keys import make_factors
from ..base import Dependency
from .options import EngineOptions, PrecisionPlan, engine_options, precision_plan
from .util import gpu_identity, import_tensorrt, trt_major

if TYPE_CHECKING:
    from ...config import Recipe
    from ..base import BuildContext

TIMING_CACHE_FILE = "timing.cache"
TIMING_CACHE_DEP = "timing_cache"  # its name in ctx.deps


def profiles_for(recipe: Recipe) -> list[dict[str, tuple[tuple[int, ...], ...]]]:
    """Optimization profiles over the step graph's dynamic inputs: (min, opt, max) shapes.

    From the export's own dimensions (onnx/step_shapes.py step_profiles), so an engine
    profile never asks for a range the graph fixed. Profile 0 serves prefill (T over
    1..prefill_len, tuned for prefill_len; the runner sends passes of 16 tokens up to
    it, generate/prefill.py); profile 1 serves
    decode (T = 1). The batch axis is static at max_batch (the runner pads rows), and
    so are row_start and the KV cache: inputs without a dynamic axis need no entry.
    """
    from ..onnx.step_shapes import step_profiles

    return step_profiles(recipe)


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


def timing_cache_dependency(factors: dict[str, Any], merge=None) -> Dependency:
    """The shared timing cache: read before a build if present, merged into after it.

    ``merge`` defaults to TensorRT's combine; it is a parameter so the store side
    is testable without TensorRT.
    """
    merge = merge or merge_timing_caches

    def refresh(current: Any, new: bytes, workdir: Path) -> dict[str, Any]:
        old = (current.path / TIMING_CACHE_FILE).read_bytes() if current else None
        (workdir / TIMING_CACHE_FILE).write_bytes(merge(old, new))
        return {"merged_builds": (current.meta.get("merged_builds", 0) if current else 0) + 1}

    return Dependency(
        name=TIMING_CACHE_DEP,
        factors=factors,
        label={"backend": "trt-timing-cache"},
        refresh=refresh,
    )


def step_dependencies(ctx: BuildContext, weights: str) -> list[Dependency]:
    """What a ``--mode onnx`` build reads: the shared ONNX export, and the timing cache."""
    from ..onnx.export import export_dependency, export_spec

    trt = import_tensorrt()
    eo = engine_options(ctx.opts)
    # acache's exports carry no Q/DQ nodes, and check_options already refused int8/fp8
    # without them, so the plan (and the export dtype) is known before the export exists.
    plan = precision_plan(ctx.opts.dtype, trt_major(trt.__version__), eo.typing, True)
    deps = [export_dependency(ctx, weights, export_spec(ctx.opts, plan.export_dtype))]
    if eo.timing_cache:
        gpu, cc = gpu_identity(ctx.opts.device)
        tc_factors = timing_cache_factors(gpu, cc, trt.__version__, plan, eo)
        deps.append(timing_cache_dependency(tc_factors))
    return deps


def build_step_engine(ctx: BuildContext, out_path: Path) -> dict[str, Any]:
    """The shared ONNX export -> one engine with a prefill and a decode profile."""
    from ..onnx.export import exported, has_qdq

    trt = import_tensorrt()
    opts = ctx.opts
    eo = engine_options(opts)
    onnx_path, export = exported(ctx)
    plan = precision_plan(opts.dtype, trt_major(trt.__version__), eo.typing, has_qdq(onnx_path))
    gpu, cc = gpu_identity(opts.device)
    cache_entry = ctx.deps.get(TIMING_CACHE_DEP)
    old_cache = (cache_entry.path / TIMING_CACHE_FILE).read_bytes() if cache_entry else None
    new_cache, meta = build_engine(
        onnx_path, out_path, profiles_for(ctx.recipe), plan, eo, old_cache
    )
    if eo.timing_cache:
        ctx.produced[TIMING_CACHE_DEP] = new_cache
    meta.update(
        {
            "tensorrt": trt.__version__,
            "compute_capability": cc,
            "gpu": gpu,
            "export_key": export.key,
            "strongly_typed": plan.strongly_typed,
            "export_dtype": plan.export_dtype,
            "builder_flags": list(plan.builder_flags),
            "timing_cache_loaded": old_cache is not None,
            "allow_host_code": eo.allow_host_code,
        }
    )
    return meta
