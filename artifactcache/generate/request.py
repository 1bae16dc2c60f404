"""One generation request, resolved and checked before anything is built or loaded.

``resolve_request`` turns what a caller (``acache run``) was given into a
``GenerationRequest``: the prompt's token ids (given ids, text through the
checkpoint's tokenizer, or the recipe's recorded ids for its own prompt), the
number of new tokens (default: the recipe's, cut to fit max_seq_len), the EOS ids
to stop at and the sampling choice. A bad value is a one-line error. The shapes
(prompt + new tokens against max_seq_len, ids in the vocabulary) are
``api.check_generation``'s to check.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import ArgumentError
from .checkpoint import encode
from .sampling import Sampling, check_eos_ids

if TYPE_CHECKING:
    from ..config import Recipe
    from .checkpoint import Checkpoint


@dataclass(frozen=True)
class GenerationRequest:
    prompt_ids: list[int]
    max_new_tokens: int
    # None: the runner's own (the checkpoint's); () never stops early.
    eos_token_ids: tuple[int, ...] | None
    sampling: Sampling

    def generate_kwargs(self) -> dict[str, Any]:
        """The keyword arguments of Runner.generate / Runner.stream after ids and N."""
        s = self.sampling
        return dict(eos_token_ids=self.eos_token_ids, temperature=s.temperature,
                    top_k=s.top_k, top_p=s.top_p, seed=s.seed)  # fmt: skip


_ID = re.compile(r"-?[0-9]+")


def parse_token_ids(text: str) -> list[int]:
    """'1,2,3' or '1 2 3' -> [1, 2, 3]; anything else is a one-line error. An id left
    out between two commas ('1,,2') is refused rather than skipped: it is a typo that
    would shift every later position."""
    parts = text.replace(",", " ").split()
    if not parts:
        raise ArgumentError("--tokens is empty: pass ids like --tokens 1,15043,29892")
    between_commas = [p.strip() for p in text.strip().strip(",").split(",")]
    # ASCII digits only: int() also reads other scripts' digits ('１'), no one's token id.
    if "" in between_commas or not all(_ID.fullmatch(p) for p in parts):
        raise ArgumentError(
            f"--tokens must be integers separated by commas or spaces, got {text!r}"
        )
    return [int(p) for p in parts]


def prompt_ids_for(
    recipe: Recipe, tokenizer: Any, prompt: str | None, tokens: str | None, folder: Any
) -> list[int]:
    """The prompt's token ids: --tokens, --prompt through the folder's tokenizer, or the
    recipe's recorded ids for its own prompt."""
    if prompt is not None and tokens is not None:
        raise ArgumentError("pass either --prompt or --tokens, not both")
    if tokens is not None:
        return parse_token_ids(tokens)
    recorded = list(recipe.bench.prompt_ids)
    if recorded and (prompt is None or (prompt == recipe.bench.prompt and tokenizer is None)):
        return recorded
    if tokenizer is not None:
        return encode(tokenizer, recipe.bench.prompt if prompt is None else prompt)
    if prompt is None:
        raise ArgumentError(f"recipe {recipe.name} has no bench.prompt_ids: pass --tokens IDS")
    where = f"no tokenizer.json in {folder}" if folder else "no checkpoint folder (--weights DIR)"
    raise ArgumentError(f"{where} to encode --prompt; pass token ids with --tokens IDS")


def default_max_new_tokens(recipe: Recipe, prompt_len: int) -> int:
    """The recipe's bench.max_new_tokens, cut to fit max_seq_len (at least 1)."""
    return max(1, min(recipe.bench.max_new_tokens, recipe.shapes.max_seq_len - prompt_len))


def resolve_request(
    recipe: Recipe,
    checkpoint: Checkpoint | None = None,
    *,
    prompt: str | None = None,
    tokens: str | None = None,
    max_new_tokens: int | None = None,
    eos_ids: list[int] | None = None,
    no_eos: bool = False,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int | None = None,
) -> GenerationRequest:
    """The request ``acache run`` makes of ``recipe`` (its shapes as given), checked.

    ``tokens`` is the ids as text ("1,2,3"); ``eos_ids`` replaces the checkpoint's
    EOS ids and ``no_eos`` never stops early (not both).
    """
    tok = checkpoint.tokenizer if checkpoint is not None else None
    folder = checkpoint.folder if checkpoint is not None else None
    ids = prompt_ids_for(recipe, tok, prompt, tokens, folder)
    if no_eos and eos_ids:
        raise ArgumentError("pass either --eos-id or --no-eos, not both")
    eos = () if no_eos else (tuple(eos_ids) if eos_ids else None)
    sampling = Sampling(temperature, top_k, top_p, seed)  # bad values: one line
    check_eos_ids(eos if eos is not None else (checkpoint.eos_token_ids if checkpoint else ()),
                  recipe.model.vocab_size)  # fmt: skip
    if max_new_tokens is None:
        max_new_tokens = default_max_new_tokens(recipe, len(ids))
    return GenerationRequest(ids, max_new_tokens, eos, sampling)
