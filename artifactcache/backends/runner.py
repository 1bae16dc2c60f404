"""The greedy-decoding Runner every LLM backend shares.

A backend only has to supply two step functions over the model's static KV cache:

    prefill(idx [1, P] int64, input_pos [P] int64) -> logits [1, P, vocab]
    decode(idx [1, 1] int64, input_pos [1] int64)  -> logits [1, 1, vocab]

where P is ``recipe.shapes.prefill_len``. Prompts are right-padded to P so a
compiled prefill always sees one static shape; the padding writes junk into
cache slots at positions >= len(prompt), which the causal mask hides from every
real query and the following decode steps overwrite before anyone reads them.

Helpers here are also what backends use to prepare tensors and the model on the
target device, so eager/inductor/aoti/ort/trt agree on dtype, device and the
request shapes.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch

from ..errors import BackendError, ShapeError
from .base import parse_device

if TYPE_CHECKING:
    from ..recipes import Recipe
    from .base import BuildContext, BuildOptions

Step = Callable[[torch.Tensor, torch.Tensor], Any]

DTYPE_NAMES = ("fp32", "bf16", "fp16")


def check_device_dtype(opts: BuildOptions) -> None:
    """The device/dtype checks every torch backend shares (one-line BackendError)."""
    if opts.dtype not in DTYPE_NAMES:
        raise BackendError(f"unknown dtype {opts.dtype!r}: choose one of {', '.join(DTYPE_NAMES)}")
    parse_device(opts.device)


def device_of(opts: BuildOptions) -> torch.device:
    """The torch device, with a CUDA context created first on GPUs.

    Creating the context here, before any model exists, keeps its cost out of the
    "weights" phase: build_model_for stamps ``device_ready`` after it, so a probe
    can tell context creation from weight materialization.
    """
    dev = torch.device(opts.device)
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise BackendError(f"device {opts.device!r} requested but torch sees no CUDA GPU")
        torch.zeros(1, device=dev)
    return dev


def sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def example_inputs(
    recipe: Recipe, dev: torch.device, decode: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """(idx, input_pos) with the exact shapes and dtypes the steps are built for."""
    n = 1 if decode else recipe.shapes.prefill_len
    start = recipe.shapes.prefill_len if decode else 0
    idx = torch.zeros(1, n, dtype=torch.int64, device=dev)
    pos = torch.arange(start, start + n, dtype=torch.int64, device=dev)
    return idx, pos


def build_model_for(ctx: BuildContext, dev: torch.device) -> torch.nn.Module:
    """The recipe's model on ``dev`` with ctx's weights, and ``weights_ready`` stamped.

    ``device_ready`` (a probe subphase) is stamped first: device_of() has created the
    CUDA context by now, so it splits the "weights" segment into context creation
    and weight materialization, which the warm-start analysis needs.
    """
    from ..models import build_model

    sync(dev)
    ctx.phases["device_ready"] = time.perf_counter()  # the last one: load follows build

    model = build_model(ctx.recipe, device=dev, dtype=ctx.opts.dtype, weights=ctx.weights)
    sync(dev)
    ctx.phases["weights_ready"] = time.perf_counter()
    return model


def _as_tensor(out: Any) -> torch.Tensor:
    # AOTInductor runners return a list of outputs; compiled/eager modules a tensor.
    if isinstance(out, (list, tuple)):
        return out[0]
    return out


CUDA_GRAPHS_ENV = "ACACHE_CUDA_GRAPHS"


def cuda_graph_step(
    step: Step,
    examples: Sequence[tuple[torch.Tensor, torch.Tensor]],
    *,
    fresh_step: Callable[[], Step] | None = None,
) -> tuple[Step, dict[str, Any]]:
    """``step`` replayed from a CUDA graph, or a plain step where that fails.

    For steps with no graphs of their own (an AOTInductor runner launches each
    kernel from C++ on every call; a 7B decode step is some 400 launches). The
    step must write only to fixed addresses: AOTI's user-managed constants, the
    KV cache included, are the model's own tensors, so they are.

    The graph is captured at ``examples[0]``; then, at every example, the replay
    must match the plain step's output (a graph that ignored its inputs would
    not). Use two examples at different tokens and positions. Running a decode
    step writes KV-cache slot ``pos``, which is harmless: every request writes a
    slot before any query can read it.

    On any failure the plain step is returned: ``fresh_step()`` if given, for
    steps whose object a failed capture leaves unusable (an AOTI container keeps
    an event recorded during the capture and queries it on its next run), else
    ``step``. ``ACACHE_CUDA_GRAPHS=0`` turns capture off. Returns (step, info),
    info saying what happened, for the probe's report.
    """
    dev = examples[0][0].device
    if dev.type != "cuda":
        return step, {"cuda_graph": False, "cuda_graph_reason": "not a CUDA device"}
    if os.environ.get(CUDA_GRAPHS_ENV, "1") == "0":
        return step, {"cuda_graph": False, "cuda_graph_reason": f"{CUDA_GRAPHS_ENV}=0"}
    static = [t.clone() for t in examples[0]]

    def fallback(reason: str) -> tuple[Step, dict[str, Any]]:
        try:
            torch.cuda.synchronize(dev)
        except Exception:  # a sticky CUDA error: the plain step will report it
            pass
        plain = fresh_step() if fresh_step is not None else step
        return plain, {"cuda_graph": False, "cuda_graph_reason": reason[:300]}

    with torch.cuda.device(dev), torch.no_grad():
        try:
            side = torch.cuda.Stream(dev)
            side.wait_stream(torch.cuda.current_stream(dev))
            with torch.cuda.stream(side):
                for _ in range(2):  # warm-up outside the graph (lazy init, allocator)
                    step(*static)
                want = [_as_tensor(step(*ex)).clone() for ex in examples]
            torch.cuda.current_stream(dev).wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            # "relaxed": AOTI's container queries its own CUDA events between runs,
            # which the default "global" capture mode rejects.
            with torch.cuda.graph(graph, capture_error_mode="relaxed"):
                out = _as_tensor(step(*static))
            for ex, w in zip(examples, want, strict=True):
                static[0].copy_(ex[0])
                static[1].copy_(ex[1])
                graph.replay()
                # Tolerant: cuBLAS may pick other kernels under capture; a graph
                # that ignored its inputs would be off by far more.
                if not torch.allclose(out.float(), w.float(), rtol=2e-2, atol=2e-2):
                    return fallback("the graph's replay differs from the plain step")
        except Exception as e:  # any capture failure: keep a plain step, say why
            return fallback(f"{type(e).__name__}: {e}")

    def replay(idx: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        static[0].copy_(idx)
        static[1].copy_(pos)
        graph.replay()
        return out

    return replay, {"cuda_graph": True}  # the closure keeps graph and buffers alive


def decode_examples(recipe: Recipe, dev: torch.device) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Two decode inputs at different tokens and positions, for cuda_graph_step."""
    idx, pos = example_inputs(recipe, dev, decode=True)
    if recipe.shapes.prefill_len + 1 >= recipe.shapes.max_seq_len:
        return [(idx, pos)]
    return [(idx, pos), (idx + 1, pos + 1)]


class StepRunner:
    """Runner (see backends/base.py) over a prefill step and a decode step."""

    def __init__(
        self,
        recipe: Recipe,
        prefill: Step,
        decode: Step,
        device: torch.device,
        *,
        keepalive: Any = None,
        info: dict[str, Any] | None = None,
    ) -> None:
        self.recipe = recipe
        self.prefill_step = prefill
        self.decode_step = decode
        self.device = device
        # Objects the steps borrow storage from (the model's weights and KV cache
        # for AOTI's user-managed constants) must live as long as the runner.
        self.keepalive = keepalive
        # Facts about how the steps run (e.g. CUDA graphs on/off), for reports.
        self.info = dict(info or {})

    def _prefill(self, token_ids: Sequence[int]) -> torch.Tensor:
        """Logits [T, vocab] (on device) for the prompt, filling cache slots 0..P-1."""
        ids = [int(t) for t in token_ids]
        vocab = self.recipe.model.vocab_size
        for t in ids:
            if not 0 <= t < vocab:
                raise ShapeError(f"token id {t} is outside the vocabulary [0, {vocab})")
        n, p = len(ids), self.recipe.shapes.prefill_len
        idx = torch.tensor([ids + [0] * (p - n)], dtype=torch.int64, device=self.device)
        pos = torch.arange(p, dtype=torch.int64, device=self.device)
        with torch.no_grad():
            out = _as_tensor(self.prefill_step(idx, pos))
        return out[0, :n]

    def logits(self, token_ids: Sequence[int]) -> torch.Tensor:
        self.recipe.check_fits(len(token_ids), 0)
        out = self._prefill(token_ids)
        # clone: a CUDA-graph step returns a view of its static output buffer.
        return out.float().cpu().clone()

    def generate(self, prompt_ids: Sequence[int], max_new_tokens: int) -> list[int]:
        if max_new_tokens < 0:
            raise ShapeError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
        self.recipe.check_fits(len(prompt_ids), max_new_tokens)
        if max_new_tokens == 0:
            return []
        # Tokens stay on the device until the end: reading each one back (int(...))
        # would sync the host every step and leave the GPU idle while Python prepares
        # the next launch. The final .tolist() is the one sync, so a timed request
        # still ends when its last token exists.
        with torch.no_grad():
            nxt = self._prefill(prompt_ids)[-1].argmax().view(1, 1)
            out = [nxt]
            ipos = torch.tensor([len(prompt_ids)], dtype=torch.int64, device=self.device)
            for _ in range(max_new_tokens - 1):
                step = _as_tensor(self.decode_step(nxt.to(self.device), ipos))
                nxt = step[0, -1].argmax().view(1, 1)
                out.append(nxt)
                ipos = ipos + 1
            return torch.cat([t.to(out[0].device) for t in out]).view(-1).tolist()
