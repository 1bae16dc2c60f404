"""TensorRT engine build and run over an ONNX graph (``--backend trt --mode onnx``).

UNVERIFIED: written to NVIDIA's documented TensorRT Python API (Builder,
OnnxParser, IBuilderConfig, ITimingCache, Runtime, IExecutionContext with
``execute_async_v3``) and close to its samples; TensorRT cannot be installed on
any machine this project has, so none of this module has run here. The pure
decisions it relies on (precision plan, profiles, compatibility, timing-cache
key) live in backends/trt.py and are tested there.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import BackendError
from ..keys import compute_key
from .trt import (
    PLAN_HEADER_BYTES,
    EngineIncompatible,
    EngineOptions,
    PrecisionPlan,
    compat_problem,
    engine_options,
    precision_plan,
    profile_for_tokens,
    profiles_for,
    timing_cache_factors,
    trt_major,
)

if TYPE_CHECKING:
    from ..recipes import Recipe
    from .base import BuildContext

TIMING_CACHE_FILE = "timing.cache"


def _trt() -> Any:
    import tensorrt

    return tensorrt


def _gpu(device: str) -> tuple[str, str]:
    import torch

    idx = torch.device(device).index or 0
    props = torch.cuda.get_device_properties(idx)
    return props.name, f"{props.major}.{props.minor}"


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
    trt = _trt()
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
    trt = _trt()
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
    from .onnx_export import ensure_export, export_spec, has_qdq

    trt = _trt()
    opts = ctx.opts
    eo = engine_options(opts)
    plan = precision_plan(opts.dtype, trt_major(trt.__version__), eo.typing, True)
    onnx_path, ekey, emeta, _ = ensure_export(ctx, export_spec(opts, plan.export_dtype))
    plan = precision_plan(opts.dtype, trt_major(trt.__version__), eo.typing, has_qdq(onnx_path))
    gpu, cc = _gpu(opts.device)
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


class _EngineSteps:
    """prefill/decode over one engine: context 0 on profile 0, context 1 on profile 1.

    Tensors are torch CUDA tensors, run on torch's current stream. The KV cache
    ping-pongs between two buffer pairs because an engine's input and output
    bindings must not alias.
    """

    def __init__(self, engine: Any, recipe: Recipe, device: Any, dtype: Any) -> None:
        import torch

        from .onnx_export import cache_shape

        self.engine, self.recipe, self.device = engine, recipe, device
        stream = torch.cuda.current_stream(device)
        self.contexts = [engine.create_execution_context() for _ in range(2)]
        self.contexts[1].set_optimization_profile_async(1, stream.cuda_stream)
        shape = cache_shape(recipe)
        self.zero = torch.zeros(shape, dtype=dtype, device=device)
        self.bufs = [
            [torch.empty(shape, dtype=dtype, device=device) for _ in range(2)] for _ in range(2)
        ]
        self.cur = 0  # which buffer pair holds the live cache
        self.vocab = recipe.model.vocab_size

    def _run(self, idx: Any, pos: Any, k_in: Any, v_in: Any, k_out: Any, v_out: Any) -> Any:
        import torch

        n = int(idx.shape[1])
        context = self.contexts[profile_for_tokens(self.recipe, n)]
        logits = torch.empty(1, n, self.vocab, dtype=torch.float32, device=self.device)
        context.set_input_shape("input_ids", tuple(idx.shape))
        context.set_input_shape("input_pos", tuple(pos.shape))
        tensors = {
            "input_ids": idx.contiguous(),
            "input_pos": pos.contiguous(),
            "past_keys": k_in,
            "past_values": v_in,
            "logits": logits,
            "present_keys": k_out,
            "present_values": v_out,
        }
        for name, t in tensors.items():
            context.set_tensor_address(name, t.data_ptr())
        if not context.execute_async_v3(torch.cuda.current_stream(self.device).cuda_stream):
            raise BackendError("TensorRT execute_async_v3 failed (see the TensorRT log)")
        return logits

    def prefill(self, idx: Any, pos: Any) -> Any:
        k_out, v_out = self.bufs[0]
        self.cur = 0
        return self._run(idx, pos, self.zero, self.zero, k_out, v_out)

    def decode(self, idx: Any, pos: Any) -> Any:
        (k_in, v_in), (k_out, v_out) = self.bufs[self.cur], self.bufs[1 - self.cur]
        self.cur = 1 - self.cur
        return self._run(idx, pos, k_in, v_in, k_out, v_out)


def load_step_runner(ctx: BuildContext, engine_path: Path, meta: dict[str, Any]) -> Any:
    from ..models import torch_dtype
    from .runner import StepRunner, device_of

    trt = _trt()
    dev = device_of(ctx.opts)
    _, cc = _gpu(ctx.opts.device)
    blob = engine_path.read_bytes()
    problem = compat_problem(meta, trt.__version__, cc, blob[:PLAN_HEADER_BYTES])
    if problem:
        raise EngineIncompatible(f"stale entry {engine_path.parent.name[:12]}: {problem}")
    runtime = trt.Runtime(trt.Logger(trt.Logger.WARNING))
    runtime.engine_host_code_allowed = bool(meta.get("allow_host_code", False))
    engine = runtime.deserialize_cuda_engine(blob)
    if engine is None:
        raise EngineIncompatible(
            f"stale entry {engine_path.parent.name[:12]} (rebuilding): TensorRT {trt.__version__} "
            "could not deserialize the engine (see its log); rebuild with --force"
        )
    ctx.phases["weights_ready"] = ctx.phases["artifact_ready"] = time.perf_counter()
    steps = _EngineSteps(engine, ctx.recipe, dev, torch_dtype(meta.get("export_dtype", "fp32")))
    return StepRunner(ctx.recipe, steps.prefill, steps.decode, dev, keepalive=(runtime, steps))
