"""What every backend's nn.Module path shares: the reference run, records, CompiledModule.

A module backend (``ModuleBackend`` in backends/base.py; ``<folder>/module.py`` of each
backend) builds one ``forward`` over the user's own module (sources/module.py). Every
build first runs the module once, eagerly, on the example inputs: that checks the
inputs fit before anything is cached and records the output structure, so runtimes
that return a flat list of tensors (AOTInductor, ORT) hand back what
``model(*inputs)`` would.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...choices import BuildChoices
from ...errors import BackendError, ShapeError

if TYPE_CHECKING:
    from ...sources.module import ModuleSpec

RECORD = "module.json"
FORMAT = 1


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


def no_extra(name: str, opts: BuildChoices, allowed: tuple[str, ...] = ()) -> None:
    unknown = sorted(set(opts.extra) - set(allowed))
    if unknown:
        takes = f"its options are {', '.join(allowed)}" if allowed else "it takes none"
        raise BackendError(f"backend {name!r} does not take {unknown} for a module: {takes}")


class CompiledModule:
    """What api.compile() returns: call it like the module.

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


def export_dynamic_shapes(spec: ModuleSpec) -> Any:
    """torch.export's dynamic_shapes (one tuple entry per input) from the spec's ranges."""
    if not spec.dynamic:
        return None
    from torch.export import Dim

    return tuple(
        {d: Dim(f"in{i}_d{d}", min=lo, max=hi) for d, (lo, hi) in dims.items()} or None
        for i, dims in enumerate(spec.dynamic)
    )
