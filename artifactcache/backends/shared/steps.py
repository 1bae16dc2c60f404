"""The steps a torch backend compiles, and the exact inputs each is built for.

A prompt's first pass (``prefill``: rows at slot 0, causal over its own keys), a pass
that reads the cache (``extend``: a later chunk, left-padded rows) and ``decode``; their
example inputs, the dimensions that vary between calls (the passes' token count, the
KV-read length) and their ranges. eager, inductor, aoti and the ONNX export build from
these, so every backend agrees on the shapes the runner (runner.py) will call with.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

import torch

from ... import settings
from ...generate import chunk_len_range
from ...kv_buckets import kv_bucket, kv_len_range
from ...models.common import key_positions
from .cuda_graph import Inputs, Step

if TYPE_CHECKING:
    from ...config import Recipe

STEP_KINDS = ("prefill", "extend", "decode")


def example_inputs(recipe: Recipe, dev: torch.device, step: str, kv_buckets: bool = True) -> Inputs:
    """The inputs, with the exact shapes and dtypes, a step is built for (STEP_KINDS).

    prefill: (idx [B, P], input_pos [P]) at 0 .. P-1; extend: the same plus row_start
    [B] and kv_pos [L], L the bucket of P; decode: (idx [B, 1], input_pos [1] at P,
    row_start [B], kv_pos [L]), L the bucket of P + 1. Without ``kv_buckets`` L is the
    whole cache (the model's own); kv_pos is a view of the whole arange, as the runner
    passes it. P (prefill_len) is the longest pass; prefill's and extend's T is
    dynamic over ``prefill_tokens_range``.
    """
    if step not in STEP_KINDS:
        raise ValueError(f"unknown step {step!r}: one of {STEP_KINDS}")
    decode = step == "decode"
    p = recipe.shapes.prefill_len
    n, start = (1, p) if decode else (p, 0)
    rows = recipe.shapes.max_batch
    idx = torch.zeros(rows, n, dtype=torch.int64, device=dev)
    pos = torch.arange(start, start + n, dtype=torch.int64, device=dev)
    if step == "prefill":
        return idx, pos
    row_start = torch.zeros(rows, dtype=torch.int64, device=dev)
    s = recipe.shapes.max_seq_len
    return idx, pos, row_start, key_positions(s, dev)[: kv_bucket(start + n, s, kv_buckets)]


def prefill_tokens_range(recipe: Recipe) -> tuple[int, int] | None:
    """(shortest, longest) pass of the prefill and extend steps, their dynamic token
    dimension; None where every pass is prefill_len tokens (generate/prefill.py)."""
    return chunk_len_range(recipe.shapes.prefill_len)


def dynamic_ranges(
    recipe: Recipe, step: str, kv_buckets: bool = True
) -> dict[tuple[int, int], tuple[int, int]]:
    """{(input index, dim): (lo, hi)} of example_inputs(step)'s dimensions that vary:
    the passes' token count (idx's dim 1, input_pos's dim 0) and kv_pos's length."""
    out = {}
    tokens = prefill_tokens_range(recipe)
    if step != "decode" and tokens is not None:
        out[(0, 1)] = out[(1, 0)] = tokens
    span = kv_len_range(recipe.shapes.max_seq_len, kv_buckets)
    if step != "prefill" and span is not None:
        out[(-1, 0)] = span
    return out


def kv_buckets_of(model: Any) -> bool:
    """Whether ``model``'s decode reads the cache by length bucket (models/common.py's
    CausalLM.kv_buckets; a split-KV decode reads the filled part by itself)."""
    return bool(getattr(model, "kv_buckets", True))


def decode_examples(recipe: Recipe, dev: torch.device, kv_buckets: bool = True) -> list[Inputs]:
    """Two decode inputs that differ in every input but kv_pos, for cuda_graph_step.

    The second is another token, the next position, and row_start 1 (still at or
    before the position, so a real row); kv_pos stays the key positions of the
    first's bucket, so the second position must be in it (else only the first).
    """
    first = example_inputs(recipe, dev, "decode", kv_buckets)
    idx, pos, row_start, kv_pos = first
    if int(pos[-1]) + 1 >= kv_pos.shape[0]:
        return [first]
    return [first, (idx + 1, pos + 1, row_start + 1, kv_pos)]


# The steps an inductor load opens only at their first call. A request's first pass runs
# one of the two pass steps: ``prefill`` for rows at slot 0 whose last token ends the
# pass, ``extend`` otherwise (a prompt shorter than a pass, left-padded rows, later
# chunks; runner.py). So a warm start opens decode (every request decodes; its CUDA
# graph is captured at load) and the pass its first request needs, never both.
# ACACHE_LAZY_STEPS=0 opens every step at load.
LAZY_STEPS = ("prefill", "extend")


class LazyStep:
    """A step opened by ``open_step()`` at its first call, then called directly.

    Opening a saved step and its first run (deserializing, binding it to the model,
    cuBLAS and attention set-up) cost about a second per step of a warm llama-7b
    inductor load (docs/perf-notes.md, attempt 31); a process that never calls the
    step never pays it. ``scope()``, where given, is entered around the opening and the
    first call: the context the load itself runs its steps in.
    """

    def __init__(
        self, open_step: Callable[[], Step], scope: Callable[[], AbstractContextManager[Any]]
    ) -> None:
        self._open = open_step
        self._scope = scope
        self._step: Step | None = None
        self._lock = threading.Lock()

    @property
    def opened(self) -> bool:
        return self._step is not None

    def __call__(self, *inputs: Any) -> Any:
        step = self._step
        if step is not None:
            return step(*inputs)
        with self._lock, self._scope():
            if self._step is None:
                self._step = self._open()
            return self._step(*inputs)


def opened_when_used(
    step: str,
    open_step: Callable[[], Step],
    scope: Callable[[], AbstractContextManager[Any]] = contextlib.nullcontext,
) -> Step:
    """``open_step()`` now, or a LazyStep for a step of LAZY_STEPS (ACACHE_LAZY_STEPS)."""
    if step in LAZY_STEPS and settings.get("ACACHE_LAZY_STEPS"):
        return LazyStep(open_step, scope)
    return open_step()
