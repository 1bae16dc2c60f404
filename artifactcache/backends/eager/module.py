"""eager for any nn.Module: nothing to compile; the entry records that the inputs fit."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...choices import BuildChoices
from ...devices import device_type
from ...errors import BackendError
from ..shared.any_module import FORMAT, RECORD, no_extra, reference_run, require_files, write_record

if TYPE_CHECKING:
    from ...sources.module import ModuleSpec


class EagerModuleBackend:
    """The baseline: nothing to compile; the entry records that the inputs fit."""

    name = "eager"
    weights_in_artifact = False

    def check_options(self, opts: BuildChoices) -> None:
        if opts.mode not in (None, "default"):
            raise BackendError(f"backend 'eager' has no modes (got mode {opts.mode!r})")
        no_extra(self.name, opts)

    def factors(self, spec: ModuleSpec, opts: BuildChoices) -> dict[str, Any]:
        return {"format": FORMAT, "dtype": opts.dtype, "device": device_type(opts.device)}

    def build(
        self, spec: ModuleSpec, opts: BuildChoices, workdir: Path, memo_dir: Path | None = None
    ) -> dict[str, Any]:
        flat, tree = reference_run(spec)
        meta = {"format": FORMAT, "outputs": len(flat), "output_tree": tree}
        write_record(workdir, meta)
        return meta

    def load(
        self, spec: ModuleSpec, opts: BuildChoices, entry_dir: Path, meta: dict[str, Any],
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
