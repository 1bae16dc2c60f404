"""Compiling any nn.Module: the small protocol each backend implements, and eager.

The LLM backends (``Backend`` in base.py) build recipe step functions; a module
backend builds one ``forward`` over the user's own module (module_spec.py). Each
lives beside its LLM sibling and reuses its availability check, toolchain and
compiler plumbing:

=========  ======================  =============================================
backend    module                  artifact
=========  ======================  =============================================
eager      module_common.py        a record; the module runs as it is
inductor   module_inductor.py      Mega-Cache + C++ kernel objects (no weights)
aoti       module_aoti.py          one weight-stripped AOTInductor .so (no weights)
ort        module_ort.py           the ORT-optimized ONNX graph (weights inside)
trt        module_trt.py           a TensorRT engine from the same export
                                   (module_onnx.py; weights inside; unverified
                                   on real TensorRT)
=========  ======================  =============================================

module_api.compile() joins them with the store and the keys. Every build first runs the
module once, eagerly, on the example inputs: that checks the inputs fit before
anything is cached and records the output structure, so runtimes that return a
flat list of tensors (AOTInductor, ORT) hand back what ``model(*inputs)`` would.
"""

from __future__ import annotations

import importlib
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from ..devices import device_type
from ..errors import BackendError, ShapeError
from .base import BuildOptions, get_backend

if TYPE_CHECKING:
    from ..module_spec import ModuleSpec

MODULE_BACKENDS = {
    "eager": "module_common",
    "inductor": "module_inductor",
    "aoti": "module_aoti",
    "ort": "module_ort",
    "trt": "module_trt",
}
RECORD = "module.json"
FORMAT = 1


class ModuleBackend(Protocol):
    name: str
    # True when the artifact holds the weights: the key then covers their digest.
    weights_in_artifact: bool

    def check_options(self, opts: BuildOptions) -> None:
        """One-line BackendError for options this backend does not take for modules."""
        ...

    def factors(self, spec: ModuleSpec, opts: BuildOptions) -> dict[str, Any]:
        """What, besides the module fingerprint, shapes the artifact (backend.options)."""
        ...

    def build(self, spec: ModuleSpec, opts: BuildOptions, workdir: Path) -> dict[str, Any]:
        """Write the artifact into workdir; return the manifest's meta."""
        ...

    def load(
        self, spec: ModuleSpec, opts: BuildOptions, entry_dir: Path, meta: dict[str, Any],
        phases: dict[str, float],
    ) -> Callable[..., Any]:  # fmt: skip
        """A callable with the module's outputs, from a verified entry; stamps phases.

        May raise StaleArtifact (an intact entry that cannot run here): module_api.compile
        then rebuilds it once.
        """
        ...

    # Optional: sibling_options(opts) -> BuildOptions, the options the LLM sibling's
    # available() and toolchain() are asked with when they differ from the module's
    # (trt: its onnx mode, whatever mode the module path was given).


def get_module_backend(name: str) -> ModuleBackend:
    if name not in MODULE_BACKENDS:
        get_backend(name)  # the one-line "unknown backend" error
    module = importlib.import_module(f"{__package__}.{MODULE_BACKENDS[name]}")
    return module.MODULE_BACKEND


def reference_run(spec: ModuleSpec) -> tuple[list[Any], str]:
    """Run the module eagerly once: (flat outputs, output structure); ShapeError if it fails."""
    import torch

    from .torch_private import output_tree

    try:
        with torch.no_grad():
            out = spec.module(*spec.example_inputs)
    except Exception as e:
        first = (str(e).strip().splitlines() or [""])[0][:300]
        shapes = ", ".join(s.describe() for s in spec.inputs)
        raise ShapeError(
            f"the model rejects inputs ({shapes}): {type(e).__name__}: {first}"
        ) from None
    flat, tree = output_tree(out)
    if not all(isinstance(t, torch.Tensor) for t in flat):
        raise BackendError("the model's outputs must all be tensors (in tuples, lists or dicts)")
    return flat, tree


def write_record(workdir: Path, meta: dict[str, Any]) -> None:
    (workdir / RECORD).write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")


def require_files(entry_dir: Path, *names: str) -> None:
    for n in names:
        if not (entry_dir / n).is_file():
            raise BackendError(f"entry {entry_dir.name[:12]} has no {n}: rebuild it with --force")


def no_extra(name: str, opts: BuildOptions, allowed: tuple[str, ...] = ()) -> None:
    unknown = sorted(set(opts.extra) - set(allowed))
    if unknown:
        takes = f"its options are {', '.join(allowed)}" if allowed else "it takes none"
        raise BackendError(f"backend {name!r} does not take {unknown} for a module: {takes}")


class CompiledModule:
    """What module_api.compile() returns: call it like the module.

    Inputs are checked against the shapes and dtypes the artifact was built for
    (a static AOTInductor kernel would otherwise read past a smaller tensor).
    """

    def __init__(
        self, fn: Callable[..., Any], spec: ModuleSpec, *, backend: str, key: str, source: str,
        keepalive: Any = None,
    ) -> None:  # fmt: skip
        self._fn = fn
        self.spec = spec
        self.backend = backend
        self.key = key
        self.source = source  # "built" | "local" (a hit) | "pulled"
        self._keepalive = keepalive

    def __call__(self, *args: Any) -> Any:
        self.spec.check_call(args)
        return self._fn(*args)

    def __repr__(self) -> str:
        return f"CompiledModule({self.spec.label()}, backend={self.backend}, key={self.key[:12]})"


class EagerModuleBackend:
    """The baseline: nothing to compile; the entry records that the inputs fit."""

    name = "eager"
    weights_in_artifact = False

    def check_options(self, opts: BuildOptions) -> None:
        if opts.mode not in (None, "default"):
            raise BackendError(f"backend 'eager' has no modes (got mode {opts.mode!r})")
        no_extra(self.name, opts)

    def factors(self, spec: ModuleSpec, opts: BuildOptions) -> dict[str, Any]:
        return {"format": FORMAT, "dtype": opts.dtype, "device": device_type(opts.device)}

    def build(self, spec: ModuleSpec, opts: BuildOptions, workdir: Path) -> dict[str, Any]:
        flat, tree = reference_run(spec)
        meta = {"format": FORMAT, "outputs": len(flat), "output_tree": tree}
        write_record(workdir, meta)
        return meta

    def load(
        self, spec: ModuleSpec, opts: BuildOptions, entry_dir: Path, meta: dict[str, Any],
        phases: dict[str, float],
    ) -> Callable[..., Any]:  # fmt: skip
        import torch

        require_files(entry_dir, RECORD)
        module = spec.module

        def run(*args: Any) -> Any:
            with torch.no_grad():
                return module(*args)

        phases["weights_ready"] = phases["artifact_ready"] = time.perf_counter()
        return run


MODULE_BACKEND = EagerModuleBackend()


def export_dynamic_shapes(spec: ModuleSpec) -> Any:
    """torch.export's dynamic_shapes (one tuple entry per input) from the spec's ranges."""
    if not spec.dynamic:
        return None
    from torch.export import Dim

    return tuple(
        {d: Dim(f"in{i}_d{d}", min=lo, max=hi) for d, (lo, hi) in dims.items()} or None
        for i, dims in enumerate(spec.dynamic)
    )
