"""ONNX export of a recipe's prefill and decode step, as a cache entry of its own.

One graph serves both steps. Its token axis ``T`` is dynamic (1..prefill_len),
so prefill runs it with passes of up to prefill_len tokens and decode with T = 1; its batch axis B
is static at the recipe's max_batch (a smaller request pads rows). ``step_dims``
(onnx/step_shapes.py) holds these shapes, for the export and for TensorRT's profiles
alike::

    inputs:  input_ids [B, T] int64, input_pos [T] int64, row_start [B] int64,
             kv_pos [L] int64, logit_rows [R] int64,
             past_keys / past_values [n_layers, B, n_kv_heads, max_seq_len + 1, head_dim]
    outputs: logits [B, R, vocab] fp32,
             present_keys / present_values (same shape as past_*)

``row_start[b]`` is row b's first real slot (prompts are left-padded to the
longest, backends/runner.py). ``logit_rows`` names the positions of the pass whose
logits come out (0..T-1): all of them for ``logits()``, only the last for a prompt's
first pass, whose LM head over every position would otherwise cost as much as the
rest of a small model and write [T, vocab] fp32 (perf-notes attempt 29). ``kv_pos``
(0..L-1) is how many cache positions attention reads, as the torch backends' steps take
it: a first pass reads its own T, decode the filled length's bucket (kv_buckets.py).

The KV cache is an explicit input and output, not a buffer: the models'
in-place ``KVCache`` is swapped for :class:`_FunctionalKV`, which writes with an
out-of-place ``index_copy`` and hands the new cache back. The cache's sequence
axis stays static (a fixed-size cache is what TensorRT profiles and ORT buffers
want) at ``max_seq_len`` + 1: the spare slot, never written, keeps the read view
``cache[:, :, :L]`` non-contiguous for every L, so the export does not specialize L
on contiguity (kv_buckets.cache_slots says the same of the torch models' cache).
Caches are stacked over layers
(one tensor each for keys and values) because ``torch.export`` cannot take a
variable number of inputs, and four I/O tensors keep TensorRT bindings simple.

Exporter: the dynamo exporter (``torch.onnx.export(dynamo=True)``) is the
default. On torch 2.13 it exports every tiny recipe with the dynamic token axis
and matches eager within 1e-6 relative; it takes ~10-20 s per tiny model on 2
cores. The TorchScript exporter does the same in under 1 s but is deprecated
since torch 2.9, so it is only the fallback when the dynamo exporter raises
(``meta["exporter_used"]`` records which one ran) or when asked for with
``--extra exporter=torchscript`` (CLI) or ``extra={"exporter": "torchscript"}`` (API).

Exporting is its own cache entry (backend name ``onnx-export``), keyed by the
recipe, the weights, the opset, the dtype, the exporter and the exporter
toolchain, so the ORT and TRT backends share one export. A backend declares it
with :func:`export_dependency`; artifactcache/api/recipe.py opens or builds it.
"""

from __future__ import annotations

import contextlib
import io
import logging
import sys
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ... import settings
from ...errors import BackendError
from ...keys import make_factors, toolchain_fingerprint
from ..base import Dependency
from .step_shapes import INPUT_NAMES, OUTPUT_NAMES, dynamic_axes, example_inputs

if TYPE_CHECKING:
    import torch

    from ...choices import BuildChoices
    from ...config import Recipe
    from ..base import BuildContext

EXPORT_DEP = "onnx_export"  # its name in a dependent's ctx.deps and meta["built_from"]
MODEL_FILE = "model.onnx"
DATA_FILE = "model.onnx.data"
# Bumped when the graph's I/O contract (names, layout) changes.
GRAPH_FORMAT = "llm-step-v3"
DEFAULT_OPSET = 18
MIN_OPSET = 18  # the dynamo exporter's floor
EXPORTERS = ("dynamo", "torchscript")
EXPORT_DTYPES = ("fp32", "fp16", "bf16")
# Above this many parameter bytes, weights go to an external data file (protobuf's 2 GiB cap).
EXTERNAL_DATA_BYTES = 1 << 30


def every_row(pos: torch.Tensor) -> torch.Tensor:
    """``logit_rows`` for every position of a pass (input_pos ``pos``)."""
    import torch

    return torch.arange(len(pos), dtype=torch.int64, device=pos.device)


def first_pass_inputs(idx: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """(row_start, kv_pos, logit_rows) of a first pass whose rows all start at slot 0:
    attention reads its own T positions, and its last row's logits come out."""
    import torch

    b, t = idx.shape
    dev = idx.device
    return (torch.zeros(b, dtype=torch.int64, device=dev),
            torch.arange(t, dtype=torch.int64, device=dev),
            torch.tensor([t - 1], dtype=torch.int64, device=dev))  # fmt: skip


@dataclass(frozen=True)
class ExportSpec:
    """What, besides recipe and weights, shapes an export."""

    dtype: str = "fp32"
    opset: int = DEFAULT_OPSET
    exporter: str = "dynamo"

    def factors(self) -> dict[str, Any]:
        return {
            "graph": GRAPH_FORMAT,
            "dtype": self.dtype,
            "opset": self.opset,
            "exporter": self.exporter,
        }


def export_spec(
    opts: BuildChoices, dtype: str | None = None, default_opset: int = DEFAULT_OPSET
) -> ExportSpec:
    """The export a backend's options ask for; bad values are one-line BackendErrors."""
    dt = dtype or opts.dtype
    if dt not in EXPORT_DTYPES:
        raise BackendError(f"ONNX export supports dtype {', '.join(EXPORT_DTYPES)}, got {dt!r}")
    raw_opset = opts.extra.get("opset", default_opset)
    try:
        opset = int(raw_opset)
    except (TypeError, ValueError):
        raise BackendError(f"opset must be an integer, got {raw_opset!r}") from None
    if opset < MIN_OPSET:
        raise BackendError(f"opset {opset} is too old: the exporter needs opset >= {MIN_OPSET}")
    exporter = str(opts.extra.get("exporter", "dynamo"))
    if exporter not in EXPORTERS:
        raise BackendError(f"unknown exporter {exporter!r}: choose one of {', '.join(EXPORTERS)}")
    return ExportSpec(dtype=dt, opset=opset, exporter=exporter)


def export_toolchain() -> dict[str, Any]:
    return toolchain_fingerprint(("torch", "onnx", "onnxscript"))


def export_factors(recipe: Recipe, wfactor: str, spec: ExportSpec) -> dict[str, Any]:
    # The graph holds no device code, so no hardware factor: one export serves CPU and GPU.
    return make_factors(
        recipe=recipe.normalized(),
        weights=wfactor,
        backend="onnx-export",
        options=spec.factors(),
        toolchain=export_toolchain(),
        hardware={},
    )


def export_dependency(
    ctx: BuildContext, wfactor: str, spec: ExportSpec, *, at_load: bool = False
) -> Dependency:
    """The export as a dependency of a backend's entry (api/recipe.py opens or builds it).

    ``wfactor`` is the weights factor of the dependent's key, so both entries name
    the same weights.
    """
    label = {
        "recipe": ctx.recipe.name,
        "backend": "onnx-export",
        "device": "any",
        "dtype": spec.dtype,
        "mode": spec.exporter,
        "weights": ctx.weights.describe(),
    }

    def build(workdir: Path) -> dict[str, Any]:
        return export_to(workdir, ctx, spec)

    return Dependency(
        name=EXPORT_DEP,
        factors=export_factors(ctx.recipe, wfactor, spec),
        label=label,
        build=build,
        at_load=at_load,
    )


def exported(ctx: BuildContext) -> tuple[Path, Any]:
    """(model.onnx path, export Entry) of the export api/recipe.py opened for this backend."""
    entry = ctx.deps.get(EXPORT_DEP)
    if entry is None:
        raise BackendError("the ONNX export was not opened (call through artifactcache.api)")
    return entry.path / MODEL_FILE, entry


# ------------------------------------------------------------------ the graph --


def _step_module(model: torch.nn.Module) -> torch.nn.Module:
    """The model with a functional KV cache:
    (ids, pos, row_start, kv_pos, logit_rows, keys, values) -> (logits, keys, values)."""
    import torch
    from torch import nn

    class _FunctionalKV(nn.Module):
        # Replaces models.common.KVCache: same update() signature, but reads the
        # cache from the step's inputs and records the new one instead of mutating.
        def __init__(self, slot: dict[str, Any], layer: int) -> None:
            super().__init__()
            self.slot, self.layer = slot, layer

        def update(self, input_pos, k, v, length):
            kn = self.slot["k"][self.layer].index_copy(2, input_pos, k)
            vn = self.slot["v"][self.layer].index_copy(2, input_pos, v)
            self.slot["out"][self.layer] = (kn, vn)
            return kn[:, :, :length], vn[:, :, :length]

    class ExportStep(nn.Module):
        def __init__(self, inner: nn.Module) -> None:
            super().__init__()
            self.inner = inner
            # A plain dict, not module state: tracing must not see attribute mutation.
            self.slot: dict[str, Any] = {"out": {}}
            self.n_layers = len(inner.model.layers)
            for i, layer in enumerate(inner.model.layers):
                layer.self_attn.kv_cache = _FunctionalKV(self.slot, i)

        def forward(
            self, input_ids, input_pos, row_start, kv_pos, logit_rows, past_keys, past_values
        ):
            self.slot["k"], self.slot["v"] = past_keys.unbind(0), past_values.unbind(0)
            logits = self.inner(input_ids, input_pos, row_start, kv_pos, logit_rows=logit_rows)
            out = [self.slot["out"][i] for i in range(self.n_layers)]
            keys = torch.stack([kv[0] for kv in out])
            values = torch.stack([kv[1] for kv in out])
            return logits, keys, values

    return ExportStep(model).eval()


def _export_dynamo(step, args, path: Path, recipe: Recipe, spec: ExportSpec, external: bool):
    import torch

    axes = dynamic_axes(recipe, INPUT_NAMES)
    dims = {a.name: a for per_input in axes.values() for a in per_input.values()}
    # One Dim per axis name: inputs that share an axis (T) share its export symbol.
    export_dims = {n: torch.export.Dim(n, min=a.lo, max=a.hi) for n, a in dims.items()}
    shapes = {
        name: {d: export_dims[a.name] for d, a in axes[name].items()} if name in axes else None
        for name in INPUT_NAMES
    }
    with quiet_exporter():
        prog = _dynamo_call(step, args, shapes, spec)
    prog.save(str(path), external_data=external)


# Loggers of the exporter and its optimizer: torch.onnx's progress, and onnxscript's
# constant folding, which logs "Evaluation failed" for every node it leaves unfolded.
EXPORTER_LOGGERS = ("torch.onnx", "onnxscript")


@contextlib.contextmanager
def quiet_exporter() -> Iterator[None]:
    """The exporter prints progress to stdout, warns about what we do on purpose and logs
    its optimizer's misses: stdout stays clean for `--json` callers always, and stderr for
    the user unless ACACHE_ORT_VERBOSE is set."""
    if settings.get("ACACHE_ORT_VERBOSE"):
        with contextlib.redirect_stdout(sys.stderr):
            yield
        return
    loggers = [logging.getLogger(name) for name in EXPORTER_LOGGERS]
    levels = [log.level for log in loggers]
    for log in loggers:
        log.setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        for log, level in zip(loggers, levels, strict=True):
            log.setLevel(level)


def _dynamo_call(step, args, shapes, spec: ExportSpec):
    import torch

    return torch.onnx.export(
        step,
        args,
        dynamo=True,
        input_names=list(INPUT_NAMES),
        output_names=list(OUTPUT_NAMES),
        dynamic_shapes=shapes,
        opset_version=spec.opset,
        optimize=True,
        verbose=False,
    )


def _export_torchscript(step, args, path: Path, recipe: Recipe, spec: ExportSpec) -> None:
    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the exporter's own deprecation notice
        torch.onnx.export(
            step,
            args,
            str(path),
            dynamo=False,
            input_names=list(INPUT_NAMES),
            output_names=list(OUTPUT_NAMES),
            dynamic_axes={
                name: {d: a.name for d, a in axes.items()}
                for name, axes in dynamic_axes(recipe, INPUT_NAMES + OUTPUT_NAMES).items()
            },
            opset_version=spec.opset,
        )


def _resave_external(path: Path) -> None:
    """One external data file next to the graph, whatever the exporter wrote."""
    import onnx

    model = onnx.load(str(path), load_external_data=True)
    for p in path.parent.iterdir():
        if p != path:
            p.unlink()
    onnx.save_model(
        model,
        str(path),
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location=DATA_FILE,
    )


def export_to(workdir: Path, ctx: BuildContext, spec: ExportSpec) -> dict[str, Any]:
    """Export the recipe's step graph into workdir/model.onnx and check it."""
    import onnx
    import torch

    from ...dtypes import torch_dtype
    from ...models import build_model

    t0 = time.perf_counter()
    tdtype = torch_dtype(spec.dtype)
    # Export on CPU: the graph and its initializers do not depend on the device.
    model = build_model(ctx.recipe, device="cpu", dtype=spec.dtype, weights=ctx.weights)
    n_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    external = n_bytes > EXTERNAL_DATA_BYTES
    step = _step_module(model)
    args = example_inputs(ctx.recipe, tdtype)
    path = workdir / MODEL_FILE
    used, fallback_reason = spec.exporter, None
    with torch.no_grad():
        if spec.exporter == "dynamo":
            try:
                _export_dynamo(step, args, path, ctx.recipe, spec, external)
            except Exception as e:  # any exporter failure: fall back, and say why in the meta
                fallback_reason = f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
                for p in workdir.iterdir():
                    p.unlink()
                used = "torchscript"
        if used == "torchscript":
            _export_torchscript(step, args, path, ctx.recipe, spec)
    if external:
        _resave_external(path)
    onnx.checker.check_model(str(path), full_check=True)
    graph = onnx.load(str(path), load_external_data=False).graph
    meta: dict[str, Any] = {
        "graph": GRAPH_FORMAT,
        "exporter": spec.exporter,
        "exporter_used": used,
        "opset": spec.opset,
        "dtype": spec.dtype,
        "inputs": [i.name for i in graph.input],
        "outputs": [o.name for o in graph.output],
        "nodes": len(graph.node),
        "external_data": external,
        "parameter_bytes": n_bytes,
        "export_seconds": round(time.perf_counter() - t0, 3),
        "checker": "onnx.checker full_check passed",
    }
    if fallback_reason:
        meta["dynamo_error"] = fallback_reason
    return meta


def has_qdq(path: Path) -> bool:
    """Whether the graph is explicitly quantized (QuantizeLinear/DequantizeLinear nodes)."""
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph
    return any(n.op_type in ("QuantizeLinear", "DequantizeLinear") for n in graph.node)
