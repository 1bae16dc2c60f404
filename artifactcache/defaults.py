"""The command line's defaults for what the user did not choose: fit for the machine.

- device: ``cuda`` when torch sees a GPU, else ``cpu``;
- dtype: a checkpoint folder's own (config.json's ``dtype`` / ``torch_dtype``), else
  ``bf16`` on a GPU and ``fp32`` on a CPU; an fp16 checkpoint runs as fp32 on a CPU,
  where fp16 kernels are slow or missing; with ort, whose providers take no bf16, fp16 on
  a GPU and fp32 on a CPU (and the device is a GPU only where onnxruntime has its CUDA
  provider);
- backend: one for every command: ``aoti`` on a GPU (the fastest warm start and decode
  measured, docs/benchmarks.md), ``eager`` on a CPU (no compiler needed, and for the
  tiny CPU recipes no compiled backend pays for its build).

The library's own defaults (``BuildChoices``: cpu, fp32) stay fixed: a program says what
it wants. Defaults resolve to values before any key is made, so a key never holds
"auto".
"""

from __future__ import annotations

from pathlib import Path

from .devices import is_cuda
from .dtypes import DTYPES, canonical_dtype
from .errors import RecipeError
from .sources.checkpoint import checkpoint_folder, has_config, read_config

DEVICE_DEFAULT_HELP = "default: cuda when torch sees a GPU, else cpu"
DTYPE_DEFAULT_HELP = "default: a checkpoint's own, else bf16 on cuda and fp32 on cpu"
BACKEND_DEFAULT_HELP = "default: aoti on cuda, eager on cpu"


def default_device(backends: tuple[str, ...] = ()) -> str:
    """cuda when torch sees a GPU (and, for ort, onnxruntime has its CUDA provider)."""
    import torch

    if not torch.cuda.is_available():
        return "cpu"
    if "ort" in backends:
        try:
            import onnxruntime
        except ImportError:
            return "cuda"  # ort is unavailable either way; its own check says so
        if "CUDAExecutionProvider" not in onnxruntime.get_available_providers():
            return "cpu"
    return "cuda"


def checkpoint_dtype(folder: str | Path | None) -> str | None:
    """A checkpoint folder's dtype as acache names it, or None (no folder, no config.json,
    no dtype there, or one acache does not build in; loading says why, in one line)."""
    if folder is None:
        return None
    try:
        data = read_config(Path(folder))  # bounded: a FIFO or a huge file is refused
    except RecipeError:
        return None
    for field in ("dtype", "torch_dtype"):  # transformers 5 and 4 spell it differently
        value = data.get(field)
        if isinstance(value, str):
            dtype = canonical_dtype(value)
            return dtype if dtype in DTYPES else None
    return None


def default_dtype(
    device: str, folder: str | Path | None = None, backends: tuple[str, ...] = ()
) -> str:
    """The checkpoint's own dtype, else the device's; within what every backend named
    runs (ort: fp32 on a CPU, fp32 or fp16 on a GPU, docs/onnx.md)."""
    cuda = is_cuda(device)
    own = checkpoint_dtype(folder)
    if own is not None:
        dtype = "fp32" if own == "fp16" and not cuda else own
    else:
        dtype = "bf16" if cuda else "fp32"
    if "ort" in backends and dtype == "bf16":
        return "fp16" if cuda else "fp32"
    return dtype


def default_backend(device: str) -> str:
    return "aoti" if is_cuda(device) else "eager"


def model_folder(recipe: str | None, weights: str | None) -> Path | None:
    """The checkpoint folder a command's model comes from: --weights' folder (the loader's
    rule, sources/checkpoint.py), or a RECIPE that is a folder; either with a config.json.
    None for built-ins, TOML files and model specs."""
    for folder in (checkpoint_folder(weights), Path(recipe) if recipe else None):
        if folder is not None and has_config(folder):
            return folder
    return None
