"""trt: TensorRT engines, and TensorRT-LLM for LLM recipes.

UNVERIFIED: this backend is written to NVIDIA's documented Python APIs
(TensorRT 10.x/11.x, the TensorRT-LLM LLM API), but TensorRT cannot be installed
on any machine this project has, so no engine has been built or run by this code
in this repository's CI or benchmarks. What is tested here is everything around
the TensorRT calls: option checks, precision plans, optimization profiles, key
and timing-cache factors, plan-header and manifest compatibility checks.

Modes:
  ``--mode llm`` (the default; every recipe we have is an LLM): TensorRT-LLM's LLM
      API builds the engine directory from a Hugging Face checkpoint written from
      the recipe's model (backends/trt_llm.py).
  ``--mode onnx``: the shared ONNX export (backends/onnx_export.py) goes through
      TensorRT's ONNX parser and builder into one serialized engine with two
      optimization profiles, prefill and decode (backends/trt_engine.py). The same
      path builds an engine from any ONNX file (``trt_engine.build_engine``).

Precision. TensorRT 11 removed weak typing and the FP16/BF16/INT8/FP8 builder
flags; 10.12+ deprecates them. So the default is a strongly typed network whose
precision comes from the export's dtype (fp32/fp16/bf16). ``--extra typing=weak``
(TensorRT 10 only) exports fp32 and sets the reduced-precision builder flag
instead. int8/fp8 need explicit quantization (Q/DQ nodes in the ONNX graph); our
exports have none, so they are refused with that reason rather than silently
building an fp32 engine.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import BackendError, StaleArtifact
from ..keys import make_factors, package_version, toolchain_fingerprint
from .base import INSTALL_HINTS, BuildContext, BuildOptions

if TYPE_CHECKING:
    from ..recipes import Recipe

FORMAT = 1
MODES = ("llm", "onnx")
ONNX_DTYPES = ("fp32", "fp16", "bf16", "int8", "fp8")
LLM_DTYPES = ("fp32", "fp16", "bf16")
TYPINGS = ("strong", "weak")
EXTRA_KEYS = (
    "typing",
    "opt_level",
    "workspace_mb",
    "allow_host_code",
    "timing_cache",
    "opset",
    "exporter",
)
DEFAULT_OPT_LEVEL = 3  # TensorRT's own default builder optimization level
ENGINE_FILE = "model.plan"
ENGINE_DIR = "engine"  # TensorRT-LLM's engine directory inside the entry

TRT_MISSING = f"tensorrt not importable: {INSTALL_HINTS['trt']}"
TRTLLM_MISSING = "tensorrt_llm not importable: pip install 'artifactcache[trtllm]'"


class EngineIncompatible(StaleArtifact):
    """A cached engine cannot run on this runtime: a miss, with the reason."""


# ---------------------------------------------------------------- options --


def resolve_mode(opts: BuildOptions) -> str:
    mode = opts.mode or "llm"
    if mode == "default":
        mode = "llm"
    if mode not in MODES:
        raise BackendError(f"backend 'trt' has modes {', '.join(MODES)} (got --mode {mode})")
    return mode


@dataclass(frozen=True)
class EngineOptions:
    typing: str = "strong"
    opt_level: int = DEFAULT_OPT_LEVEL
    workspace_mb: int | None = None
    allow_host_code: bool = False
    timing_cache: bool = True

    def factors(self) -> dict[str, Any]:
        return {
            "typing": self.typing,
            "opt_level": self.opt_level,
            "workspace_mb": self.workspace_mb,
            "allow_host_code": self.allow_host_code,
        }


def _as_bool(name: str, v: Any) -> bool:
    if isinstance(v, bool):
        return v
    if str(v).lower() in ("1", "true", "yes", "on"):
        return True
    if str(v).lower() in ("0", "false", "no", "off"):
        return False
    raise BackendError(f"{name} must be true or false, got {v!r}")


def engine_options(opts: BuildOptions) -> EngineOptions:
    """Validated --extra options of the ONNX engine path (one-line BackendError otherwise)."""
    ex = opts.extra
    unknown = sorted(set(ex) - set(EXTRA_KEYS))
    if unknown:
        raise BackendError(
            f"backend 'trt' does not take {unknown}: its options are {', '.join(EXTRA_KEYS)}"
        )
    typing = str(ex.get("typing", "strong"))
    if typing not in TYPINGS:
        raise BackendError(f"typing must be strong or weak, got {typing!r}")
    try:
        level = int(ex.get("opt_level", DEFAULT_OPT_LEVEL))
    except (TypeError, ValueError):
        raise BackendError(f"opt_level must be an integer 0-5, got {ex['opt_level']!r}") from None
    if not 0 <= level <= 5:
        raise BackendError(f"opt_level must be 0-5 (TensorRT builder levels), got {level}")
    ws = ex.get("workspace_mb")
    if ws is not None:
        try:
            ws = int(ws)
        except (TypeError, ValueError):
            raise BackendError(f"workspace_mb must be a positive integer, got {ws!r}") from None
        if ws <= 0:
            raise BackendError(f"workspace_mb must be a positive integer, got {ws}")
    return EngineOptions(
        typing=typing,
        opt_level=level,
        workspace_mb=ws,
        allow_host_code=_as_bool("allow_host_code", ex.get("allow_host_code", False)),
        timing_cache=_as_bool("timing_cache", ex.get("timing_cache", True)),
    )


# -------------------------------------------------------------- precision --


@dataclass(frozen=True)
class PrecisionPlan:
    strongly_typed: bool
    builder_flags: tuple[str, ...]  # names in tensorrt.BuilderFlag
    export_dtype: str  # the dtype the ONNX graph is exported in


_WEAK_FLAGS = {"fp32": (), "fp16": ("FP16",), "bf16": ("BF16",), "int8": ("INT8",), "fp8": ("FP8",)}


def precision_plan(precision: str, trt_major: int, typing: str, has_qdq: bool) -> PrecisionPlan:
    """How a precision is asked of TensorRT ``trt_major``; BackendError when it cannot be."""
    if precision not in ONNX_DTYPES:
        raise BackendError(
            f"backend 'trt' supports dtype {', '.join(ONNX_DTYPES)}, not {precision!r}"
        )
    quantized = precision in ("int8", "fp8")
    if quantized and not has_qdq:
        raise BackendError(
            f"{precision} needs an explicitly quantized ONNX graph (QuantizeLinear/"
            "DequantizeLinear nodes, e.g. from NVIDIA ModelOpt); the acache export has none: "
            "use fp16 or bf16"
        )
    if typing == "weak":
        if trt_major >= 11:
            raise BackendError(
                f"TensorRT {trt_major} removed weakly typed networks: drop typing=weak"
            )
        # Weak typing: the graph stays fp32 and the flag lets TensorRT pick lower precision.
        return PrecisionPlan(False, _WEAK_FLAGS[precision], "fp32")
    # Strong typing: tensor types come from the graph; builder precision flags are not allowed.
    export = "fp32" if quantized else precision
    return PrecisionPlan(True, (), export)


def trt_major(version: str | None) -> int:
    try:
        return int(str(version).split(".")[0])
    except ValueError:
        return 0


# --------------------------------------------------------------- profiles --


def profiles_for(recipe: Recipe) -> list[dict[str, tuple[tuple[int, ...], ...]]]:
    """Optimization profiles over the step graph's dynamic inputs: (min, opt, max) shapes.

    Profile 0 serves prefill (1..prefill_len tokens, tuned for prefill_len, which is
    what the runner always sends); profile 1 serves decode (exactly one token). The
    KV-cache inputs are static [n_layers, max_batch, n_kv_heads, max_seq_len, head_dim]
    and need no profile entry.
    """
    p, b = recipe.shapes.prefill_len, recipe.shapes.max_batch
    prefill = {
        "input_ids": ((1, 1), (b, p), (b, p)),
        "input_pos": ((1,), (p,), (p,)),
    }
    decode = {"input_ids": ((1, 1), (1, 1), (1, 1)), "input_pos": ((1,), (1,), (1,))}
    return [prefill, decode]


def profile_for_tokens(recipe: Recipe, n_tokens: int) -> int:
    """The profile index that serves a step of n_tokens (ShapeError outside every profile)."""
    from ..errors import ShapeError

    if n_tokens == 1:
        return 1
    if 1 <= n_tokens <= recipe.shapes.prefill_len:
        return 0
    raise ShapeError(
        f"a step of {n_tokens} tokens is outside the engine's profiles "
        f"(1..{recipe.shapes.prefill_len}); raise [shapes].prefill_len in "
        f"{recipe.source or recipe.name} and rebuild"
    )


# -------------------------------------------- plan header and compatibility --

# TensorRT does not document its plan layout. The one public statement is an NVIDIA
# engineer's comment on NVIDIA/TensorRT issue #3073 (2023): the TensorRT major, minor
# and patch version are the bytes at offsets 24, 25 and 26 of a serialized engine.
# It is observed, not an API, so it is only a cross-check of the manifest: a header
# that does not parse is "unknown", never a reason to reject an engine.
PLAN_VERSION_OFFSET = 24
PLAN_HEADER_BYTES = 32


def plan_header_version(head: bytes) -> tuple[int, int, int] | None:
    if len(head) < PLAN_VERSION_OFFSET + 3:
        return None
    major, minor, patch = head[PLAN_VERSION_OFFSET : PLAN_VERSION_OFFSET + 3]
    if not 8 <= major <= 99:  # no TensorRT that writes this layout is older than 8
        return None
    return (major, minor, patch)


def _vtuple(version: str | None, n: int = 3) -> tuple[int, ...] | None:
    try:
        return tuple(int(x) for x in str(version).split(".")[:n])
    except ValueError:
        return None


def compat_problem(
    meta: dict[str, Any],
    runtime_version: str,
    runtime_cc: str | None,
    head: bytes | None = None,
) -> str | None:
    """Why a cached engine cannot run here (None when it can), from the manifest and header.

    Engines are tied to the exact TensorRT version and the GPU's compute capability
    unless built version- or hardware-compatible, which acache does not do.
    """
    built = meta.get("tensorrt")
    if built is None:
        return "the entry records no TensorRT version: rebuild it with --force"
    if _vtuple(built) != _vtuple(runtime_version):
        return f"engine built with TensorRT {built}, this runtime is TensorRT {runtime_version}"
    cc = meta.get("compute_capability")
    if runtime_cc is not None and cc != runtime_cc:
        return f"engine built for compute capability {cc}, this GPU is {runtime_cc}"
    if head is not None:
        hv = plan_header_version(head)
        if hv is not None and hv != _vtuple(built):
            return (
                f"the plan header says TensorRT {'.'.join(map(str, hv))} but the manifest "
                f"says {built}: the entry is inconsistent, rebuild it with --force"
            )
    return None


# ------------------------------------------------------------ timing cache --


def timing_cache_factors(
    gpu: str, compute_capability: str, trt_version: str, plan: PrecisionPlan, eo: EngineOptions
) -> dict[str, Any]:
    """Key factors of the shared timing cache: the GPU, TensorRT, and flags that change tactics.

    No recipe and no weights: timings are per layer configuration, so every model
    built on this GPU with this TensorRT and these flags shares (and grows) one cache.
    """
    return make_factors(
        recipe={},
        weights="none",
        backend="trt-timing-cache",
        options={
            "strongly_typed": plan.strongly_typed,
            "builder_flags": sorted(plan.builder_flags),
            "opt_level": eo.opt_level,
        },
        toolchain={"tensorrt": trt_version},
        hardware={"gpu": gpu, "compute_capability": compute_capability},
    )


# ---------------------------------------------------------------- backend --


def _importable(name: str) -> bool:
    return importlib.util.find_spec(name) is not None


class TrtBackend:
    name = "trt"
    weights_external = False

    def available(self, opts: BuildOptions) -> tuple[bool, str]:
        if not _importable("tensorrt"):
            return False, TRT_MISSING
        try:
            mode = resolve_mode(opts)
        except BackendError as e:
            return False, str(e)
        if mode == "llm" and not _importable("tensorrt_llm"):
            return False, TRTLLM_MISSING
        if not opts.device.startswith("cuda"):
            return False, "TensorRT runs on NVIDIA GPUs: use --device cuda"
        return True, ""

    def check_options(self, opts: BuildOptions) -> None:
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

    def factors(self, recipe: Any, opts: BuildOptions) -> dict[str, Any]:
        mode = resolve_mode(opts)
        out: dict[str, Any] = {"format": FORMAT, "mode": mode, "dtype": opts.dtype}
        if mode == "llm":
            from .trt_llm import build_config_kwargs

            out["build_config"] = build_config_kwargs(recipe, opts)
            out["allow_host_code"] = engine_options(opts).allow_host_code
            return out
        from .onnx_export import export_spec, export_toolchain

        eo = engine_options(opts)
        plan = precision_plan(opts.dtype, trt_major(package_version("tensorrt")), eo.typing, True)
        out.update(eo.factors())
        out["export"] = {
            **export_spec(opts, plan.export_dtype).factors(),
            "toolchain": export_toolchain(),
        }
        out["profiles"] = [
            {k: [list(s) for s in v] for k, v in p.items()} for p in profiles_for(recipe)
        ]
        return out

    def toolchain(self, opts: BuildOptions) -> dict[str, Any]:
        pkgs = ["torch", "tensorrt"]
        if resolve_mode(opts) == "llm":
            pkgs.append("tensorrt_llm")
        return toolchain_fingerprint(pkgs)

    def build(self, ctx: BuildContext, workdir: Path) -> dict[str, Any]:
        if resolve_mode(ctx.opts) == "llm":
            from .trt_llm import build_llm_engine

            return build_llm_engine(ctx, workdir / ENGINE_DIR)
        from .trt_engine import build_step_engine

        return build_step_engine(ctx, workdir / ENGINE_FILE)

    def load(self, ctx: BuildContext, entry_dir: Path, meta: dict[str, Any]) -> Any:
        if resolve_mode(ctx.opts) == "llm":
            from .trt_llm import load_llm_runner

            return load_llm_runner(ctx, entry_dir / ENGINE_DIR, meta)
        from .trt_engine import load_step_runner

        return load_step_runner(ctx, entry_dir / ENGINE_FILE, meta)


def export_spec_for(opts: BuildOptions):
    """The ONNX export --mode onnx uses: the same spec (and key) as ort for the same dtype."""
    from .onnx_export import export_spec

    eo = engine_options(opts)
    plan = precision_plan(opts.dtype, trt_major(package_version("tensorrt")), eo.typing, True)
    return export_spec(opts, plan.export_dtype)


BACKEND = TrtBackend()
