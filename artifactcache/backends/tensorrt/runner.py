"""``--mode onnx`` load: runtime -> engine -> one execution context per profile -> StepRunner.

Written to NVIDIA's documented TensorRT Python API (Runtime, ICudaEngine,
IExecutionContext with ``set_input_shape``/``set_tensor_address``/
``execute_async_v3``); unverified on real TensorRT (see the package docstring).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...errors import BackendError
from .options import engine_options
from .util import (
    PLAN_HEADER_BYTES,
    EngineIncompatible,
    compat_problem,
    gpu_identity,
    header_note,
    host_code_allowed,
    import_tensorrt,
)

if TYPE_CHECKING:
    from ...config import Recipe
    from ..base import BuildContext


def profile_for_tokens(recipe: Recipe, n_tokens: int) -> int:
    """The profile index that serves a step of n_tokens (ShapeError outside every profile)."""
    from ...errors import ShapeError

    if n_tokens == 1:
        return 1
    if 1 <= n_tokens <= recipe.shapes.prefill_len:
        return 0
    raise ShapeError(
        f"a step of {n_tokens} tokens is outside the engine's profiles "
        f"(1..{recipe.shapes.prefill_len}); raise [shapes].prefill_len in "
        f"{recipe.source or recipe.name} and rebuild"
    )


class _EngineSteps:
    """prefill/decode over one engine: context 0 on profile 0, context 1 on profile 1.

    Tensors are torch CUDA tensors, run on torch's current stream. The KV cache
    ping-pongs between two buffer pairs because an engine's input and output
    bindings must not alias.
    """

    def __init__(self, engine: Any, recipe: Recipe, device: Any, dtype: Any) -> None:
        import torch

        from ..onnx.step_shapes import cache_shape
        from .loader import profiles_for

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
        self.dynamic_inputs = tuple(profiles_for(recipe)[0])  # the rest are static
        # logit_rows, a first pass's kv_pos and row_start as views of tensors made once:
        # no allocation or host copy per decode token.
        self.positions = torch.arange(recipe.shapes.prefill_len, device=device)
        self.no_padding = torch.zeros(recipe.shapes.max_batch, dtype=torch.int64, device=device)

    def _run(self, inputs: tuple[Any, ...], k_in: Any, v_in: Any, k_out: Any, v_out: Any) -> Any:
        """One step: the runner's inputs (STEP_INPUT_NAMES, in order), then the cache."""
        import torch

        from ..onnx.step_shapes import STEP_INPUT_NAMES

        step = dict(zip(STEP_INPUT_NAMES, (t.contiguous() for t in inputs), strict=True))
        rows, n = (int(d) for d in step["input_ids"].shape)
        context = self.contexts[profile_for_tokens(self.recipe, n)]
        kept = int(step["logit_rows"].shape[0])
        logits = torch.empty(rows, kept, self.vocab, dtype=torch.float32, device=self.device)
        for name in self.dynamic_inputs:
            context.set_input_shape(name, tuple(step[name].shape))
        tensors = {
            **step,
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

    def prefill(self, idx: Any, pos: Any, row_start: Any, kv_pos: Any) -> Any:
        k_out, v_out = self.bufs[0]
        self.cur = 0
        inputs = (idx, pos, row_start, kv_pos, self.positions[: len(pos)])
        return self._run(inputs, self.zero, self.zero, k_out, v_out)

    def decode(self, idx: Any, pos: Any, row_start: Any, kv_pos: Any) -> Any:
        (k_in, v_in), (k_out, v_out) = self.bufs[self.cur], self.bufs[1 - self.cur]
        self.cur = 1 - self.cur
        inputs = (idx, pos, row_start, kv_pos, self.positions[: len(pos)])
        return self._run(inputs, k_in, v_in, k_out, v_out)

    def fresh(self, idx: Any, pos: Any) -> Any:
        """A first pass of rows that all start at slot 0: it reads its own positions and
        returns the last one's logits only."""
        k_out, v_out = self.bufs[0]
        self.cur = 0
        t = idx.shape[1]
        own, last = self.positions[:t], self.positions[t - 1 : t]
        inputs = (idx, pos, self.no_padding[: idx.shape[0]], own, last)
        return self._run(inputs, self.zero, self.zero, k_out, v_out)


def load_step_runner(ctx: BuildContext, engine_path: Path, meta: dict[str, Any]) -> Any:
    from ...dtypes import torch_dtype
    from ..shared.runner import StepRunner, device_of

    # Host code only if the options (which the key covers) ask for it, never the meta's say.
    allowed = host_code_allowed(
        engine_options(ctx.opts).allow_host_code, meta, engine_path.parent.name
    )
    trt = import_tensorrt()
    dev = device_of(ctx.opts)
    _, cc = gpu_identity(ctx.opts.device)
    blob = engine_path.read_bytes()
    problem = compat_problem(meta, trt.__version__, cc)
    if problem:
        raise EngineIncompatible(f"stale entry {engine_path.parent.name[:12]}: {problem}")
    note = header_note(meta, blob[:PLAN_HEADER_BYTES])
    if note and ctx.progress:
        ctx.progress(note)
    runtime = trt.Runtime(trt.Logger(trt.Logger.WARNING))
    runtime.engine_host_code_allowed = allowed
    engine = runtime.deserialize_cuda_engine(blob)
    if engine is None:
        raise EngineIncompatible(
            f"stale entry {engine_path.parent.name[:12]} (rebuilding): TensorRT {trt.__version__} "
            "could not deserialize the engine (see its log); rebuild with --force"
        )
    ctx.phases["weights_ready"] = ctx.phases["artifact_ready"] = time.perf_counter()
    steps = _EngineSteps(engine, ctx.recipe, dev, torch_dtype(meta.get("export_dtype", "fp32")))
    # decode continues the cache at any token count a profile serves, so it also runs
    # a long prompt's later chunks (prefill restarts the cache).
    return StepRunner(
        ctx.recipe, steps.prefill, steps.decode, dev, extend=steps.decode, fresh=steps.fresh,
        keepalive=(runtime, steps), kv_len_hint=True,
    )  # fmt: skip
