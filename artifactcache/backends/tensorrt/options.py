"""What the user asks of the trt backend: its mode (onnx unless told), its --extra options,
the precision plan.

Precision. TensorRT 11 removed weak typing and the FP16/BF16/INT8/FP8 builder
flags; 10.12+ deprecates them. So the default is a strongly typed network whose
precision comes from the export's dtype (fp32/fp16/bf16). ``--extra typing=weak``
(TensorRT 10 only) exports fp32 and sets the reduced-precision builder flag
instead. int8/fp8 need explicit quantization (Q/DQ nodes in the ONNX graph); our
exports have none, so they are refused with that reason rather than silently
building an fp32 engine.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...choices import BuildChoices
from ...errors import BackendError

# The default first: plain TensorRT (ONNX -> engine), for every recipe and module. "llm"
# (TensorRT-LLM) is asked for by name; it lasts as long as a TensorRT-LLM with engines
# installs (llm.engine_backend_problem()).
MODES = ("onnx", "llm")
DEFAULT_MODE = "onnx"
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


def resolve_mode(opts: BuildChoices) -> str:
    """The mode a build runs in; what the key records, so no --mode, --mode default and
    --mode onnx are one entry."""
    mode = opts.mode or DEFAULT_MODE
    if mode == "default":
        mode = DEFAULT_MODE
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


def engine_options(opts: BuildChoices) -> EngineOptions:
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
