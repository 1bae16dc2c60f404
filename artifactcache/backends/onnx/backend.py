"""ort: ONNX Runtime over the cached ONNX export, with the optimized graph as the artifact.

Build: take the shared export (a dependency, ``export.export_dependency``:
its own cache entry, which artifactcache/api/recipe.py opens or builds, so ``ort`` and
``trt`` export once), create a session with graph
optimizations on and ``SessionOptions.optimized_model_filepath`` pointing into
the staging dir. ORT writes the graph after its optimizers ran
(``model.opt.onnx``) and that file is the artifact.

Load: a session over ``model.opt.onnx`` with ``ORT_DISABLE_ALL``: the graph is
already optimized, so a warm process skips the optimizer passes (ORT's verbose
log then says "No graph transformers registered for level 1/2/3"; see
tests/test_backends_onnx.py). Because ORT_ENABLE_ALL layout passes (NCHWc) are
specific to the CPU they ran on, the key's hardware factor carries the CPU ISA.

Execution providers (``--mode``): ``cpu`` (default on --device cpu), ``cuda``
(onnxruntime-gpu), ``tensorrt`` (default on --device cuda when tensorrt is
importable). The TensorRT EP compiles subgraphs into engines, and ORT refuses to
serialize a graph with compiled nodes, so with that EP the artifact is the EP's
engine and timing cache, built into the staging dir; at load they are copied
to a private temp dir first, because the EP writes into its cache dir on any
mismatch and a verified entry must never change. The TensorRT EP path is
written to ONNX Runtime's documented provider options and unverified here:
no machine we have can install TensorRT. It stays here, not in backends/tensorrt/:
it is ONNX Runtime provider options and never calls the tensorrt module.
"""

from __future__ import annotations

import importlib.util
import shutil
import tempfile
import time
import weakref
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ... import settings
from ...choices import BuildChoices
from ...devices import device_index, is_cuda
from ...errors import BackendError
from ...extras import TRT_HINT, install_hint
from ...keys import toolchain_fingerprint
from ..base import BuildContext, Dependency
from ..shared.model_options import check_quant, check_recipe_options
from .export import (
    DEFAULT_OPSET,
    EXPORT_DEP,
    every_row,
    export_dependency,
    export_spec,
    exported,
    first_pass_inputs,
)
from .step_shapes import OUTPUT_NAMES, STEP_INPUT_NAMES, cache_shape, step_profiles

if TYPE_CHECKING:
    from ...config import Recipe
    from ..shared.runner import StepRunner
    from .export import ExportSpec

OPT_MODEL = "model.opt.onnx"
OPT_DATA = "model.opt.onnx.data"
TRT_CACHE_DIR = "trt_cache"
FORMAT = 1
EPS = ("cpu", "cuda", "tensorrt")
EP_PROVIDER = {
    "cpu": "CPUExecutionProvider",
    "cuda": "CUDAExecutionProvider",
    "tensorrt": "TensorrtExecutionProvider",
}
# dtypes each EP runs here: ORT's CPU EP lacks fp16/bf16 kernels for most of these ops,
# and neither GPU EP path is set up for bf16 inputs.
EP_DTYPES = {"cpu": ("fp32",), "cuda": ("fp32", "fp16"), "tensorrt": ("fp32", "fp16")}
OPT_LEVELS = ("basic", "extended", "all")
EXTRA_KEYS = ("opset", "exporter", "graph_optimization")
# The CPU EP's default opset: at 23 the exporter turns SDPA into ONNX's Attention op,
# which ORT's CPU EP (1.23 and later) runs as one kernel instead of MatMul, mask and
# Softmax (docs/perf-notes.md attempt 32). The CUDA EP placed that op on the CPU
# (onnxruntime#28025) and TensorRT is unverified with it, so the GPU EPs keep the floor.
ATTENTION_OPSET = 23
ATTENTION_ORT = (1, 23)


def onnxruntime_module() -> Any:
    import onnxruntime

    return onnxruntime


def ort_version() -> tuple[int, ...] | None:
    """onnxruntime's (major, minor), or None where it is not installed or fails to import:
    check_options runs before require_available (and compare's availability() catches only
    AcacheError), so a missing onnxruntime must reach the one-line "unavailable" error."""
    try:
        if importlib.util.find_spec("onnxruntime") is None:
            return None
        version = onnxruntime_module().__version__
    except Exception:  # noqa: BLE001 - any failed import: require_available says how
        return None
    parts = version.split(".")[:2]
    return tuple(int("".join(c for c in p if c.isdigit()) or 0) for p in parts)


def default_opset(ep: str) -> int:
    """The opset an export for ``ep`` gets unless ``--extra opset=N`` says otherwise
    (the floor where onnxruntime is missing: the build then stops as unavailable)."""
    version = ort_version()
    if ep == "cpu" and version is not None and version >= ATTENTION_ORT:
        return ATTENTION_OPSET
    return DEFAULT_OPSET


def ort_export_spec(opts: BuildChoices) -> ExportSpec:
    return export_spec(opts, default_opset=default_opset(resolve_ep(opts)))


def tensorrt_importable() -> bool:
    return importlib.util.find_spec("tensorrt") is not None


def resolve_ep(opts: BuildChoices) -> str:
    """The execution provider the options ask for (``--mode``), or the default for the device."""
    on_gpu = is_cuda(opts.device)
    mode = opts.mode
    if mode in (None, "default", "auto"):
        if not on_gpu:
            return "cpu"
        return "tensorrt" if tensorrt_importable() else "cuda"
    if mode not in EPS:
        raise BackendError(f"backend 'ort' has modes {', '.join(EPS)} (got --mode {mode})")
    if (mode == "cpu") == on_gpu:
        want = "cpu" if mode == "cpu" else "cuda"
        raise BackendError(f"--mode {mode} runs on --device {want}, not {opts.device}")
    return mode


def graph_level(opts: BuildChoices) -> str:
    level = str(opts.extra.get("graph_optimization", "all"))
    if level not in OPT_LEVELS:
        raise BackendError(
            f"graph_optimization must be one of {', '.join(OPT_LEVELS)}, got {level!r}"
        )
    return level


def _ort_level(name: str) -> Any:
    g = onnxruntime_module().GraphOptimizationLevel
    return {
        "none": g.ORT_DISABLE_ALL,
        "basic": g.ORT_ENABLE_BASIC,
        "extended": g.ORT_ENABLE_EXTENDED,
        "all": g.ORT_ENABLE_ALL,
    }[name]


def session_options(
    level: str, *, optimized_out: Path | None = None, external: bool = False, verbose: bool = False
) -> Any:
    """SessionOptions for building (level != "none", saving the graph) or loading ("none")."""
    so = onnxruntime_module().SessionOptions()
    so.graph_optimization_level = _ort_level(level)
    if optimized_out is not None:
        so.optimized_model_filepath = str(optimized_out)
        if external:
            # Weights over 2 GiB cannot live inside the protobuf: keep them in one side file.
            so.add_session_config_entry(
                "session.optimized_model_external_initializers_file_name", OPT_DATA
            )
            so.add_session_config_entry(
                "session.optimized_model_external_initializers_min_size_in_bytes", "1024"
            )
    # Errors only by default: ORT warns that an ORT_ENABLE_ALL graph is specific to
    # this CPU, which the key already accounts for (hardware.cpu_isa).
    # ACACHE_ORT_VERBOSE=1 shows ORT's own log (which optimizer passes ran).
    verbose = verbose or settings.get("ACACHE_ORT_VERBOSE")
    so.log_severity_level = 0 if verbose else 3
    return so


def trt_ep_options(recipe: Recipe, cache_dir: Path, device_id: int) -> dict[str, str]:
    """TensorRT EP options: engine and timing caches in cache_dir, and the prefill profile
    of the step graph (onnx/step_shapes.py step_profiles: T over 1..prefill_len, the batch static
    at max_batch), the same ranges the trt backend's engines take."""
    prefill = step_profiles(recipe)[0]

    def shapes(which: int) -> str:
        return ",".join(
            f"{name}:{'x'.join(map(str, ranges[which]))}" for name, ranges in prefill.items()
        )

    return {
        "device_id": str(device_id),
        "trt_engine_cache_enable": "True",
        "trt_engine_cache_path": str(cache_dir),
        "trt_timing_cache_enable": "True",
        "trt_timing_cache_path": str(cache_dir),
        # Explicit profiles make the EP build its engine at session creation, for
        # every token count the runner uses (1 for decode, up to prefill_len for prefill).
        "trt_profile_min_shapes": shapes(0),
        "trt_profile_opt_shapes": shapes(1),
        "trt_profile_max_shapes": shapes(2),
    }


def providers_for(ep: str, opts: BuildChoices, recipe: Recipe, trt_dir: Path | None) -> list:
    dev_id = device_index(opts.device)
    if ep == "cpu":
        return ["CPUExecutionProvider"]
    cuda = ("CUDAExecutionProvider", {"device_id": str(dev_id)})
    if ep == "cuda":
        return [cuda, "CPUExecutionProvider"]
    assert trt_dir is not None
    trt = ("TensorrtExecutionProvider", trt_ep_options(recipe, trt_dir, dev_id))
    return [trt, cuda, "CPUExecutionProvider"]


class _OrtSteps:
    """prefill/decode step callables over one session; the KV cache lives in OrtValues."""

    def __init__(self, sess: Any, recipe: Recipe, dtype: str, ep: str, device_id: int) -> None:
        import numpy as np

        self.sess = sess
        self.ort = onnxruntime_module()
        self.dev = ("cpu", 0) if ep == "cpu" else ("cuda", device_id)
        np_dtype = np.float16 if dtype == "fp16" else np.float32
        zeros = np.zeros(cache_shape(recipe), dtype=np_dtype)
        self.zero_k = self._value(zeros)
        self.zero_v = self._value(zeros.copy())
        self.keys, self.values = self.zero_k, self.zero_v

    def _value(self, arr: Any) -> Any:
        return self.ort.OrtValue.ortvalue_from_numpy(arr, *self.dev)

    def _run(self, inputs: tuple[Any, ...], keys: Any, values: Any) -> Any:
        """One step: the runner's inputs (STEP_INPUT_NAMES, in order), then the cache."""
        import torch

        feeds = {
            name: self.ort.OrtValue.ortvalue_from_numpy(t.cpu().numpy())
            for name, t in zip(STEP_INPUT_NAMES, inputs, strict=True)
        }
        feeds["past_keys"], feeds["past_values"] = keys, values
        logits, self.keys, self.values = self.sess.run_with_ort_values(list(OUTPUT_NAMES), feeds)
        return torch.from_numpy(logits.numpy())

    def prefill(self, idx: Any, pos: Any, row_start: Any, kv_pos: Any) -> Any:
        # A request starts from an empty cache; stale slots would be masked anyway.
        inputs = (idx, pos, row_start, kv_pos, every_row(pos))
        return self._run(inputs, self.zero_k, self.zero_v)

    def decode(self, idx: Any, pos: Any, row_start: Any, kv_pos: Any) -> Any:
        return self._run((idx, pos, row_start, kv_pos, every_row(pos)), self.keys, self.values)

    def fresh(self, idx: Any, pos: Any) -> Any:
        """A first pass of rows that all start at slot 0: it reads its own positions and
        returns the last one's logits only."""
        return self._run((idx, pos, *first_pass_inputs(idx)), self.zero_k, self.zero_v)


class OrtBackend:
    name = "ort"
    weights_external = False

    def available(self, opts: BuildChoices) -> tuple[bool, str]:
        hint = install_hint("ort")
        for mod in ("onnxruntime", "onnx", "onnxscript"):
            if importlib.util.find_spec(mod) is None:
                return False, f"{mod} not importable: {hint}"
        try:
            ep = resolve_ep(opts)
        except BackendError as e:
            return False, str(e)
        have = onnxruntime_module().get_available_providers()
        if EP_PROVIDER[ep] not in have:
            if ep == "tensorrt":
                return False, (
                    "onnxruntime has no TensorrtExecutionProvider: install onnxruntime-gpu "
                    "built with TensorRT and TensorRT itself"
                )
            if ep == "cuda":
                return False, (
                    "onnxruntime has no CUDAExecutionProvider (CPU-only build): "
                    f"{install_hint('ort-gpu')}"
                )
        if ep == "tensorrt" and not tensorrt_importable():
            return False, f"tensorrt not importable for the TensorRT EP: {TRT_HINT}"
        return True, ""

    def check_options(self, opts: BuildChoices) -> None:
        check_quant(self.name, opts)
        ep = resolve_ep(opts)
        unknown = sorted(set(opts.extra) - set(EXTRA_KEYS))
        if unknown:
            raise BackendError(
                f"backend 'ort' does not take {unknown}: its options are {', '.join(EXTRA_KEYS)}"
            )
        if opts.dtype not in EP_DTYPES[ep]:
            raise BackendError(
                f"backend 'ort' with the {ep} execution provider supports dtype "
                f"{', '.join(EP_DTYPES[ep])}, not {opts.dtype!r}"
            )
        graph_level(opts)
        ort_export_spec(opts)

    def check_recipe(self, recipe: Any, opts: BuildChoices) -> None:
        check_recipe_options(self.name, recipe, opts)

    def factors(self, recipe: Any, opts: BuildChoices) -> dict[str, Any]:
        # The export's own key is a function of the recipe and weights (already in this
        # key) and of these export factors, so this key determines the export key too;
        # the export key itself is recorded in the manifest's meta.
        from .export import export_toolchain

        return {
            "format": FORMAT,
            "dtype": opts.dtype,
            "ep": resolve_ep(opts),
            "graph_optimization": graph_level(opts),
            "export": {**ort_export_spec(opts).factors(), "toolchain": export_toolchain()},
        }

    def toolchain(self, opts: BuildChoices) -> dict[str, Any]:
        gpu = importlib.util.find_spec("onnxruntime") is not None and any(
            p != "CPUExecutionProvider" and p != "AzureExecutionProvider"
            for p in onnxruntime_module().get_available_providers()
        )
        pkgs = ["torch", "onnx", "onnxruntime-gpu" if gpu else "onnxruntime"]
        out = toolchain_fingerprint(pkgs)
        out["onnxruntime_build"] = onnxruntime_module().__version__
        if resolve_ep(opts) == "tensorrt":
            out.update(toolchain_fingerprint(("tensorrt",)))
        return out

    def dependencies(self, ctx: BuildContext, weights: str, *, for_load: bool) -> list[Dependency]:
        # With the TensorRT EP the artifact is the EP's engine cache, not a graph: a load
        # opens the session over the export again, so the export must outlive the entry.
        at_load = resolve_ep(ctx.opts) == "tensorrt"
        return [export_dependency(ctx, weights, ort_export_spec(ctx.opts), at_load=at_load)]

    def build(self, ctx: BuildContext, workdir: Path) -> dict[str, Any]:
        import onnx

        opts = ctx.opts
        ep = resolve_ep(opts)
        onnx_path, export = exported(ctx)
        emeta = export.meta
        level = graph_level(opts)
        meta: dict[str, Any] = {
            "format": FORMAT,
            "ep": ep,
            "export_key": export.key,
            "export_source": ctx.dep_sources.get(EXPORT_DEP),
            "exporter_used": emeta.get("exporter_used"),
            "graph_optimization": level,
        }
        trt_dir = None
        if ep == "tensorrt":
            trt_dir = workdir / TRT_CACHE_DIR
            trt_dir.mkdir()
            so = session_options(level)
        else:
            so = session_options(
                level, optimized_out=workdir / OPT_MODEL, external=emeta.get("external_data", False)
            )
        t0 = time.perf_counter()
        sess = onnxruntime_module().InferenceSession(
            str(onnx_path), so, providers=providers_for(ep, opts, ctx.recipe, trt_dir)
        )
        meta["optimize_seconds"] = round(time.perf_counter() - t0, 4)
        meta["providers"] = sess.get_providers()
        if ep == "tensorrt":
            # Run both shapes once so every engine the EP needs is in the cache dir.
            steps = _OrtSteps(sess, ctx.recipe, opts.dtype, ep, _device_id(opts))
            _warm(steps, ctx.recipe)
            if not any(trt_dir.iterdir()):
                raise BackendError("the TensorRT EP wrote no engine cache; check its log")
        else:
            meta["nodes_before"] = emeta.get("nodes")
            meta["nodes_after"] = len(
                onnx.load(str(workdir / OPT_MODEL), load_external_data=False).graph.node
            )
        return meta

    def load(self, ctx: BuildContext, entry_dir: Path, meta: dict[str, Any]) -> StepRunner:
        import torch

        from ..shared.runner import StepRunner

        opts = ctx.opts
        ep = resolve_ep(opts)
        if meta.get("ep") != ep:
            raise BackendError(f"entry {entry_dir.name[:12]} was built for EP {meta.get('ep')!r}")
        keepalive: list[Any] = []
        if ep == "tensorrt":
            onnx_path, _ = exported(ctx)
            tmp = Path(tempfile.mkdtemp(prefix="acache-ort-trt-"))
            shutil.copytree(entry_dir / TRT_CACHE_DIR, tmp / TRT_CACHE_DIR)
            trt_dir = tmp / TRT_CACHE_DIR
            model_path, so = onnx_path, session_options(graph_level(opts))
        else:
            trt_dir, tmp = None, None
            model_path, so = entry_dir / OPT_MODEL, session_options("none")
        t0 = time.perf_counter()
        sess = onnxruntime_module().InferenceSession(
            str(model_path), so, providers=providers_for(ep, opts, ctx.recipe, trt_dir)
        )
        ctx.phases["session_seconds"] = time.perf_counter() - t0
        # The weights are inside the graph: they are ready when the session is.
        ctx.phases["weights_ready"] = ctx.phases["artifact_ready"] = time.perf_counter()
        steps = _OrtSteps(sess, ctx.recipe, opts.dtype, ep, _device_id(opts))
        keepalive.append(steps)
        # prefill starts from an empty cache; decode continues it, at any token count
        # the graph takes, so it also runs a long prompt's later chunks.
        runner = StepRunner(
            ctx.recipe, steps.prefill, steps.decode, torch.device("cpu"),
            extend=steps.decode, fresh=steps.fresh, keepalive=keepalive, kv_len_hint=True,
        )  # fmt: skip
        if tmp is not None:
            weakref.finalize(runner, shutil.rmtree, tmp, True)
        return runner


def _device_id(opts: BuildChoices) -> int:
    return device_index(opts.device)


def _warm(steps: _OrtSteps, recipe: Recipe) -> None:
    import torch

    from ..shared.steps import example_inputs

    cpu = torch.device("cpu")
    idx, pos, row_start, kv_pos = example_inputs(recipe, cpu, "extend")
    steps.fresh(idx, pos)
    steps.prefill(idx, pos, row_start, kv_pos)
    steps.decode(*example_inputs(recipe, cpu, "decode"))


BACKEND = OrtBackend()
