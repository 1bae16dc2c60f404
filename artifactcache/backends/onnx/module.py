"""ort for any module: the ONNX export, optimized by ONNX Runtime once, weights inside.

Build: the module's ONNX export (onnx/export_module.py: inputs ``input_0..``, outputs
``output_0..`` in the order of the flattened output structure). A session with graph
optimizations on writes the optimized graph (``model.opt.onnx``); that file is the
artifact and the raw export is dropped. Load: a session over it with optimizations
off: nothing is traced, exported or optimized in a warm process. The graph holds the
weights, so the key covers a digest of the module's tensors (sources/module.py state_digest).

Execution providers: cpu (the default on a cpu device) and cuda (onnxruntime-gpu).
Feeds and results go through numpy on the host: on cuda each call copies the
inputs in and the outputs out, which the benchmark labels.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...choices import BuildChoices
from ...devices import device_index
from ...errors import BackendError
from ..shared.any_module import FORMAT, no_extra, reference_run, require_files, write_record
from .backend import (
    EP_DTYPES,
    OPT_MODEL,
    graph_level,
    onnxruntime_module,
    resolve_ep,
    session_options,
)
from .export import EXPORTERS, EXTERNAL_DATA_BYTES, export_spec, export_toolchain
from .export_module import EXPORT_FILE, export_module, input_name

if TYPE_CHECKING:
    from ...sources.module import ModuleSpec

EXTRA_KEYS = ("opset", "exporter", "graph_optimization")


def _providers(ep: str, opts: BuildChoices) -> list[Any]:
    if ep == "cpu":
        return ["CPUExecutionProvider"]
    dev_id = str(device_index(opts.device))
    return [("CUDAExecutionProvider", {"device_id": dev_id}), "CPUExecutionProvider"]


class OrtModuleBackend:
    name = "ort"
    weights_in_artifact = True

    def check_options(self, opts: BuildChoices) -> None:
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

    def factors(self, spec: ModuleSpec, opts: BuildChoices) -> dict[str, Any]:
        ep = resolve_ep(opts)
        return {
            "format": FORMAT,
            "dtype": opts.dtype,
            "ep": ep,
            "graph_optimization": graph_level(opts),
            "export": {**export_spec(opts).factors(), "toolchain": export_toolchain()},
        }

    def build(
        self, spec: ModuleSpec, opts: BuildChoices, workdir: Path, memo_dir: Path | None = None
    ) -> dict[str, Any]:
        import onnx

        flat, tree = reference_run(spec)
        ep = resolve_ep(opts)
        raw = workdir / ".export"
        raw.mkdir()
        n_bytes = sum(t.numel() * t.element_size() for t in spec.module.state_dict().values())
        external = n_bytes > EXTERNAL_DATA_BYTES
        t0 = time.perf_counter()
        export_module(spec, opts, raw / EXPORT_FILE, len(flat), external)
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
        self, spec: ModuleSpec, opts: BuildChoices, entry_dir: Path, meta: dict[str, Any],
        phases: dict[str, float],
    ) -> Callable[..., Any]:  # fmt: skip
        import torch

        from ..shared.torch_private import rebuild_output

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
                input_name(i): a.detach().cpu().numpy()
                for i, a in enumerate(args)
                if input_name(i) in wanted
            }
            outs = sess.run(None, feeds)
            return rebuild_output([torch.from_numpy(o).to(dev) for o in outs], tree)

        return run


MODULE_BACKEND = OrtModuleBackend()
