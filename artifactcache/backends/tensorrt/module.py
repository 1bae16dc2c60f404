"""trt for any module: the module's ONNX export -> one TensorRT engine, weights inside.

UNVERIFIED on real TensorRT: written to NVIDIA's documented Python API (Builder,
OnnxParser, IOptimizationProfile, Runtime, ICudaEngine, IExecutionContext), but
TensorRT cannot be installed on any machine this project has, so no engine has been
built or run by this code. Its logic runs against a recording stand-in
(tests/test_backends_tensorrt_module.py); see docs/tensorrt.md.

Build: the module's ONNX export, as for ort (onnx/export_module.py: inputs
``input_<i>``, outputs ``output_<i>`` in the flattened output order, the dynamic
dimensions as export dims) into a temporary folder, then the LLM path's
``loader.build_engine``: a strongly typed network in the module's dtype and one
optimization profile, each dynamic input's min/max from ``dynamic_shapes`` and opt at
the example input's shape. ``model.plan`` is the artifact; the export is dropped.
The engine holds the weights, so the key covers their digest, as for ort.

Load: the compatibility check of the LLM path, ``Runtime.deserialize_cuda_engine``
and one execution context. A call binds every input and output by name to torch
CUDA tensors (``set_input_shape``, ``set_tensor_address``), allocates each output at
the shape the context reports for these inputs, in the engine's dtype, and runs
``execute_async_v3`` on torch's current stream: no export, no parse, no build.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...choices import BuildChoices
from ...errors import BackendError
from ...keys import package_version
from ..onnx.export import EXTERNAL_DATA_BYTES, export_spec, export_toolchain
from ..onnx.export_module import EXPORT_FILE, export_module, input_name, output_name
from ..shared.any_module import FORMAT, RECORD, no_extra, reference_run, require_files, write_record
from .options import engine_options, precision_plan
from .util import (
    EngineIncompatible,
    compat_problem,
    gpu_identity,
    host_code_allowed,
    import_tensorrt,
    trt_major,
)

if TYPE_CHECKING:
    import torch

    from ...sources.module import ModuleSpec

ENGINE_FILE = "model.plan"
MODE = "onnx"  # the one way a module reaches TensorRT
EXTRA_KEYS = ("opt_level", "workspace_mb", "allow_host_code", "typing", "opset", "exporter")
# tensorrt.DataType member -> torch dtype name, for every type an engine's I/O may have.
TRT_TO_TORCH = {
    "FLOAT": "float32",
    "HALF": "float16",
    "BF16": "bfloat16",
    "INT8": "int8",
    "INT32": "int32",
    "INT64": "int64",
    "BOOL": "bool",
    "UINT8": "uint8",
}

Profile = dict[str, tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]]


def module_profiles(
    spec: ModuleSpec, graph: dict[str, list[int | None]] | None = None
) -> list[Profile]:
    """The engine's optimization profiles: one, over the inputs with dynamic dimensions.

    Each gets (min, opt, max) shapes: the dynamic range's ends around the example's
    shape. ``graph`` ({input name: dims, None where symbolic}) is the exported graph's:
    inputs it dropped get no entry, and a dimension the export made static while the
    user asked for a range is a one-line error rather than a TensorRT build failure.
    No dynamic input: no profile (TensorRT makes its own for a static network).
    """
    profile: Profile = {}
    dynamic = spec.dynamic or tuple({} for _ in spec.inputs)
    for i, (s, dims) in enumerate(zip(spec.inputs, dynamic, strict=True)):
        name = input_name(i)
        if not dims or (graph is not None and name not in graph):
            continue
        ranges = [dims.get(d, (n, n)) for d, n in enumerate(s.shape)]
        if graph is not None:
            for d, ((lo, hi), got) in enumerate(zip(ranges, graph[name], strict=True)):
                if got is not None and lo != hi:
                    raise BackendError(
                        f"the ONNX export made dimension {d} of input {i} static ({got}), "
                        f"not the range {lo}..{hi} asked for: the model fixes that size"
                    )
        profile[name] = (
            tuple(lo for lo, _ in ranges),
            tuple(s.shape),
            tuple(hi for _, hi in ranges),
        )
    return [profile] if profile else []


def profile_factors(profiles: list[Profile]) -> list[dict[str, list[list[int]]]]:
    return [{k: [list(s) for s in v] for k, v in p.items()} for p in profiles]


def graph_inputs(onnx_path: Path) -> dict[str, list[int | None]]:
    """{input name: dims} of an ONNX graph, None for a symbolic dimension."""
    import onnx

    graph = onnx.load(str(onnx_path), load_external_data=False).graph
    out: dict[str, list[int | None]] = {}
    for i in graph.input:
        dims = i.type.tensor_type.shape.dim
        out[i.name] = [d.dim_value if d.HasField("dim_value") else None for d in dims]
    return out


def torch_dtype_of(trt: Any, trt_dtype: Any) -> torch.dtype:
    """The torch dtype of a tensorrt.DataType; BackendError for one torch cannot hold."""
    import torch

    for member, torch_name in TRT_TO_TORCH.items():
        if getattr(trt.DataType, member, None) == trt_dtype:
            return getattr(torch, torch_name)
    raise BackendError(f"the engine has an I/O tensor of TensorRT type {trt_dtype}, which "
                       f"acache does not bind (it binds {', '.join(TRT_TO_TORCH)})")  # fmt: skip


class TrtModuleBackend:
    name = "trt"
    weights_in_artifact = True  # a plain engine has its weights baked in

    def check_options(self, opts: BuildChoices) -> None:
        if opts.mode not in (None, "default", MODE):
            raise BackendError(
                f"backend 'trt' builds a module through its ONNX export (mode {MODE}), "
                f"not mode {opts.mode!r}"
            )
        no_extra(self.name, opts, EXTRA_KEYS)
        eo = engine_options(opts)
        if eo.typing != "strong":
            raise BackendError(
                "typing=weak is not offered for a module: the network takes the module's "
                "dtype (strongly typed); pass that dtype instead"
            )
        precision_plan(opts.dtype, trt_major(package_version("tensorrt")), "strong", False)
        export_spec(opts)  # opset and exporter: their one-line errors

    def sibling_options(self, opts: BuildChoices) -> BuildChoices:
        """What the LLM trt backend's available()/toolchain() read: its ONNX mode."""
        return replace(opts, mode=MODE)

    def factors(self, spec: ModuleSpec, opts: BuildChoices) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "dtype": opts.dtype,
            "device": "cuda",
            **engine_options(opts).factors(),
            "export": {**export_spec(opts).factors(), "toolchain": export_toolchain()},
            "profiles": profile_factors(module_profiles(spec)),
        }

    def build(
        self, spec: ModuleSpec, opts: BuildChoices, workdir: Path, memo_dir: Path | None = None
    ) -> dict[str, Any]:
        from .loader import build_engine

        flat, tree = reference_run(spec)
        trt = import_tensorrt()
        eo = engine_options(opts)
        plan = precision_plan(opts.dtype, trt_major(trt.__version__), "strong", False)
        raw = workdir / ".export"
        raw.mkdir()
        n_bytes = sum(t.numel() * t.element_size() for t in spec.module.state_dict().values())
        t0 = time.perf_counter()
        try:
            export_module(spec, opts, raw / EXPORT_FILE, len(flat), n_bytes > EXTERNAL_DATA_BYTES)
            t_export = time.perf_counter() - t0
            graph = graph_inputs(raw / EXPORT_FILE)
            profiles = module_profiles(spec, graph)
            # The module path opens no other entry, so no shared timing cache: each build
            # times its own tactics.
            _, meta = build_engine(
                raw / EXPORT_FILE, workdir / ENGINE_FILE, profiles, plan, eo, None
            )
        finally:
            shutil.rmtree(raw)
        gpu, cc = gpu_identity(opts.device)
        meta.update(
            {
                "format": FORMAT,
                "tensorrt": trt.__version__,
                "compute_capability": cc,
                "gpu": gpu,
                "strongly_typed": plan.strongly_typed,
                "export_dtype": plan.export_dtype,
                "allow_host_code": eo.allow_host_code,
                "exporter": export_spec(opts).exporter,
                "engine_inputs": sorted(graph),
                "profiles": profile_factors(profiles),
                "outputs": len(flat),
                "output_tree": tree,
                "export_seconds": round(t_export, 3),
                "weights": "inside the engine",
            }
        )
        write_record(workdir, meta)
        return meta

    def load(
        self, spec: ModuleSpec, opts: BuildChoices, entry_dir: Path, meta: dict[str, Any],
        phases: dict[str, float],
    ) -> Callable[..., Any]:  # fmt: skip
        from ..shared.runner import device_of

        require_files(entry_dir, ENGINE_FILE, RECORD)
        # Host code only if the options (which the key covers) ask for it, never the meta's say.
        allowed = host_code_allowed(engine_options(opts).allow_host_code, meta, entry_dir.name)
        trt = import_tensorrt()
        _, cc = gpu_identity(opts.device)
        problem = compat_problem(meta, trt.__version__, cc)
        if problem:
            raise EngineIncompatible(f"stale entry {entry_dir.name[:12]}: {problem}")
        t0 = time.perf_counter()
        runtime = trt.Runtime(trt.Logger(trt.Logger.WARNING))
        runtime.engine_host_code_allowed = allowed
        engine = runtime.deserialize_cuda_engine((entry_dir / ENGINE_FILE).read_bytes())
        if engine is None:
            raise EngineIncompatible(
                f"stale entry {entry_dir.name[:12]}: TensorRT {trt.__version__} could not "
                "deserialize the engine (see its log)"
            )
        run = EngineModule(trt, runtime, engine, device_of(opts), len(spec.inputs), meta)
        phases["session_seconds"] = time.perf_counter() - t0
        phases["weights_ready"] = phases["artifact_ready"] = time.perf_counter()
        return run


class EngineModule:
    """A deserialized engine called like the module: tensors in, the module's outputs back."""

    def __init__(
        self, trt: Any, runtime: Any, engine: Any, device: torch.device, n_inputs: int,
        meta: dict[str, Any],
    ) -> None:  # fmt: skip
        self.runtime, self.engine, self.device = runtime, engine, device  # runtime outlives engine
        self.tree = meta["output_tree"]
        names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
        self.inputs = [n for n in names if engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
        # The exporter drops inputs the graph never reads: those are simply not bound.
        self.input_index = _input_indices(self.inputs, n_inputs)
        self.outputs = [output_name(i) for i in range(int(meta["outputs"]))]
        got = sorted(n for n in names if n not in self.inputs)
        if got != sorted(self.outputs):
            raise BackendError(
                f"the engine's outputs {got} are not the module's {self.outputs}: rebuild "
                "with --force"
            )
        self.dtypes = {n: torch_dtype_of(trt, engine.get_tensor_dtype(n)) for n in names}
        self.context = engine.create_execution_context()

    def bind_inputs(self, args: Sequence[Any]) -> list[torch.Tensor]:
        """Set each engine input's shape and address; the tensors bound, in engine order.

        Each is on the engine's device, in the engine's dtype (an engine may take int64
        ids as int32) and contiguous; the caller keeps them alive until the run is done.
        """
        bound = []
        for name, i in zip(self.inputs, self.input_index, strict=True):
            t = args[i].to(device=self.device, dtype=self.dtypes[name]).contiguous()
            self.context.set_input_shape(name, tuple(t.shape))
            self.context.set_tensor_address(name, t.data_ptr())
            bound.append(t)
        return bound

    def __call__(self, *args: Any) -> Any:
        import torch

        from ..shared.torch_private import rebuild_output

        ctx = self.context
        bound = self.bind_inputs(args)  # noqa: F841 (alive until execute_async_v3 is queued)
        outs = []
        for name in self.outputs:
            shape = tuple(int(d) for d in ctx.get_tensor_shape(name))
            if any(d < 0 for d in shape):
                raise BackendError(
                    f"{name} has a data-dependent shape {shape}, which acache's TensorRT "
                    "runner does not allocate: use ort or aoti for this module"
                )
            out = torch.empty(shape, dtype=self.dtypes[name], device=self.device)
            ctx.set_tensor_address(name, out.data_ptr())
            outs.append(out)
        if not ctx.execute_async_v3(torch.cuda.current_stream(self.device).cuda_stream):
            raise BackendError("TensorRT execute_async_v3 failed (see the TensorRT log)")
        return rebuild_output(outs, self.tree)


def _input_indices(names: Sequence[str], n_inputs: int) -> list[int]:
    """The module argument each engine input binds, from its name ``input_<i>``."""
    known = {input_name(i): i for i in range(n_inputs)}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise BackendError(
            f"the engine has inputs {unknown} the module does not: rebuild with --force"
        )
    return [known[n] for n in names]


MODULE_BACKEND = TrtModuleBackend()
