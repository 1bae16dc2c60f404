"""The trt Backend: availability, option checks, key factors, dispatch to the two modes.

Modes:
  ``--mode onnx`` (the default, for every recipe; needs ``tensorrt`` only): the shared
      ONNX export (backends/onnx/export.py) goes through TensorRT's ONNX parser and
      builder into one serialized engine with the KV cache as engine I/O and two
      optimization profiles, prefill and decode (loader.py, run by runner.py).
  ``--mode llm`` (asked for by name; needs TensorRT-LLM < 1.3 as well): TensorRT-LLM's
      LLM API builds the engine directory from a Hugging Face checkpoint written from
      the recipe's model (llm.py). It stays while a TensorRT-LLM with engines installs.

The key records the resolved mode (options.resolve_mode), so no --mode and --mode onnx
are one entry.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from ...choices import BuildChoices
from ...devices import is_cuda
from ...errors import BackendError
from ...extras import TRT_HINT, TRTLLM_HINT, install_hint
from ...keys import package_version, toolchain_fingerprint
from ..base import BuildContext, Dependency
from ..shared.model_options import check_quant, check_recipe_options
from .options import LLM_DTYPES, engine_options, precision_plan, resolve_mode
from .util import trt_major

FORMAT = 1
ENGINE_FILE = "model.plan"
ENGINE_DIR = "engine"  # TensorRT-LLM's engine directory inside the entry

TRT_MISSING = f"tensorrt not importable: {TRT_HINT}"
TRT_MISSING_LLM = (
    f"tensorrt not importable: {TRTLLM_HINT} (--mode llm; the default needs only tensorrt)"
)
TRTLLM_MISSING = (
    f"tensorrt_llm not importable: {install_hint('trt-llm')} for --mode llm, "
    "or drop --mode llm (the default, --mode onnx, needs only tensorrt)"
)


def _importable(name: str) -> bool:
    return importlib.util.find_spec(name) is not None


class TrtBackend:
    name = "trt"
    weights_external = False

    def available(self, opts: BuildChoices) -> tuple[bool, str]:
        try:
            mode = resolve_mode(opts)
        except BackendError as e:
            return False, str(e)
        if mode == "llm":
            from .llm import engine_backend_problem

            # First: TensorRT-LLM 1.3+ no longer brings tensorrt, and the fix is its own.
            problem = engine_backend_problem()
            if problem:
                return False, problem
        if not _importable("tensorrt"):
            return False, TRT_MISSING_LLM if mode == "llm" else TRT_MISSING
        if mode == "llm" and not _importable("tensorrt_llm"):
            return False, TRTLLM_MISSING
        if not is_cuda(opts.device):
            return False, "TensorRT runs on NVIDIA GPUs: use --device cuda"
        return True, ""

    def check_options(self, opts: BuildChoices) -> None:
        check_quant(self.name, opts)
        mode = resolve_mode(opts)
        eo = engine_options(opts)
        if mode == "llm":
            if opts.dtype not in LLM_DTYPES:
                raise BackendError(
                    f"backend 'trt' (TensorRT-LLM) supports dtype {', '.join(LLM_DTYPES)}, "
                    f"not {opts.dtype!r}"
                )
            if eo.typing != "strong" or "opset" in opts.extra or "exporter" in opts.extra:
                raise BackendError("typing/opset/exporter apply to --mode onnx only")
        else:
            # acache's own exports carry no Q/DQ nodes, so int8/fp8 fail here, before any work.
            precision_plan(opts.dtype, trt_major(package_version("tensorrt")), eo.typing, False)

    def check_recipe(self, recipe: Any, opts: BuildChoices) -> None:
        check_recipe_options(self.name, recipe, opts)

    def factors(self, recipe: Any, opts: BuildChoices) -> dict[str, Any]:
        mode = resolve_mode(opts)
        out: dict[str, Any] = {"format": FORMAT, "mode": mode, "dtype": opts.dtype}
        if mode == "llm":
            from .llm import build_config_kwargs

            out["build_config"] = build_config_kwargs(recipe, opts)
            out["allow_host_code"] = engine_options(opts).allow_host_code
            return out
        from ..onnx.export import export_spec, export_toolchain

        eo = engine_options(opts)
        plan = precision_plan(opts.dtype, trt_major(package_version("tensorrt")), eo.typing, True)
        out.update(eo.factors())
        out["export"] = {
            **export_spec(opts, plan.export_dtype).factors(),
            "toolchain": export_toolchain(),
        }
        from .loader import profiles_for

        out["profiles"] = [
            {k: [list(s) for s in v] for k, v in p.items()} for p in profiles_for(recipe)
        ]
        return out

    def toolchain(self, opts: BuildChoices) -> dict[str, Any]:
        pkgs = ["torch", "tensorrt"]
        mode = resolve_mode(opts)
        if mode == "llm":
            pkgs.append("tensorrt_llm")
        out = toolchain_fingerprint(pkgs)
        if mode == "onnx" and engine_options(opts).allow_host_code and out.get("tensorrt"):
            # A version-compatible engine runs on later TensorRT versions: keyed by the
            # major only, so an upgrade within it finds the entry (compat_problem decides).
            out["tensorrt"] = f"{trt_major(out['tensorrt'])}.x (version-compatible)"
        return out

    def dependencies(self, ctx: BuildContext, weights: str, *, for_load: bool) -> list[Dependency]:
        # An engine needs nothing but itself at load; only a --mode onnx build reads others.
        if for_load or resolve_mode(ctx.opts) == "llm":
            return []
        from .loader import step_dependencies

        return step_dependencies(ctx, weights)

    def build(self, ctx: BuildContext, workdir: Path) -> dict[str, Any]:
        if resolve_mode(ctx.opts) == "llm":
            from .llm import build_llm_engine

            return build_llm_engine(ctx, workdir / ENGINE_DIR)
        from .loader import build_step_engine

        return build_step_engine(ctx, workdir / ENGINE_FILE)

    def load(self, ctx: BuildContext, entry_dir: Path, meta: dict[str, Any]) -> Any:
        if resolve_mode(ctx.opts) == "llm":
            from .llm import load_llm_runner

            return load_llm_runner(ctx, entry_dir / ENGINE_DIR, meta)
        from .runner import load_step_runner

        return load_step_runner(ctx, entry_dir / ENGINE_FILE, meta)


BACKEND = TrtBackend()
