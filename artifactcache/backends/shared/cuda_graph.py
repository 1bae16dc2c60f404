"""CUDA graphs for LLM steps that have none of their own, one graph per input shapes.

An AOTInductor runner launches each kernel from C++ on every call (a 7B decode step is
some 400 launches), and inductor's aot_compile path is compiled without its own CUDA
graphs; ``cuda_graph_step`` replays such a step from a captured graph. Decode's input
shapes change with its KV-length bucket (models/common.py), so there is one graph per
bucket, the first captured at load and the others on first use. Load-time only: nothing
here shapes an artifact, so it is no key factor.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from ... import settings

# step(*inputs) -> logits (or a list whose first item is the logits)
Step = Callable[..., Any]
Inputs = tuple[torch.Tensor, ...]


def step_output(out: Any) -> torch.Tensor:
    """A step's logits: AOTInductor runners return a list of outputs, modules a tensor."""
    if isinstance(out, (list, tuple)):
        return out[0]
    return out


CUDA_GRAPHS_ENV = "ACACHE_CUDA_GRAPHS"


def _copy_into(static: Sequence[torch.Tensor], inputs: Sequence[torch.Tensor]) -> None:
    for buf, t in zip(static, inputs, strict=True):
        buf.copy_(t)


def cuda_graph_step(
    step: Step,
    examples: Sequence[Inputs],
    *,
    fresh_step: Callable[[], Step] | None = None,
) -> tuple[Step, dict[str, Any]]:
    """``step`` replayed from CUDA graphs, or a plain step where that fails.

    For steps with no graphs of their own (an AOTInductor runner launches each
    kernel from C++ on every call; a 7B decode step is some 400 launches). The
    step must write only to fixed addresses: AOTI's user-managed constants, the
    KV cache included, are the model's own tensors, so they are. It may take any
    number of tensor inputs, each copied into a static buffer before a replay.

    One graph per distinct input shapes (decode's KV-length bucket): the first is
    captured here at ``examples[0]``, and must match the plain step's output at every
    example (a graph that ignored its inputs would not; use two examples that differ
    in every input but kv_pos, ``decode_examples``); the others are captured on the
    first call with their shapes and checked at that call. Running a decode step
    writes KV-cache slot ``pos``, which is harmless: every request writes a slot
    before any query can read it, and the call being served writes the same values
    again.

    On any failure the plain step is used from then on: ``fresh_step()`` if given,
    for steps whose object a failed capture leaves unusable (an AOTI container keeps
    an event recorded during the capture and queries it on its next run), else
    ``step``. ``ACACHE_CUDA_GRAPHS=0`` turns capture off. Returns (step, info),
    info saying what happened, for the probe's report; a later capture updates it.
    """
    dev = examples[0][0].device
    if dev.type != "cuda":
        return step, {"cuda_graph": False, "cuda_graph_reason": "not a CUDA device"}
    if not settings.get(CUDA_GRAPHS_ENV):
        return step, {"cuda_graph": False, "cuda_graph_reason": f"{CUDA_GRAPHS_ENV}=0"}
    graphed = GraphedStep(step, dev, fresh_step)
    reason = graphed.capture(examples)
    if reason is not None:
        graphed.give_up(reason)
        assert graphed.plain is not None
        return graphed.plain, graphed.info
    return graphed, graphed.info


def _shapes(inputs: Inputs) -> tuple[tuple[int, ...], ...]:
    return tuple(tuple(t.shape) for t in inputs)


class GraphedStep:
    """A step replayed from one CUDA graph per input shapes (see cuda_graph_step)."""

    def __init__(self, step: Step, dev: torch.device, fresh_step: Callable[[], Step] | None):
        self.step, self.dev, self.fresh_step = step, dev, fresh_step
        # shapes -> (graph, static input buffers, static output)
        self.graphs: dict[tuple, tuple[Any, list[torch.Tensor], torch.Tensor]] = {}
        self.plain: Step | None = None  # set once a capture failed: every call runs it
        self.info: dict[str, Any] = {"cuda_graph": True, "cuda_graphs": 0}

    def __call__(self, *inputs: torch.Tensor) -> Any:
        if self.plain is not None:
            return self.plain(*inputs)
        entry = self.graphs.get(_shapes(inputs))
        if entry is None:
            reason = self.capture([inputs])
            if reason is not None:
                self.give_up(reason)
                assert self.plain is not None
                return self.plain(*inputs)
            entry = self.graphs[_shapes(inputs)]
        graph, static, out = entry
        _copy_into(static, inputs)
        graph.replay()
        return out

    def capture(self, examples: Sequence[Inputs]) -> str | None:
        """Capture a graph at examples[0]'s shapes, check it at each; why not, or None."""
        dev = self.dev
        static = [t.clone() for t in examples[0]]
        with torch.cuda.device(dev), torch.no_grad():
            try:
                side = torch.cuda.Stream(dev)
                side.wait_stream(torch.cuda.current_stream(dev))
                with torch.cuda.stream(side):
                    for _ in range(2):  # warm-up outside the graph (lazy init, allocator)
                        self.step(*static)
                    want = [step_output(self.step(*ex)).clone() for ex in examples]
                torch.cuda.current_stream(dev).wait_stream(side)
                graph = torch.cuda.CUDAGraph()
                # "relaxed": AOTI's container queries its own CUDA events between runs,
                # which the default "global" capture mode rejects.
                with torch.cuda.graph(graph, capture_error_mode="relaxed"):
                    out = step_output(self.step(*static))
                # examples[0] last: a capture on first use leaves what its call writes.
                for ex, w in reversed(list(zip(examples, want, strict=True))):
                    _copy_into(static, ex)
                    graph.replay()
                    # Tolerant: cuBLAS may pick other kernels under capture; a graph
                    # that ignored its inputs would be off by far more.
                    if not torch.allclose(out.float(), w.float(), rtol=2e-2, atol=2e-2):
                        return "the graph's replay differs from the plain step"
            except Exception as e:  # any capture failure: keep a plain step, say why
                return f"{type(e).__name__}: {e}"
        # The entry keeps graph and buffers alive.
        self.graphs[_shapes(examples[0])] = (graph, static, out)
        self.info["cuda_graphs"] = len(self.graphs)
        return None

    def give_up(self, reason: str) -> None:
        """Run the plain step from now on (a fresh one where given), and say why."""
        try:
            torch.cuda.synchronize(self.dev)
        except Exception:  # a sticky CUDA error: the plain step will report it
            pass
        self.graphs.clear()
        self.plain = self.fresh_step() if self.fresh_step is not None else self.step
        self.info.clear()
        self.info.update(cuda_graph=False, cuda_graph_reason=reason[:300])
        if len(reason) > 300:  # the whole message, for whoever reads the report next
            self.info["cuda_graph_error"] = reason[:4000]
