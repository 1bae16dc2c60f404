"""What is done to a recipe's model once its weights are in: fused projections, int8 weights.

Both belong to the backends that run acache's own torch model (eager, inductor, aoti),
all three through ``runner.build_model_for``; the surgery itself is models/fuse.py and
models/quant.py. Torch-free: the CLI's checks and the key cost no torch import.

- ``--extra fuse_projections=0|1``: q/k/v become one ``qkv_proj`` and gate/up one
  ``gate_up_proj`` (llama, mistral, qwen2, qwen3); phi-2's q/k/v/fc1 become one
  ``in_proj`` and its dense/fc2 one ``out_proj`` (models/phi2.py). On by default for
  CUDA builds of inductor and aoti, where one wide GEMV reads the weights faster than
  several narrow ones (docs/perf-notes.md); off elsewhere, so the eager baseline keeps
  the checkpoint's layout. Phi-3 checkpoints are fused already.
- ``--extra split_kv_decode=0|1``: decode attends through acache's split-KV Triton
  kernel (models/decode_attention.py), which reads only the filled positions of a
  static cache, so the decode step is static (one CUDA graph) at any context length.
  On by default for CUDA builds of inductor and aoti at every context: at the seed's 256
  slots it decoded llama-7b 1.8-2.6%, phi-3-mini 3.5% and phi-2 3.2% faster than SDPA's
  static step (docs/perf-notes.md, attempts 54 and 67). CUDA only. Off, decode reads the
  cache by length bucket through SDPA (artifactcache/kv_buckets.py); at 256 or less that
  is one bucket, a static step.
- ``--extra split_kv_rope=0|1``: with split-KV decode, the kernel also rotates q and
  k and writes the new key and value into the cache (``decode_attention_rope``), where
  torch's rotations and cache writes take two more kernels a layer. On by default for
  phi-2's one-row builds (inductor and aoti, max_batch 1): its inductor build decoded
  1.049x its SDPA step and 1.016x split-KV alone on an H100 (429.4 against 409.3 and
  422.5 tok/s), aoti 1.048x with no build cost seen (docs/perf-notes.md, attempt 67);
  batched phi-2 is not measured with it. On by default too where the prefetch's default
  applies (``_prefetch_measured``: phi-3's unquantized one-row inductor builds), the
  form the prefetch gained in; asking ``attention_prefetch=0`` there keeps the rope, and
  on a GPU before sm_90 (no prefetch) the rope runs alone. Off by default elsewhere: an
  inductor build with it cannot have layer regions (inductor/options.py), which the
  llama families have by default, and against those the rope alone decoded phi-3-mini
  1.005x (attempt 67), within the noise, for a build 9-15 s longer; phi-3's aoti and
  quantized builds are not measured with it. Asking for it without split-KV decode is one line.
- ``--extra row_gemv=0|1``: a one-row step (decode at batch 1, a first pass's last
  row) runs each projection as acache's GEMV (models/gemv.py) with the norm,
  SiLU-and-mul or GELU and skip connection around it folded in: four kernels a llama
  block, two a fused phi-2 block (three where quantization keeps dense and fc2 apart).
  It runs for the llama families (llama, mistral, qwen2, qwen3, phi-3) and phi-2 at one
  row (max_batch 1) with fused projections, unquantized, int8wo or int4wo (reading
  int4wo's plain nibbles and group scales where tinygemm would run); it refuses unfused
  projections and batched builds (whose steps are never one row). On by default for CUDA
  builds of inductor and aoti where it measured faster than Inductor's own kernels
  (docs/benchmarks.md, "The row GEMV", "phi-2 through the row GEMV" and "The row GEMV
  for the llama families"): phi-3, bf16 phi-2 (inductor 8.6% faster on an H100, 410.3
  against 377.7 tok/s; aoti 409.5; its LayerNorm and GELU kernels folded away; its
  inductor build 1-14 s longer, in the decode step's compile), llama (llama-7b 1.037x,
  llama-3-8b 1.104x on an H100, inductor, bf16; the latter against a default build at
  the slow end of Inductor's tuning spread; docs/perf-notes.md attempt 73) and
  mistral (whose blocks are llama-3-8b's shapes and whose LM head is llama-7b's; not
  measured as a model), and every int8wo build but phi-2's (unmeasured there). Off by
  default for bf16 qwen2 and qwen3 (not measured). Off by default for int4wo:
  tinygemm decoded llama-7b 16% faster than the row GEMV's int4 path on an H100
  (docs/benchmarks.md, "Quantized decode and the int4 kernels"; ``--extra row_gemv=1``
  asks for it).
- ``--extra cudnn_prefill=0|1``: whether a prompt pass's attention (prefill and
  extend, T > 1) may run cuDNN's SDPA kernel, torch's first choice on Hopper. cuDNN
  builds an execution graph on the host for each call shape it has not seen in that
  thread, and a pass's shape changes with the prompt's length, so every new length
  (and a warm process's first request) would pay a build. Off by default on CUDA for
  eager, inductor and aoti: a half-precision first pass without a mask runs SDPA's
  flash kernel, every other pass (a window's mask, fp32, a pass over the cache) its
  memory-efficient one. Decode's one query keeps torch's choice: its shapes are few and
  captured at load. No effect on CPU.
- ``--extra attention_prefetch=MiB``: with split-KV decode, the decode kernel pulls
  the first MiB of the projection after attention (o_proj; phi-2's out-projection) into
  the GPU's L2 while it attends, a step bound by latency in which DRAM idles
  (models/decode_attention.py; Hopper's bulk prefetch, so sm_90 and later: other GPUs
  build the same model and prefetch nothing). 0 (none) to ATTENTION_PREFETCH_MAX_MIB.
  The default: 4 MiB for phi-2's and phi-3's (measured on phi-3-mini) unquantized
  one-row inductor builds, with the rope inside the split-KV kernel (``split_kv_rope``,
  on with it): phi-2 decoded 1.014x as fast as without it on an H100 (456.7 against 450.5 tok/s;
  docs/perf-notes.md attempt 71), phi-3-mini 1.0105x its plain split-KV build with
  layer regions (316.7 against 313.4 tok/s, attempt 73); 0 elsewhere: with the plain
  split-KV kernel phi-3-mini decoded 0.994x (the prefetch lengthened the short kernel
  by more than the o_proj GEMV saved), the llama families are not measured in a model,
  and aoti and quantized builds are not measured.
- ``--quant int8wo``: weight-only int8 (one scale per output channel) for every linear
  layer of the blocks; the LM head keeps the model's dtype (models/quant.py says why).
- ``--quant int4wo``: weight-only int4, a scale and zero per group of 128 input channels
  (64 or 32 where the width needs it; PyTorch's tinygemm kernel for decode); bf16 only
  on CUDA (models/quant.py).

The key records the model as built (``model_factors``): whether its projections are
fused, its quantization, its decode attention and whether one-row steps run the row GEMV.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ...devices import is_cuda
from ...errors import BackendError

if TYPE_CHECKING:
    from ...choices import BuildChoices
    from ...config import Recipe

MODEL_BACKENDS = ("eager", "inductor", "aoti")
FUSE_EXTRA = "fuse_projections"
SPLIT_KV_EXTRA = "split_kv_decode"
SPLIT_KV_ROPE_EXTRA = "split_kv_rope"
ROW_GEMV_EXTRA = "row_gemv"
CUDNN_PREFILL_EXTRA = "cudnn_prefill"
PREFETCH_EXTRA = "attention_prefetch"
FLAG_EXTRA_KEYS = (
    FUSE_EXTRA, SPLIT_KV_EXTRA, SPLIT_KV_ROPE_EXTRA, ROW_GEMV_EXTRA, CUDNN_PREFILL_EXTRA
)  # fmt: skip
MODEL_EXTRA_KEYS = (*FLAG_EXTRA_KEYS, PREFETCH_EXTRA)
# Half of an H100's or H200's 50 MB L2: more would evict what it prefetched.
ATTENTION_PREFETCH_MAX_MIB = 24
# The prefetch a one-row split-KV build makes unless asked, where it measured faster.
# Unquantized one-row builds of these families on these backends, with the rope inside
# the split-KV kernel (the form it was measured in: under the plain kernel it lost).
PREFETCH_DEFAULT_MIB = 4
PREFETCH_DEFAULT_FAMILIES = ("phi-2", "phi-3")
PREFETCH_DEFAULT_BACKENDS = ("inductor",)
# The families built of llama's block (RMSNorm, SiLU-and-mul).
LLAMA_FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "phi-3")
ROW_GEMV_FAMILIES = (*LLAMA_FAMILIES, "phi-2")
# Where the row GEMV is the default for float weights: the families it measured faster
# on (mistral's blocks are llama-3-8b's shapes, and its LM head llama-7b's).
ROW_GEMV_DEFAULT_FAMILIES = ("phi-3", "llama", "mistral")
# Where the split-KV kernel rotates and writes the cache by default, whatever the weights
# (phi-2 has no layer regions to lose); elsewhere it comes with the default prefetch.
SPLIT_KV_ROPE_DEFAULT_FAMILIES = ("phi-2",)
# Where fusing is the default on CUDA: the compiled backends. Eager stays the checkpoint's
# layout, the reference the compiled ones are held to.
FUSE_BY_DEFAULT = ("inductor", "aoti")
FUSED_FAMILIES = ("phi-3",)  # fused in the checkpoint itself
QUANT_MODES = ("int8wo", "int4wo")
# Why each backend that builds from the ONNX export refuses --quant.
QUANT_REFUSALS = {
    "ort": "ort runs the unquantized ONNX export it shares with trt, and ONNX Runtime's "
    "constant folding would turn an int8 weight's cast back into a float weight; "
    "use eager, inductor or aoti",
    "trt": "TensorRT takes int8 weights only as explicit Q/DQ nodes, which acache's ONNX "
    "export does not emit; use eager, inductor or aoti",
}


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def parse_flag(name: str, value: Any) -> bool:
    """An --extra flag's 0/1 (true/false, yes/no, on/off); anything else is one line."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    text = str(value).strip().lower()
    if text in _TRUE | _FALSE:
        return text in _TRUE
    raise BackendError(f"--extra {name}={value!r}: expected 0 or 1 (or true/false, yes/no, on/off)")


def backend_extra(opts: BuildChoices) -> dict[str, Any]:
    """The --extra options that are the backend's own (not a model option)."""
    return {k: v for k, v in opts.extra.items() if k not in MODEL_EXTRA_KEYS}


def check_quant(backend: str, opts: BuildChoices) -> None:
    """An unknown --quant, or one the backend cannot run, is one line."""
    if opts.quant is None:
        return
    if opts.quant not in QUANT_MODES:
        raise BackendError(
            f"unknown --quant {opts.quant!r}: choose {', '.join(QUANT_MODES)} "
            "(or leave it out for none)"
        )
    if backend not in MODEL_BACKENDS:
        why = QUANT_REFUSALS.get(backend, f"use {', '.join(MODEL_BACKENDS)}")
        raise BackendError(f"backend {backend!r} does not take --quant {opts.quant}: {why}")
    if opts.quant == "int4wo" and is_cuda(opts.device) and opts.dtype != "bf16":
        raise BackendError(
            f"--quant int4wo on CUDA runs PyTorch's tinygemm kernel, which takes bf16 "
            f"activations only; use --dtype bf16 (not {opts.dtype})"
        )


def check_model_options(backend: str, opts: BuildChoices) -> None:
    """What the options alone can tell (the recipe's part is ``fuse_projections``)."""
    check_quant(backend, opts)
    for name in FLAG_EXTRA_KEYS:
        if name in opts.extra:
            parse_flag(name, opts.extra[name])
    split_kv_decode(backend, opts)
    split_kv_rope(backend, opts)
    attention_prefetch_mib(backend, opts)
    cudnn_prefill(backend, opts)


def fuse_projections(backend: str, recipe: Recipe, opts: BuildChoices) -> bool:
    """Whether the model as built has fused projections; an impossible request is one line."""
    raw = opts.extra.get(FUSE_EXTRA)
    asked = None if raw is None else parse_flag(FUSE_EXTRA, raw)
    family = recipe.family
    if family in FUSED_FAMILIES:
        if asked is False:
            raise BackendError(
                f"{recipe.name}: {family} checkpoints store q/k/v and gate/up fused "
                f"(qkv_proj, gate_up_proj); --extra {FUSE_EXTRA}=0 cannot split them"
            )
        return True
    if asked is None:
        return backend in FUSE_BY_DEFAULT and is_cuda(opts.device)
    return asked


def split_kv_decode(backend: str, opts: BuildChoices, recipe: Recipe | None = None) -> bool:
    """Whether decode attends through the split-KV kernel; an impossible request is one line.

    The default: CUDA builds of inductor and aoti, at every context and batch. At 256
    slots SDPA's step is static too, but the kernel reads only the filled positions:
    7.1 against 12.5 us a layer at position 200 (docs/benchmarks.md), and the seed
    benchmark decoded llama-7b 1.8% (aoti) and 2.6% (inductor) faster, phi-3-mini 3.5%
    (docs/perf-notes.md, attempt 54), phi-2 3.2% (attempt 67).
    """
    raw = opts.extra.get(SPLIT_KV_EXTRA)
    asked = None if raw is None else parse_flag(SPLIT_KV_EXTRA, raw)
    if asked is None:
        return backend in FUSE_BY_DEFAULT and is_cuda(opts.device)
    if asked and not is_cuda(opts.device):
        raise BackendError(
            f"--extra {SPLIT_KV_EXTRA}=1 needs --device cuda: the kernel is Triton's, "
            "for NVIDIA GPUs"
        )
    if asked and backend not in MODEL_BACKENDS:
        raise BackendError(
            f"--extra {SPLIT_KV_EXTRA}=1 is for {', '.join(MODEL_BACKENDS)}; "
            f"{backend} runs the ONNX export's attention"
        )
    return asked


def split_kv_rope(backend: str, opts: BuildChoices, recipe: Recipe | None = None) -> bool:
    """Whether the split-KV kernel rotates and writes the cache too; asked for where
    decode does not run that kernel, one line. The default: on for one-row inductor and
    aoti builds of SPLIT_KV_ROPE_DEFAULT_FAMILIES (``recipe`` given, with the build's
    shapes) that decode through split-KV, and for the builds that prefetch by default
    (``_prefetch_measured``), where it was measured; off elsewhere (the module docstring
    says why)."""
    raw = opts.extra.get(SPLIT_KV_ROPE_EXTRA)
    if raw is None:
        return (
            recipe is not None
            and (
                recipe.family in SPLIT_KV_ROPE_DEFAULT_FAMILIES
                or _prefetch_measured(backend, opts, recipe)
            )
            and backend in FUSE_BY_DEFAULT
            and recipe.shapes.max_batch == 1
            and split_kv_decode(backend, opts, recipe)
        )
    if not parse_flag(SPLIT_KV_ROPE_EXTRA, raw):
        return False
    if backend not in MODEL_BACKENDS:
        raise BackendError(
            f"--extra {SPLIT_KV_ROPE_EXTRA}=1 is for {', '.join(MODEL_BACKENDS)}; "
            f"{backend} runs the ONNX export's attention"
        )
    if not split_kv_decode(backend, opts, recipe):
        raise BackendError(
            f"--extra {SPLIT_KV_ROPE_EXTRA}=1 runs inside the split-KV decode kernel, "
            f"which this build does not use: add --extra {SPLIT_KV_EXTRA}=1"
        )
    return True


def _prefetch_measured(backend: str, opts: BuildChoices, recipe: Recipe | None) -> bool:
    """Unquantized one-row builds of PREFETCH_DEFAULT_FAMILIES on PREFETCH_DEFAULT_BACKENDS:
    where the prefetch measured faster (in bf16; other float dtypes are not measured)."""
    return (
        recipe is not None
        and recipe.family in PREFETCH_DEFAULT_FAMILIES
        and backend in PREFETCH_DEFAULT_BACKENDS
        and recipe.shapes.max_batch == 1
        and opts.quant is None
    )


def attention_prefetch_mib(backend: str, opts: BuildChoices, recipe: Recipe | None = None) -> int:
    """MiB of the projection after attention that a decode step prefetches into L2;
    a value out of range, or asked for where decode does not run the split-KV kernel,
    is one line. The default (``recipe`` given): PREFETCH_DEFAULT_MIB where
    ``_prefetch_measured`` and the rope runs inside the split-KV kernel, 0 elsewhere (the
    module docstring says why)."""
    raw = opts.extra.get(PREFETCH_EXTRA)
    if raw is None:
        on = _prefetch_measured(backend, opts, recipe) and split_kv_rope(backend, opts, recipe)
        return PREFETCH_DEFAULT_MIB if on else 0
    text = str(raw).strip()
    if not (text.isascii() and text.isdigit()) or int(text) > ATTENTION_PREFETCH_MAX_MIB:
        raise BackendError(
            f"--extra {PREFETCH_EXTRA}={raw!r}: expected whole MiB from 0 (none) to "
            f"{ATTENTION_PREFETCH_MAX_MIB} (half the L2 of an H100)"
        )
    mib = int(text)
    if mib and not is_cuda(opts.device):
        raise BackendError(
            f"--extra {PREFETCH_EXTRA}={mib} needs --device cuda: the prefetch is the "
            "split-KV decode kernel's, for NVIDIA GPUs"
        )
    if mib and not split_kv_decode(backend, opts, recipe):
        raise BackendError(
            f"--extra {PREFETCH_EXTRA}={mib} runs inside the split-KV decode kernel, "
            f"which this build does not use: add --extra {SPLIT_KV_EXTRA}=1"
        )
    return mib


def decode_attention_factor(backend: str, recipe: Recipe, opts: BuildChoices) -> str:
    """The key's name for how decode attends: sdpa, split_kv, or split_kv_rope."""
    if not split_kv_decode(backend, opts, recipe):
        return "sdpa"
    return "split_kv_rope" if split_kv_rope(backend, opts, recipe) else "split_kv"


def row_gemv(backend: str, recipe: Recipe, opts: BuildChoices) -> bool:
    """Whether one-row steps run acache's GEMV; an impossible request is one line."""
    raw = opts.extra.get(ROW_GEMV_EXTRA)
    asked = None if raw is None else parse_flag(ROW_GEMV_EXTRA, raw)
    if backend not in MODEL_BACKENDS:
        if asked:
            raise BackendError(
                f"--extra {ROW_GEMV_EXTRA}=1 is for {', '.join(MODEL_BACKENDS)}; "
                f"{backend} runs the ONNX export's matmuls"
            )
        return False
    fused = fuse_projections(backend, recipe, opts)
    why_not = None
    if not is_cuda(opts.device):
        why_not = "needs --device cuda: the kernel is Triton's, for NVIDIA GPUs"
    elif recipe.family not in ROW_GEMV_FAMILIES:
        why_not = f"runs {', '.join(ROW_GEMV_FAMILIES)} blocks, not {recipe.family}'s"
    elif not fused:
        if FUSE_EXTRA in opts.extra:  # asked for unfused
            why_not = f"runs fused projections: leave out --extra {FUSE_EXTRA}=0"
        else:  # eager keeps the checkpoint's layout unless asked
            why_not = f"runs fused projections: add --extra {FUSE_EXTRA}=1"
    elif recipe.shapes.max_batch > 1:
        why_not = (
            f"runs one-row steps, and a build for --max-batch {recipe.shapes.max_batch} "
            "pads every step to that many rows"
        )
    if asked and why_not:
        raise BackendError(f"--extra {ROW_GEMV_EXTRA}=1 {why_not}")
    if asked is None:
        # Where it measured faster (the docstring above): int4wo never (tinygemm won);
        # phi-2 in bf16 only (its int8wo is unmeasured).
        if recipe.family == "phi-2":
            measured_faster = opts.quant is None
        else:
            measured_faster = opts.quant != "int4wo" and (
                recipe.family in ROW_GEMV_DEFAULT_FAMILIES or opts.quant == "int8wo"
            )
        return why_not is None and backend in FUSE_BY_DEFAULT and measured_faster
    return asked


def cudnn_prefill(backend: str, opts: BuildChoices) -> bool:
    """Whether a pass's attention may run cuDNN's SDPA kernel; an impossible request is
    one line. False by default for CUDA builds of eager, inductor and aoti; True (torch's
    own choice, which has no cuDNN kernel there) on CPU and for the ONNX backends."""
    raw = opts.extra.get(CUDNN_PREFILL_EXTRA)
    asked = None if raw is None else parse_flag(CUDNN_PREFILL_EXTRA, raw)
    if asked is not None and backend not in MODEL_BACKENDS:
        raise BackendError(
            f"--extra {CUDNN_PREFILL_EXTRA} is for {', '.join(MODEL_BACKENDS)}; "
            f"{backend} runs the ONNX export's attention"
        )
    if not is_cuda(opts.device):
        if asked:
            raise BackendError(
                f"--extra {CUDNN_PREFILL_EXTRA}=1 needs --device cuda: cuDNN is CUDA's"
            )
        return True  # nothing to keep off: one key for the one artifact
    return backend not in MODEL_BACKENDS or bool(asked)


def check_recipe_options(backend: str, recipe: Recipe, opts: BuildChoices) -> None:
    """The checks that need the recipe, run before anything is built or keyed."""
    if backend in MODEL_BACKENDS:
        fuse_projections(backend, recipe, opts)
    split_kv_rope(backend, opts, recipe)
    row_gemv(backend, recipe, opts)


def model_factors(backend: str, recipe: Recipe, opts: BuildChoices) -> dict[str, Any]:
    """The key factors of the model as built (under backend.options)."""
    return {
        "fused_projections": fuse_projections(backend, recipe, opts),
        "quant": opts.quant or "none",
        "decode_attention": decode_attention_factor(backend, recipe, opts),
        "row_gemv": row_gemv(backend, recipe, opts),
        "cudnn_prefill": cudnn_prefill(backend, opts),
        "attention_prefetch_mib": attention_prefetch_mib(backend, opts, recipe),
    }


def model_build_args(backend: str, recipe: Recipe, opts: BuildChoices) -> dict[str, Any]:
    """build_model()'s keyword arguments for these options."""
    return {
        "fuse_projections": fuse_projections(backend, recipe, opts)
        and recipe.family not in FUSED_FAMILIES,
        "quant": opts.quant,
        "split_kv_decode": split_kv_decode(backend, opts, recipe),
        "split_kv_rope": split_kv_rope(backend, opts, recipe),
        "row_gemv": row_gemv(backend, recipe, opts),
        "cudnn_prefill": cudnn_prefill(backend, opts),
        "attention_prefetch": attention_prefetch_mib(backend, opts, recipe) << 20,
    }
