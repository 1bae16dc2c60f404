"""Choosing the next token: greedy, or sampling on the device without a host sync.

``Sampling`` holds and validates the user's choice (no torch needed, so the CLI
checks it before building anything). ``Sampling.sampler(device)`` returns the
per-step function, logits [vocab] -> token [1, 1] int64 (or [rows, vocab] -> [rows, 1],
each row drawn on its own), which stays on the device:

- temperature 0 (the default) is greedy, ``argmax``, bit-identical to a plain argmax;
- otherwise logits / temperature, then top-k and top-p (nucleus) filtering, then a
  draw by the exponential race (gpt-fast's ``multinomial_sample_one_no_sync``):
  ``argmax(probs / q)`` with q ~ Exp(1) is a sample from ``probs``, and unlike
  ``torch.multinomial`` it never copies anything to the host.

With a seed, each row of a batch draws from its own torch.Generator on the device, so
a row's tokens depend on its prompt and its seed only, never on the other rows: row
``i`` of a batch samples exactly as its prompt run alone with that row's seed. ``seed``
is one int (row ``i`` gets ``seed + i``, so a lone request gets ``seed``), one int per
row, or None (one freshly seeded generator draws every row's noise at once: nothing to
reproduce, and the rows' draws are still independent).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..errors import GenerationError
from ..limits import SEED_MAX

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class Sampling:
    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None
    seed: int | tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        t = self.temperature
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t < 0:
            raise GenerationError(
                f"temperature (--temperature) must be a finite number >= 0 (0 is greedy), got {t!r}"
            )
        k = self.top_k
        if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 1):
            raise GenerationError(f"top_k (--top-k) must be an integer >= 1, got {k!r}")
        p = self.top_p
        if p is not None and (
            isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 < p <= 1
        ):
            raise GenerationError(f"top_p (--top-p) must be in (0, 1], got {p!r}")
        s = self.seed
        if isinstance(s, Sequence) and not isinstance(s, (str, bytes)):
            s = tuple(s)
            object.__setattr__(self, "seed", s)  # a list from the caller, kept hashable
            if not s or not all(_is_seed(x) for x in s):
                raise GenerationError(
                    f"seed must be an integer >= 0 or one such integer per prompt (each below "
                    f"2**64), got {s!r}"
                )
        elif s is not None and not _is_seed(s):
            raise GenerationError(f"seed must be an integer >= 0 (below 2**64), got {s!r}")
        if t == 0 and (k is not None or p is not None):
            # Refused rather than ignored: greedy with a top-k is almost surely a
            # forgotten temperature.
            raise GenerationError(
                "top_k/top_p apply to sampling: set a temperature > 0 (temperature 0 is greedy)"
            )

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def row_seeds(self, rows: int) -> list[int | None]:
        """The seed of each of ``rows`` rows: seed + i, the given ones, or None (fresh)."""
        s = self.seed
        if isinstance(s, tuple):
            if len(s) != rows:
                raise GenerationError(
                    f"{len(s)} seeds for {rows} prompts: give one seed per prompt, or one int"
                )
            return list(s)
        if s is not None and s + rows - 1 > SEED_MAX:
            raise GenerationError(f"seed {s} + {rows - 1} rows passes 2**64-1: use a smaller seed")
        return [None if s is None else s + i for i in range(rows)]

    def sampler(
        self, device: torch.device, rows: int = 1
    ) -> Callable[[torch.Tensor], torch.Tensor]:
        """logits [vocab] or [rows, vocab] (any float dtype) -> next token [1, 1] or
        [rows, 1] int64, on ``device``; row ``i`` draws from its own generator."""
        seeds = self.row_seeds(rows)  # checked here too: greedy refuses a wrong count alike
        if self.greedy:
            return lambda logits: logits.argmax(-1).view(-1, 1)
        import torch

        if self.seed is None:
            # No seed, nothing to reproduce: one fresh generator draws every row's noise
            # in one launch. The rows' noise is still independent, so each row samples
            # from its own distribution as it would alone.
            shared = torch.Generator(device=device)
            shared.seed()
            gens = [shared]
        else:
            gens = [torch.Generator(device=device).manual_seed(s) for s in seeds]
        temperature, top_k, top_p = float(self.temperature), self.top_k, self.top_p

        def sample(logits: torch.Tensor) -> torch.Tensor:
            scores = logits.float() / temperature
            if top_k is not None and top_k < scores.shape[-1]:
                vals, idx = torch.topk(scores, top_k)
                # Exactly top_k survivors, ties or not.
                scores = torch.full_like(scores, -math.inf).scatter_(-1, idx, vals)
            probs = torch.softmax(scores, dim=-1)
            if top_p is not None and top_p < 1:
                probs = _nucleus(probs, top_p)
            q = torch.empty_like(probs)
            if len(gens) == 1:  # one row, or rows with no seed
                q.exponential_(1, generator=gens[0])
            else:
                # Seeded rows: one launch per row, and it must stay so. Row i's noise has
                # to be what its generator draws for [vocab] alone (its lone run, the
                # same seed). A torch RNG op takes one generator, so one draw over all
                # rows would make a row's noise depend on the rows before it; nor can a
                # row draw several tokens ahead in one launch, since on CUDA the Philox
                # kernel maps an element to its counter by the launch's grid, which
                # grows with the tensor: a [k, vocab] draw is not k [vocab] draws.
                for row, gen in zip(q.view(-1, q.shape[-1]), gens, strict=True):
                    row.exponential_(1, generator=gen)
            # exponential_ may return 0; a zero-probability token would then give 0/0,
            # a NaN that argmax would pick.
            q.clamp_min_(torch.finfo(q.dtype).tiny)
            return (probs / q).argmax(-1).view(-1, 1)

        return sample


def _is_seed(s: object) -> bool:
    # torch generators take 64 bits; row i of a batch draws from seed + i, kept below too.
    return isinstance(s, int) and not isinstance(s, bool) and 0 <= s <= SEED_MAX


def _nucleus(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """probs with only the smallest set of top tokens whose mass reaches top_p kept
    (per row of the last dimension).

    The same rule as transformers' TopPLogitsWarper: sort ascending, drop the tokens
    whose cumulative mass stays <= 1 - top_p; the most likely token always stays.
    """
    import torch

    sorted_p, order = torch.sort(probs, descending=False)
    drop_sorted = torch.cumsum(sorted_p, dim=-1) <= 1 - top_p
    drop_sorted[..., -1] = False
    drop = torch.zeros_like(drop_sorted).scatter_(-1, order, drop_sorted)
    kept = probs.masked_fill(drop, 0.0)
    return kept / kept.sum(-1, keepdim=True)


def check_eos_ids(ids: Sequence[int], vocab_size: int) -> tuple[int, ...]:
    """EOS ids as a tuple of ints in the vocabulary (one-line GenerationError else)."""
    out = []
    for t in ids:
        if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab_size:
            raise GenerationError(f"EOS token id {t!r} is outside the vocabulary [0, {vocab_size})")
        out.append(t)
    return tuple(dict.fromkeys(out))


def cut_at_eos(ids: list[int], eos: Sequence[int]) -> list[int]:
    """ids up to and including the first EOS (transformers' convention); all if none."""
    stop = set(eos)
    for i, t in enumerate(ids):
        if t in stop:
            return ids[: i + 1]
    return ids


def resolve_eos_ids(
    explicit: Sequence[int] | None, checkpoint_ids: Sequence[int], vocab_size: int
) -> tuple[int, ...]:
    """The EOS ids a request stops at: the caller's, checked (one-line error), else the
    checkpoint's. A checkpoint id the model cannot emit (a config default left at another
    tokenizer's value, as transformers' own small configs have) can never stop a
    generation, so it is dropped rather than refused."""
    if explicit is not None:
        return check_eos_ids(explicit, vocab_size)
    ids = (t for t in checkpoint_ids if not isinstance(t, bool) and isinstance(t, int))
    return tuple(dict.fromkeys(t for t in ids if 0 <= t < vocab_size))
