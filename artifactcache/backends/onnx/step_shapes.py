"""The ONNX step graph's inputs and outputs: names, shapes, dynamic axes and TensorRT's
optimization profiles (onnx/export.py's docstring draws the graph).

``step_dims`` is the one place the export's dynamic axes (both exporters), its example
inputs and TensorRT's profiles (tensorrt/loader.py) read, so they cannot disagree.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from ...config import Recipe

# The runner's step inputs, in the order a step takes them; then the cache.
STEP_INPUT_NAMES = ("input_ids", "input_pos", "row_start", "kv_pos", "logit_rows")
CACHE_INPUT_NAMES = ("past_keys", "past_values")
INPUT_NAMES = STEP_INPUT_NAMES + CACHE_INPUT_NAMES
OUTPUT_NAMES = ("logits", "present_keys", "present_values")


def cache_shape(recipe: Recipe) -> tuple[int, ...]:
    """The stacked cache: max_seq_len positions and the spare slot (module docstring)."""
    m, s = recipe.model, recipe.shapes
    return (m.n_layers, s.max_batch, m.n_kv_heads, s.max_seq_len + 1, m.head_dim)


@dataclass(frozen=True)
class Axis:
    """A dynamic dimension of the step graph: its export name and its range."""

    name: str
    lo: int
    hi: int


StepDims = dict[str, tuple["int | Axis", ...]]


def step_dims(recipe: Recipe) -> StepDims:
    """Every input's and output's dimensions, static sizes or Axis ranges, from the shapes.

    The one place the export's dynamic axes (both exporters), its example inputs and
    TensorRT's optimization profiles (tensorrt/loader.py) read, so they cannot
    disagree: the token axis T spans 1..prefill_len; the batch axis is static at
    max_batch (the runner pads a smaller batch), and so are row_start and the cache,
    whose sequence axis is max_seq_len.
    """
    s = recipe.shapes
    t, b = Axis("T", 1, s.prefill_len), s.max_batch
    r = Axis("R", 1, s.prefill_len)
    kv = Axis("L", 1, s.max_seq_len)
    cache = cache_shape(recipe)
    return {
        "input_ids": (b, t),
        "input_pos": (t,),
        "row_start": (b,),
        "kv_pos": (kv,),
        "logit_rows": (r,),
        "past_keys": cache,
        "past_values": cache,
        "logits": (b, r, recipe.model.vocab_size),
        "present_keys": cache,
        "present_values": cache,
    }


def example_inputs(recipe: Recipe, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    """The inputs the export traces: every axis at its largest (T = prefill_len, L =
    max_seq_len), but two logit rows: an example equal to another axis's would tie the
    two, one of 1 would fix R at 1. So L's example is one less where T's equals it."""
    import torch

    dims = step_dims(recipe)
    shape = {n: tuple(d.hi if isinstance(d, Axis) else d for d in dims[n]) for n in INPUT_NAMES}
    ids = torch.zeros(shape["input_ids"], dtype=torch.int64)
    t = shape["input_pos"][0]
    pos = torch.arange(t, dtype=torch.int64)
    row_start = torch.zeros(shape["row_start"], dtype=torch.int64)
    length = shape["kv_pos"][0]
    kv_pos = torch.arange(length - 1 if length == t else length, dtype=torch.int64)
    rows = torch.tensor([0] + [t - 1] * (2 if t == 2 else 1), dtype=torch.int64)  # R != T
    keys = torch.zeros(shape["past_keys"], dtype=dtype)
    values = torch.zeros(shape["past_values"], dtype=dtype)
    return ids, pos, row_start, kv_pos, rows, keys, values


Profile = dict[str, tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]]


def step_profiles(recipe: Recipe) -> list[Profile]:
    """TensorRT's (min, opt, max) shapes of the inputs with a dynamic axis: [prefill, decode].

    Prefill takes each axis over its range, tuned for a prompt's first pass of the
    longest chunk (T = L = prefill_len, one logit row); decode takes T = R = 1 and L over
    its range. Read by the trt backend's engine and ort's TensorRT EP.
    """
    dims = step_dims(recipe)

    def profile(pick: Callable[[Axis], tuple[int, int, int]]) -> Profile:
        out: Profile = {}
        for name in INPUT_NAMES:
            if any(isinstance(d, Axis) for d in dims[name]):
                lo, opt, hi = (
                    tuple(pick(d)[i] if isinstance(d, Axis) else d for d in dims[name])
                    for i in range(3)
                )
                out[name] = (lo, opt, hi)
        return out

    longest_pass = recipe.shapes.prefill_len
    # Tuned for a first pass of the longest chunk: R = 1 row out, L = T positions read.
    opt = {"R": 1, "L": longest_pass}
    prefill = profile(lambda a: (a.lo, opt.get(a.name, a.hi), a.hi))
    decode = profile(lambda a: (1, 1, 1) if a.name in ("T", "R") else (a.lo, a.hi, a.hi))
    return [prefill, decode]


def dynamic_axes(recipe: Recipe, names: tuple[str, ...]) -> dict[str, dict[int, Axis]]:
    """{name: {dim: Axis}} of the tensors among ``names`` that have a dynamic dimension."""
    out = {}
    for name in names:
        axes = {d: a for d, a in enumerate(step_dims(recipe)[name]) if isinstance(a, Axis)}
        if axes:
            out[name] = axes
    return out
