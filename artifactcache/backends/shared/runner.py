"""The Runner every LLM backend shares: chunked prefill, then decoding, in batches.

A backend only has to supply step functions over the model's static KV cache:

    prefill(idx [B, T] int64, input_pos [T] int64, row_start [B] int64[, kv_pos [L] int64])
        -> logits [B, T, vocab]
    decode(idx [B, 1] int64, input_pos [1] int64, row_start [B] int64[, kv_pos [L] int64])
        -> logits [B, 1, vocab]

where B is ``recipe.shapes.max_batch`` and T a pass length of up to
``recipe.shapes.prefill_len`` tokens (generate/prefill.py: a longer prompt runs as
several passes, each at least 16 tokens long, and why padding a shorter one is safe). The
rows of a batch share positions: shorter prompts are left-padded and ``row_start[b]``
is row b's first real slot (models/common.py masks what lies before it). Every step
runs all B rows, so a request of fewer prompts fills the rest with padding rows.
``prefill`` starts a request and may reset the cache; a backend whose prefill does
(ort, trt keep the cache outside the model) also passes ``extend``, a step that
continues it. A backend may pass ``fresh(idx, input_pos) -> logits [B, 1, vocab]``, a
step for a first pass whose rows all start at slot 0: it attends causally to its own
keys (the torch backends' flash path, models/common.py) and returns its last position's
logits only, and the runner prefers it to ``prefill`` whenever no row is left-padded and
that position is a real token's (or later passes follow). A backend whose steps read only part of
the cache (every backend here: ``kv_len_hint=True``) also gives prefill, extend and
decode ``kv_pos``, the key positions of the filled length's bucket (models/common.py),
as a view of one buffer made at load, so choosing the read length allocates nothing.
Sampling and EOS are artifactcache/generate's; the loop is here.

Helpers here are also what backends use to prepare the device and the model on it, so
eager/inductor/aoti/ort/trt agree on dtype and device; steps.py has the shapes each step
is built for.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import torch

from ...devices import parse_device
from ...dtypes import check_dtype
from ...errors import BackendError, ShapeError
from ...generate import (
    PAD_ID,
    Checkpoint,
    Sampling,
    cut_at_eos,
    left_pad,
    plan_chunks,
    resolve_eos_ids,
)
from ...kv_buckets import kv_bucket
from ...models.common import key_positions

# A step takes its inputs positionally: (idx, input_pos, row_start[, kv_pos]) -> logits.
from .cuda_graph import Inputs, Step
from .cuda_graph import step_output as _as_tensor

if TYPE_CHECKING:
    from ...choices import BuildChoices
    from ...config import Recipe
    from ..base import BuildContext


def check_device_dtype(opts: BuildChoices) -> None:
    """The device/dtype checks every torch backend shares (one-line BackendError)."""
    check_dtype(opts.dtype)
    parse_device(opts.device)


def device_of(opts: BuildChoices) -> torch.device:
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


def build_model_for(ctx: BuildContext, dev: torch.device, backend: str) -> torch.nn.Module:
    """The recipe's model on ``dev`` with ctx's weights, and ``weights_ready`` stamped.

    Fused projections and quantization, as ``backend`` builds with ctx's options
    (model_options.py), are applied before the stamp: they are part of the weights.

    ``device_ready`` (a probe subphase) is stamped first: device_of() has created the
    CUDA context by now, so it splits the "weights" segment into context creation
    and weight materialization, which the warm-start analysis needs.
    """
    from ...models import build_model
    from .model_options import model_build_args

    sync(dev)
    ctx.phases["device_ready"] = time.perf_counter()  # the last one: load follows build

    model = build_model(
        ctx.recipe, device=dev, dtype=ctx.opts.dtype, weights=ctx.weights, stamps=ctx.phases,
        **model_build_args(backend, ctx.recipe, ctx.opts),
    )  # fmt: skip
    model.first_pass_last_logits = True  # the runner reads a first pass's last row only
    sync(dev)
    ctx.phases["weights_ready"] = time.perf_counter()
    return model


# The EOS check reads one device flag back every this many tokens: a host sync
# per token would leave the GPU idle while Python prepares the next launch.
EOS_CHECK_EVERY = 16


class StepRunner:
    """Runner (see backends/base.py) over a prefill step and a decode step."""

    def __init__(
        self,
        recipe: Recipe,
        prefill: Step,
        decode: Step,
        device: torch.device,
        *,
        extend: Step | None = None,
        fresh: Step | None = None,
        keepalive: Any = None,
        info: dict[str, Any] | None = None,
        kv_len_hint: bool = False,
        kv_buckets: bool = True,
    ) -> None:
        self.recipe = recipe
        self.prefill_step = prefill
        self.decode_step = decode
        # Torch backends write the cache in place, so their prefill step continues
        # it from any position.
        self.extend_step = extend or prefill
        # A first pass whose rows all start at slot 0: (idx, input_pos) -> logits.
        self.fresh_step = fresh
        self.device = device
        # Objects the steps borrow storage from (the model's weights and KV cache
        # for AOTI's user-managed constants) must live as long as the runner.
        self.keepalive = keepalive
        # Facts about how the steps run (e.g. CUDA graphs on/off), for reports; the
        # backend's own dict, which a CUDA graph captured later updates.
        self.info = info if info is not None else {}
        # decode's kv_pos inputs: views of one arange, one view per bucket.
        self._key_positions = (
            key_positions(recipe.shapes.max_seq_len, device) if kv_len_hint else None
        )
        self._kv_views: dict[int, torch.Tensor] = {}
        self._kv_buckets = kv_buckets
        # The checkpoint folder (api.load sets it): EOS ids and tokenizer.
        self.checkpoint: Checkpoint | None = None

    @property
    def max_batch(self) -> int:
        """Rows every step runs: the most prompts one generate_batch() takes."""
        return self.recipe.shapes.max_batch

    @property
    def tokenizer(self) -> Any:
        """The checkpoint's ``tokenizers.Tokenizer``, or None when it has none."""
        return self.checkpoint.tokenizer if self.checkpoint is not None else None

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        """The checkpoint's EOS ids: what generate() stops at by default."""
        return self.checkpoint.eos_token_ids if self.checkpoint is not None else ()

    def _prompts(self, prompts: Sequence[Sequence[int]]) -> list[list[int]]:
        """The prompts as lists of ints, each id in the vocabulary (one-line ShapeError)."""
        if isinstance(prompts, (str, bytes)) or not isinstance(prompts, Iterable):
            raise ShapeError(f"expected a list of prompts, got {type(prompts).__name__}")
        prompts = list(prompts)
        if not prompts:
            raise ShapeError("the batch is empty: give at least one prompt")
        out = []
        vocab = self.recipe.model.vocab_size
        for p in prompts:
            if isinstance(p, (str, bytes)) or not isinstance(p, Iterable):
                raise ShapeError(
                    f"each prompt must be a list of token ids, got {type(p).__name__} {p!r}"
                )
            ids = [int(t) for t in p]
            for t in ids:
                if not 0 <= t < vocab:
                    raise ShapeError(f"token id {t} is outside the vocabulary [0, {vocab})")
            out.append(ids)
        return out

    def _fits(self, prompts: list[list[int]], max_new_tokens: int) -> None:
        for p in prompts:
            if not p:
                raise ShapeError("the prompt is empty: give at least one token id")
        longest = max(len(p) for p in prompts)  # the left-padded rows all have its length
        self.recipe.check_fits(longest, max_new_tokens, len(prompts))

    def _prefill(
        self, prompts: list[list[int]], *, all_rows: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(logits, row_start) on device, the cache filled for every row.

        Logits [max_batch, longest, vocab] for every position of the left-padded rows
        (all_rows), else [max_batch, vocab] for the last one.
        """
        shapes = self.recipe.shapes
        rows, starts = left_pad(prompts, shapes.max_batch)
        row_start = torch.tensor(starts, dtype=torch.int64, device=self.device)
        plans = [plan_chunks(r, shapes.prefill_len, shapes.max_seq_len) for r in rows]
        # The causal first pass returns its last row's logits only: it serves a request
        # whose rows all start at slot 0 when that row is a real token's, or when later
        # passes follow (its logits are then unused).
        first = plans[0][0]
        fresh = (
            self.fresh_step is not None
            and not any(starts)
            and not all_rows
            and (len(plans[0]) > 1 or first.keep[1] == len(first.ids))
        )
        outs = []
        with torch.no_grad():
            for i, chunk in enumerate(plans[0]):  # every row has the same chunks
                idx = torch.tensor([p[i].ids for p in plans], dtype=torch.int64, device=self.device)
                end = chunk.start + len(chunk.ids)
                pos = torch.arange(chunk.start, end, dtype=torch.int64, device=self.device)
                if i == 0 and fresh:
                    out = _as_tensor(self.fresh_step(idx, pos))  # type: ignore[misc]
                    if len(plans[0]) == 1:
                        outs.append(out[:, -1])
                    continue
                step = self.prefill_step if i == 0 else self.extend_step
                out = _as_tensor(step(*self._with_kv_pos((idx, pos, row_start), end)))
                lo, hi = chunk.keep
                if all_rows:
                    # clone: a CUDA-graph step returns a view of its static output buffer.
                    outs.append(out[:, lo:hi].float().clone())
                elif i == len(plans[0]) - 1:
                    outs.append(out[:, hi - 1])
        return (torch.cat(outs, dim=1) if len(outs) > 1 else outs[0]), row_start

    def logits(self, token_ids: Sequence[int]) -> torch.Tensor:
        return self.logits_batch([token_ids])[0]

    def logits_batch(self, prompts: Sequence[Sequence[int]]) -> list[torch.Tensor]:
        """Each prompt's logits [len(prompt), vocab] fp32 on CPU, the prompts run as one batch."""
        rows = self._prompts(prompts)
        self._fits(rows, 0)
        out, row_start = self._prefill(rows, all_rows=True)
        starts = row_start.tolist()
        return [out[b, starts[b] :].cpu() for b in range(len(rows))]

    def _eos(self, eos_token_ids: Sequence[int] | None) -> tuple[int, ...]:
        return resolve_eos_ids(eos_token_ids, self.eos_token_ids, self.recipe.model.vocab_size)

    def decode_tokens(
        self,
        prompts: Sequence[Sequence[int]],
        max_new_tokens: int,
        sampling: Sampling | None = None,
    ) -> Iterator[torch.Tensor]:
        """Each step's new tokens as a [len(prompts), 1] device tensor, no EOS stop.

        The next step runs only when asked for, so a caller can time one step at a
        time (bench's step latency). The first yield is prefill plus the first pick.
        """
        rows = self._prompts(prompts)
        self._fits(rows, max_new_tokens)
        sampling = sampling or Sampling()
        sampling.row_seeds(len(rows))
        return self._tokens(rows, max_new_tokens, sampling)

    def _tokens(
        self, prompts: list[list[int]], max_new_tokens: int, sampling: Sampling
    ) -> Iterator[torch.Tensor]:
        """Each step's new tokens as [len(prompts), 1]; the next step runs when asked for."""
        n = len(prompts)
        pick = sampling.sampler(self.device, n)
        # Filler rows (a request smaller than max_batch) decode padding.
        filler = None
        if n < self.max_batch:
            filler = torch.full(
                (self.max_batch - n, 1), PAD_ID, dtype=torch.int64, device=self.device
            )
        # no_grad per step, never around a yield: grad mode is thread state, and a
        # suspended generator would leave it switched off in the caller.
        with torch.no_grad():
            last, row_start = self._prefill(prompts, all_rows=False)
            nxt = pick(last[:n])
        yield nxt
        pos = max(len(p) for p in prompts)
        ipos = torch.tensor([pos], dtype=torch.int64, device=self.device)
        for _ in range(max_new_tokens - 1):
            with torch.no_grad():
                idx = nxt.to(self.device)
                if filler is not None:
                    idx = torch.cat([idx, filler])
                step = _as_tensor(self.decode_step(*self.decode_inputs(idx, ipos, row_start, pos)))
                nxt = pick(step[:n, -1])
            yield nxt
            ipos = ipos + 1
            pos += 1

    def decode_inputs(
        self, idx: torch.Tensor, ipos: torch.Tensor, row_start: torch.Tensor, pos: int
    ) -> Inputs:
        """The decode step's inputs for tokens ``idx`` at position ``pos`` (ipos on device)."""
        return self._with_kv_pos((idx, ipos, row_start), pos + 1)

    def _with_kv_pos(self, inputs: Inputs, filled: int) -> Inputs:
        """``inputs`` plus kv_pos for a step that leaves ``filled`` positions written,
        where the backend's steps take one (kv_len_hint)."""
        if self._key_positions is None:
            return inputs
        n = kv_bucket(filled, self.recipe.shapes.max_seq_len, self._kv_buckets)
        view = self._kv_views.get(n)
        if view is None:
            view = self._kv_views[n] = self._key_positions[:n]
        return (*inputs, view)

    def _check(
        self, prompts: list[list[int]], max_new_tokens: int, **choices: Any
    ) -> tuple[Sampling, tuple[int, ...]]:
        """Validate a request before any step runs."""
        eos = choices.pop("eos_token_ids")
        sampling = Sampling(**choices)
        sampling.row_seeds(len(prompts))  # one seed per prompt, if a list: checked now
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int):
            raise ShapeError(f"max_new_tokens must be an integer, got {max_new_tokens!r}")
        if max_new_tokens < 0:
            raise ShapeError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
        self._fits(prompts, max_new_tokens)
        return sampling, self._eos(eos)

    def generate(
        self,
        prompt_ids: Sequence[int],
        max_new_tokens: int,
        *,
        eos_token_ids: Sequence[int] | None = None,
        temperature: float = 0.0,
        top_k: int | None = None,
        top_p: float | None = None,
        seed: int | None = None,
    ) -> list[int]:
        """Up to max_new_tokens new ids; stops after the first EOS id, which is kept.

        ``eos_token_ids=None`` stops at the checkpoint's EOS ids (none without a
        checkpoint folder); ``()`` never stops early. Greedy unless temperature > 0.
        A batch of one: on an artifact built for max_batch > 1 the other rows pad.
        """
        return self.generate_batch(
            [prompt_ids], max_new_tokens, eos_token_ids=eos_token_ids, temperature=temperature,
            top_k=top_k, top_p=top_p, seed=seed,
        )[0]  # fmt: skip

    def generate_batch(
        self,
        prompts: Sequence[Sequence[int]],
        max_new_tokens: int,
        *,
        eos_token_ids: Sequence[int] | None = None,
        temperature: float = 0.0,
        top_k: int | None = None,
        top_p: float | None = None,
        seed: int | Sequence[int] | None = None,
    ) -> list[list[int]]:
        """generate() for up to max_batch prompts at once: one list of new ids per prompt.

        The prompts may differ in length. Each row stops at its own first EOS id (kept);
        a finished row keeps decoding until every row is done, and its surplus is cut.
        With sampling, each row draws from its own generator, so row ``i`` samples what
        its prompt would alone with that row's seed: ``seed`` is one int (row ``i`` gets
        ``seed + i``; ``generate_batch([p], seed=s) == [generate(p, seed=s)]``), one int
        per prompt (equal seeds give what a lone run with that seed gives), or None.
        """
        rows = self._prompts(prompts)
        sampling, eos = self._check(
            rows, max_new_tokens, eos_token_ids=eos_token_ids, temperature=temperature,
            top_k=top_k, top_p=top_p, seed=seed,
        )  # fmt: skip
        if max_new_tokens == 0:
            return [[] for _ in rows]
        # Tokens stay on the device until the end: reading each one back (int(...))
        # would sync the host every step. The final .tolist() is the one sync, so a
        # timed request still ends when its last token exists; with EOS ids, a device
        # flag (every row done) is read every EOS_CHECK_EVERY tokens and the surplus cut.
        eos_t = torch.tensor(eos, dtype=torch.int64, device=self.device) if eos else None
        done: torch.Tensor | None = None
        out: list[torch.Tensor] = []
        for i, nxt in enumerate(self._tokens(rows, max_new_tokens, sampling)):
            out.append(nxt)
            if eos_t is not None:
                hit = torch.isin(nxt.to(self.device), eos_t).view(-1)
                done = hit if done is None else done | hit
                if (i + 1) % EOS_CHECK_EVERY == 0 and bool(done.all()):
                    break
        ids = torch.cat([t.to(out[0].device) for t in out], dim=1).tolist()
        return [cut_at_eos(row, eos) for row in ids]

    def stream(
        self,
        prompt_ids: Sequence[int],
        max_new_tokens: int,
        *,
        eos_token_ids: Sequence[int] | None = None,
        temperature: float = 0.0,
        top_k: int | None = None,
        top_p: float | None = None,
        seed: int | None = None,
    ) -> Iterator[int]:
        """generate(), one id at a time as each is made (one host sync per token).

        The same tokens as generate() with the same arguments; for a person
        watching, not for measuring.
        """
        rows = self._prompts([prompt_ids])
        sampling, eos = self._check(
            rows, max_new_tokens, eos_token_ids=eos_token_ids, temperature=temperature,
            top_k=top_k, top_p=top_p, seed=seed,
        )  # fmt: skip
        return self._stream(rows, max_new_tokens, sampling, set(eos))

    def _stream(
        self, rows: list[list[int]], n: int, sampling: Sampling, eos: set[int]
    ) -> Iterator[int]:
        if n == 0:
            return
        for nxt in self._tokens(rows, n, sampling):
            token = int(nxt)
            yield token
            if token in eos:
                return
