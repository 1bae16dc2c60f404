"""aoti for any module: one weight-stripped AOTInductor library, the module's own tensors.

Build: ``torch.export`` of ``module(*example_inputs)`` (with the dynamic
dimensions, if any) and ``aoti_compile_and_package`` with
``package_constants_in_so=False``, unpacked into the entry as the LLM aoti
backend does (aoti.py). Constants that are not the module's parameters or buffers
(tensors export lifted from plain attributes) are small and are saved beside the
library in ``constants.safetensors``.

Load: ``AOTIModelContainerRunner`` on the entry's .so, its constants pointed at
the caller's module tensors with ``user_managed=True`` (no copy): no export, no
Inductor import, nothing compiled. The artifact holds no weights, so the key has
none: one build serves every set of weights of that architecture.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...choices import BuildChoices
from ...devices import device_type
from ...errors import BackendError
from ...store.entry import entry_file
from ..shared.any_module import (
    FORMAT,
    export_dynamic_shapes,
    reference_run,
    require_files,
    write_record,
)
from ..shared.cpu_isa import isa_verdicts_kept
from ..shared.cxx import build_record, check_runtime
from .backend import MODES, inductor_configs, safe_extract, share_constants

if TYPE_CHECKING:
    from ...sources.module import ModuleSpec

STEP = "module"
CONSTANTS = "constants.safetensors"


class AotiModuleBackend:
    name = "aoti"
    weights_in_artifact = False

    def check_options(self, opts: BuildChoices) -> None:
        mode = opts.mode or "default"
        if mode not in MODES:
            raise BackendError(f"unknown aoti mode {mode!r}: choose one of {', '.join(MODES)}")
        if opts.extra:
            raise BackendError(f"backend 'aoti' takes no extra options (got {sorted(opts.extra)})")

    def factors(self, spec: ModuleSpec, opts: BuildChoices) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "dtype": opts.dtype,
            "device": device_type(opts.device),
            "mode": opts.mode or "default",
            "constants": "user-managed",
        }

    def build(
        self, spec: ModuleSpec, opts: BuildChoices, workdir: Path, memo_dir: Path | None = None
    ) -> dict[str, Any]:
        import torch

        from ..shared.torch_private import (
            declare_int_arrays_at_each_use,
            inductor_config_kept,
            release_export_state,
        )

        flat, tree = reference_run(spec)
        cfg = inductor_configs(opts, memo_dir)  # the compiler probe's verdicts kept
        scratch = workdir / ".pt2"
        scratch.mkdir()
        t0 = time.perf_counter()
        declare_int_arrays_at_each_use()
        with torch.no_grad(), inductor_config_kept():
            ep = torch.export.export(
                spec.module, spec.example_inputs, dynamic_shapes=export_dynamic_shapes(spec),
                strict=False,
            )  # fmt: skip
            t_export = time.perf_counter() - t0
            with isa_verdicts_kept(memo_dir):  # no child Python per ISA candidate
                pkg = torch._inductor.aoti_compile_and_package(
                    ep, package_path=str(scratch / f"{STEP}.pt2"), inductor_configs=cfg
                )
        names = safe_extract(Path(pkg), workdir)
        sos = [n for n in names if n.endswith(".so")]
        if len(sos) != 1:
            raise BackendError(f"the AOTInductor package holds .so files {sos}, expected one")
        state = _module_state(spec.module)
        lifted = {k: v for k, v in ep.constants.items() if k not in state and _is_tensor(v)}
        if lifted:
            from safetensors.torch import save_file

            save_file({k: v.detach().cpu().contiguous() for k, v in lifted.items()},
                      str(workdir / CONSTANTS))  # fmt: skip
        shutil.rmtree(scratch)
        del ep
        release_export_state()
        meta = {
            "format": FORMAT,
            "library": sos[0],
            "output_tree": tree,
            "outputs": len(flat),
            "lifted_constants": sorted(lifted),
            "compile_seconds": {
                "export": round(t_export, 3),
                "total": round(time.perf_counter() - t0, 3),
            },
            "weights": "external (user-managed constants)",
            **build_record(cfg.get("cpp.cxx"), memo_dir),
        }
        write_record(workdir, meta)
        return meta

    def load(
        self, spec: ModuleSpec, opts: BuildChoices, entry_dir: Path, meta: dict[str, Any],
        phases: dict[str, float],
    ) -> Callable[..., Any]:  # fmt: skip
        import torch

        from ..shared.torch_private import aoti_container_runner, rebuild_output

        if not meta.get("library"):
            require_files(entry_dir, "<library>")  # the one-line "rebuild it" error
        # The manifest names the library: never dlopen anything outside the verified entry.
        lib = entry_file(entry_dir, meta["library"])
        dev = torch.device(spec.device)
        if dev.type == "cuda":
            torch.zeros(1, device=dev)  # a CUDA context before the .so loads (aoti.py)
        check_runtime(meta)  # before dlopen: a C++ runtime mismatch segfaults
        state = _module_state(spec.module)
        if meta.get("lifted_constants"):
            from safetensors.torch import load_file

            require_files(entry_dir, CONSTANTS)
            state.update({k: v.to(dev) for k, v in load_file(str(entry_dir / CONSTANTS)).items()})
        phases["weights_ready"] = time.perf_counter()
        runner = aoti_container_runner(lib, dev)
        share_constants(runner, state, STEP)
        tree = meta["output_tree"]
        phases["artifact_ready"] = time.perf_counter()

        def run(*args: Any) -> Any:
            # Keeps state alive: the runner holds pointers into these tensors.
            _ = state
            return rebuild_output(runner.run(list(args)), tree)

        return run


def _module_state(module: Any) -> dict[str, Any]:
    state = dict(module.named_parameters(remove_duplicate=False))
    state.update(dict(module.named_buffers(remove_duplicate=False)))
    return state


def _is_tensor(v: Any) -> bool:
    import torch

    return isinstance(v, torch.Tensor)


MODULE_BACKEND = AotiModuleBackend()
