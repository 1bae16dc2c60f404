"""ort for any module: the ONNX export, optimized by ONNX Runtime once, weights inside.

Build: ``torch.onnx.export`` of ``module(*example_inputs)`` (the dynamo exporter;
``exporter=torchscript`` for the older one), inputs ``input_0..``, outputs
``output_0..`` in the order of the flattened output structure, the dynamic
dimensions as export dims. A session with graph optimizations on writes the
optimized graph (``model.opt.onnx``); that file is the artifact and the raw export
is dropped. Load: a session over it with optimizations off: nothing is traced,
exported or optimized in a warm process. The graph holds the weights, so the
key covers a digest of the module's tensors (module_spec.state_digest).

Execution providers: cpu (the default on a cpu device) and cuda (onnxruntime-gpu).
Feeds and results go through numpy on the host: on cuda each call copies the
inputs in and the outputs out, which the benchmark labels.
"""

from __future__ import annotations

import contextlib
import io
import logging
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..devices import device_index
from ..errors import BackendError
from .base import BuildOptions
from .module_common import (
    FORMAT,
    export_dynamic_shapes,
    no_extra,
    reference_run,
    require_files,
    write_record,
)
from .onnx_export import EXPORTERS, EXTERNAL_DATA_BYTES, export_spec, export_toolchain
from .ort import EP_DTYPES, OPT_MODEL, graph_level, onnxruntime_module, resolve_ep, session_options

if TYPE_CHECKING:
    from ..module_spec import ModuleSpec

EXPORT_FILE = "export.onnx"
EXTRA_KEYS = ("opset", "exporter", "graph_optimization")


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """The exporter prints progress to stdout and warns about what we do on purpose."""
    onnx_log = logging.getLogger("torch.onnx")
    old = onnx_log.level
    onnx_log.setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        onnx_log.setLevel(old)


def _export(spec: ModuleSpec, opts: BuildOptions, path: Path, n_out: int, external: bool) -> None:
    import torch

    es = export_spec(opts)
    names = [f"input_{i}" for i in range(len(spec.inputs))]
    outs = [f"output_{i}" for i in range(n_out)]
    with torch.no_grad(), _quiet():
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


def _providers(ep: str, opts: BuildOptions) -> list[Any]:
    if ep == "cpu":
        return ["CPUExecutionProvider"]
    dev_id = str(device_index(opts.device))
    return [("CUDAExecutionProvider", {"device_id": dev_id}), "CPUExecutionProvider"]


class OrtModuleBackend:
    name = "ort"
    weights_in_artifact = True

    def check_options(self, opts: BuildOptions) -> None:
        ep = resolve_ep(opts)
        if ep == "tensorrt":
            raise BackendError("backend 'ort' runs a module on the cpu or cuda EP: use --mode cuda")
        no_extra(self.name, opts, EXTRA_KEYS)
        if opts.dtype not in EP_DTYPES[ep]:
            raise BackendError(
                f"backend 'ort' with the {ep} execution provider supports dtype "
                f"{', '.join(EP_DTYPES[ep])}, not {opts.dtype!r}"
            )
        graph_level(opts)
        if str(opts.extra.get("exporter", "dynamo")) not in EXPORTERS:
            export_spec(opts)  # its one-line error

    def factors(self, spec: ModuleSpec, opts: BuildOptions) -> dict[str, Any]:
        ep = resolve_ep(opts)
        return {
            "format": FORMAT,
            "dtype": opts.dtype,
            "ep": ep,
            "graph_optimization": graph_level(opts),
            "export": {**export_spec(opts).factors(), "toolchain": export_toolchain()},
        }

    def build(self, spec: ModuleSpec, opts: BuildOptions, workdir: Path) -> dict[str, Any]:
        import onnx

        flat, tree = reference_run(spec)
        ep = resolve_ep(opts)
        raw = workdir / ".export"
        raw.mkdir()
        n_bytes = sum(t.numel() * t.element_size() for t in spec.module.state_dict().values())
        external = n_bytes > EXTERNAL_DATA_BYTES
        t0 = time.perf_counter()
        try:
            _export(spec, opts, raw / EXPORT_FILE, len(flat), external)
        except Exception as e:
            first = (str(e).strip().splitlines() or [""])[0][:300]
            raise BackendError(
                f"ONNX export of the module failed ({type(e).__name__}: {first}); try "
                "--extra exporter=torchscript, or another backend"
            ) from None
        t_export = time.perf_counter() - t0
        nodes_before = len(onnx.load(str(raw / EXPORT_FILE), load_external_data=False).graph.node)
        level = graph_level(opts)
        so = session_options(level, optimized_out=workdir / OPT_MODEL, external=external)
        t1 = time.perf_counter()
        sess = onnxruntime_module().InferenceSession(
            str(raw / EXPORT_FILE), so, providers=_providers(ep, opts)
        )
        t_opt = time.perf_counter() - t1
        del sess
        for p in sorted(raw.iterdir()):
            p.unlink()
        raw.rmdir()
        meta = {
            "format": FORMAT,
            "ep": ep,
            "graph_optimization": level,
            "exporter": export_spec(opts).exporter,
            "nodes_before": nodes_before,
            "nodes_after": len(onnx.load(str(workdir / OPT_MODEL), load_external_data=False)
                               .graph.node),
            "outputs": len(flat),
            "output_tree": tree,
            "export_seconds": round(t_export, 3),
            "optimize_seconds": round(t_opt, 3),
            "weights": "inside the graph",
        }  # fmt: skip
        write_record(workdir, meta)
        return meta

    def load(
        self, spec: ModuleSpec, opts: BuildOptions, entry_dir: Path, meta: dict[str, Any],
        phases: dict[str, float],
    ) -> Callable[..., Any]:  # fmt: skip
        import torch

        from .torch_private import rebuild_output

        ep = resolve_ep(opts)
        if meta.get("ep") != ep:
            raise BackendError(f"entry {entry_dir.name[:12]} was built for EP {meta.get('ep')!r}")
        require_files(entry_dir, OPT_MODEL)
        t0 = time.perf_counter()
        sess = onnxruntime_module().InferenceSession(
            str(entry_dir / OPT_MODEL), session_options("none"), providers=_providers(ep, opts)
        )
        phases["session_seconds"] = time.perf_counter() - t0
        phases["weights_ready"] = phases["artifact_ready"] = time.perf_counter()
        # The exporter drops inputs the graph never reads: feed by name.
        wanted = {i.name for i in sess.get_inputs()}
        tree, dev = meta["output_tree"], torch.device(spec.device)

        def run(*args: Any) -> Any:
            feeds = {
                f"input_{i}": a.detach().cpu().numpy()
                for i, a in enumerate(args)
                if f"input_{i}" in wanted
            }
            outs = sess.run(None, feeds)
            return rebuild_output([torch.from_numpy(o).to(dev) for o in outs], tree)

        return run


MODULE_BACKEND = OrtModuleBackend()
