"""The ONNX export of any module, shared by the ort and trt module backends.

``torch.onnx.export`` of ``module(*example_inputs)`` (the dynamo exporter;
``exporter=torchscript`` for the older one), inputs ``input_0..``, outputs
``output_0..`` in the order of the flattened output structure, the dynamic dimensions
as export dims. The exporter may drop an input the graph never reads (the
torchscript one does), so a runtime binds by name what the graph kept.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from ...choices import BuildChoices
from ...errors import BackendError
from ..shared.any_module import export_dynamic_shapes
from .export import export_spec, quiet_exporter

if TYPE_CHECKING:
    from ...sources.module import ModuleSpec

EXPORT_FILE = "export.onnx"


def input_name(i: int) -> str:
    """The graph's name for the module's i-th positional input."""
    return f"input_{i}"


def output_name(i: int) -> str:
    """The graph's name for the i-th tensor of the module's flattened outputs."""
    return f"output_{i}"


def export_module(
    spec: ModuleSpec, opts: BuildChoices, path: Path, n_out: int, external: bool
) -> None:
    """Export the module to ``path`` (weights in ``path``.data when ``external``).

    A failing export is a one-line BackendError.
    """
    try:
        _export(spec, opts, path, n_out, external)
    except Exception as e:
        first = (str(e).strip().splitlines() or [""])[0][:300]
        raise BackendError(
            f"ONNX export of the module failed ({type(e).__name__}: {first}); try "
            "--extra exporter=torchscript, or another backend"
        ) from None


def _export(spec: ModuleSpec, opts: BuildChoices, path: Path, n_out: int, external: bool) -> None:
    import torch

    es = export_spec(opts)
    names = [input_name(i) for i in range(len(spec.inputs))]
    outs = [output_name(i) for i in range(n_out)]
    with torch.no_grad(), quiet_exporter():
        if es.exporter == "dynamo":
            prog = torch.onnx.export(
                spec.module, spec.example_inputs, dynamo=True, input_names=names,
                output_names=outs, dynamic_shapes=export_dynamic_shapes(spec),
                opset_version=es.opset, optimize=True, verbose=False,
            )  # fmt: skip
            prog.save(str(path), external_data=external)
            return
        axes = {names[i]: {d: f"in{i}_d{d}" for d in dims} for i, dims in enumerate(spec.dynamic)}
        torch.onnx.export(
            spec.module, spec.example_inputs, str(path), dynamo=False, input_names=names,
            output_names=outs, dynamic_axes=axes or None, opset_version=es.opset,
        )  # fmt: skip
