"""inductor for any module: torch.compile's Mega-Cache, warm the way the LLM path is.

Build: compile the module inside a fresh Inductor cache, run it on the example
inputs, and keep ``torch.compiler.save_cache_artifacts()`` plus the C++ kernel
objects (inductor.py says why both). Load: install those, hot-load the Mega-Cache
and compile again: Dynamo traces the module, the FX graph and AOTAutograd caches
hit, and nothing is lowered or handed to a compiler. Parameters are graph inputs
(Dynamo inlines nn.Modules), so the artifact holds no weights and the key none.

Dynamic dimensions are marked on the inputs with ``torch._dynamo.mark_dynamic``
before the first call in both processes, so the warm trace asks for the graph the
build stored. In ``reduce-overhead`` mode (CUDA graphs) an output is overwritten by
the next call, as with torch.compile itself: clone what you keep.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...choices import BuildChoices
from ...devices import device_index, device_type, is_cuda
from ...errors import BackendError
from ..shared.any_module import FORMAT, no_extra, reference_run, require_files, write_record
from .autotune_cache import inductor_tuning_results_kept
from .backend import KERNELS, MEGACACHE, MODES
from .files import install_compiled_files, save_compiled_files

if TYPE_CHECKING:
    from ...sources.module import ModuleSpec

EXTRA_KEYS = ("fullgraph",)
_RECOMPILE_LIMIT = 64


def _mode(opts: BuildChoices) -> str:
    return opts.mode or "default"


def compile_and_run(spec: ModuleSpec, opts: BuildChoices) -> Any:
    """torch.compile the module and run the example inputs (3 times for CUDA graphs)."""
    import torch

    from ..shared.torch_private import raise_dynamo_recompile_limit

    raise_dynamo_recompile_limit(_RECOMPILE_LIMIT)
    mode = _mode(opts)
    compiled = torch.compile(
        spec.module,
        fullgraph=bool(opts.extra.get("fullgraph", False)),
        dynamic=None if spec.dynamic else False,
        mode=None if mode == "default" else mode,
    )
    for t, dims in zip(spec.example_inputs, spec.dynamic, strict=False):
        for d, (lo, hi) in dims.items():
            torch._dynamo.mark_dynamic(t, d, min=lo, max=hi)
    with torch.no_grad():
        for _ in range(3 if mode == "reduce-overhead" else 1):
            compiled(*spec.example_inputs)
    if is_cuda(spec.device):
        torch.cuda.synchronize(spec.device)
    return compiled


class InductorModuleBackend:
    name = "inductor"
    weights_in_artifact = False

    def check_options(self, opts: BuildChoices) -> None:
        mode = _mode(opts)
        if mode not in MODES:
            raise BackendError(f"unknown inductor mode {mode!r}: choose one of {', '.join(MODES)}")
        if mode == "reduce-overhead" and not is_cuda(opts.device):
            raise BackendError("mode reduce-overhead uses CUDA graphs and needs a cuda device")
        no_extra(self.name, opts, EXTRA_KEYS)

    def factors(self, spec: ModuleSpec, opts: BuildChoices) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "dtype": opts.dtype,
            "device": device_type(opts.device),
            "mode": _mode(opts),
            "fullgraph": bool(opts.extra.get("fullgraph", False)),
            "dynamic": bool(spec.dynamic),
        }

    def build(
        self, spec: ModuleSpec, opts: BuildChoices, workdir: Path, memo_dir: Path | None = None
    ) -> dict[str, Any]:
        import torch

        from ..shared.torch_private import (
            forget_inductor_process_caches,
            fresh_cache_artifact_manager,
            fresh_inductor_cache,
        )

        flat, tree = reference_run(spec)
        t0 = time.perf_counter()
        with fresh_inductor_cache(), fresh_cache_artifact_manager(), inductor_tuning_results_kept():
            torch.compiler.reset()
            forget_inductor_process_caches()
            compile_and_run(spec, opts)
            saved = torch.compiler.save_cache_artifacts()
            if saved is None:
                raise BackendError(
                    "torch.compile produced no cache artifacts (are Inductor's caches disabled, "
                    "e.g. TORCHINDUCTOR_FORCE_DISABLE_CACHES=1?)"
                )
            data, info = saved
            kernels = save_compiled_files(workdir / KERNELS, device_index(opts.device))
        torch.compiler.reset()  # load() compiles its own from the Mega-Cache
        (workdir / MEGACACHE).write_bytes(data)
        meta = {
            "format": FORMAT,
            "mode": _mode(opts),
            "megacache_bytes": len(data),
            "cache_artifacts": {k: len(v) for k, v in info.artifacts.items()},
            "kernels": kernels,
            "outputs": len(flat),
            "output_tree": tree,
            "compile_seconds": round(time.perf_counter() - t0, 3),
        }
        write_record(workdir, meta)
        return meta

    def load(
        self, spec: ModuleSpec, opts: BuildChoices, entry_dir: Path, meta: dict[str, Any],
        phases: dict[str, float],
    ) -> Callable[..., Any]:  # fmt: skip
        import torch

        require_files(entry_dir, MEGACACHE)
        phases["weights_ready"] = time.perf_counter()  # the caller's module holds them
        with inductor_tuning_results_kept():
            install_compiled_files(entry_dir / KERNELS, device_index(opts.device))
            torch.compiler.load_cache_artifacts((entry_dir / MEGACACHE).read_bytes())
            phases["cache_loaded"] = time.perf_counter()
            compiled = compile_and_run(spec, opts)
        phases["artifact_ready"] = time.perf_counter()

        def run(*args: Any) -> Any:
            with torch.no_grad():
                return compiled(*args)

        return run


MODULE_BACKEND = InductorModuleBackend()
