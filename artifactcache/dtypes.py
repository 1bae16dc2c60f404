"""The dtypes acache builds in: one table, read by the CLI, the backends, the models and bench.

Torch-free (torch's dtype is looked up by name, lazily), so the CLI's help and the
option checks cost no torch import. A backend that supports only some of these
(an execution provider without bf16) keeps its own subset, checked in the backend.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from .errors import BackendError

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class Dtype:
    name: str  # what the user types: --dtype bf16
    bytes: int  # per element: bench's bytes-per-token and roofline
    torch_name: str  # torch.<torch_name>; also how HF config.json and TensorRT-LLM spell it


DTYPES: dict[str, Dtype] = {
    d.name: d
    for d in (
        Dtype("fp32", 4, "float32"),
        Dtype("bf16", 2, "bfloat16"),
        Dtype("fp16", 2, "float16"),
    )
}
DTYPE_NAMES = tuple(DTYPES)
# Other spellings of the same dtypes (torch's names, with or without "torch."): a build
# choice is stored under the table's name, so every spelling keys the same entry.
DTYPE_ALIASES = {
    "float32": "fp32", "float": "fp32", "bfloat16": "bf16", "float16": "fp16", "half": "fp16",
}  # fmt: skip
DTYPE_HELP = " | ".join(DTYPE_NAMES)
TORCH_DTYPE_NAMES = tuple(d.torch_name for d in DTYPES.values())
# A compiled module's inputs may also be integer or boolean tensors (token ids, masks).
INPUT_DTYPES: dict[str, Dtype] = {
    **DTYPES,
    **{
        d.name: d
        for d in (Dtype("int64", 8, "int64"), Dtype("int32", 4, "int32"), Dtype("bool", 1, "bool"))
    },
}


def canonical_dtype(name: str) -> str:
    """The table's name for ``name`` or one of its aliases (any case, "torch." allowed);
    anything else unchanged, for check_dtype to refuse."""
    if not isinstance(name, str):
        return name
    low = name.strip().lower().removeprefix("torch.")
    return low if low in DTYPES else DTYPE_ALIASES.get(low, name)


def check_dtype(name: str) -> Dtype:
    """The table's row for ``name``; a one-line BackendError for any other name."""
    try:
        return DTYPES[name]
    except KeyError:
        raise BackendError(
            f"unknown dtype {name!r}: choose one of {', '.join(DTYPE_NAMES)} "
            f"(or {', '.join(DTYPE_ALIASES)})"
        ) from None


def torch_dtype(name: str) -> torch.dtype:
    import torch

    return getattr(torch, check_dtype(name).torch_name)


def torch_input_dtype(name: str) -> torch.dtype:
    """torch's dtype for a name in INPUT_DTYPES (KeyError for any other: callers check first)."""
    import torch

    return getattr(torch, INPUT_DTYPES[name].torch_name)


def input_dtype_name(dtype: torch.dtype) -> str | None:
    """The INPUT_DTYPES name of a torch dtype, or None for one acache does not take."""
    return next(
        (d.name for d in INPUT_DTYPES.values() if str(dtype) == f"torch.{d.torch_name}"), None
    )
