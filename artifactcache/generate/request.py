"""One generation request, resolved and checked before anything is built or loaded.

``resolve_request`` turns what a caller (``acache run``) was given into a
``GenerationRequest``: each prompt's token ids (given ids, text through the
checkpoint's tokenizer, or the recipe's recorded ids for its own prompt; several
prompts make one batch), the number of new tokens (default: the recipe's, cut to fit
max_seq_len after the longest prompt), the EOS ids to stop at and the sampling choice.
A bad value is a one-line error. The shapes (prompt + new tokens against
max_seq_len, ids in the vocabulary, prompts against the artifact's rows) are
``api.check_generation``'s and ``rows_for``'s to check.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
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
    prompts: list[list[int]]  # one or more; more than one run as one batch
    max_new_tokens: int
    # None: the runner's own (the checkpoint's); () never stops early.
    eos_token_ids: tuple[int, ...] | None
    sampling: Sampling

    @property
    def prompt_ids(self) -> list[int]:
        """The first (for one prompt, the only) prompt's ids."""
        return self.prompts[0]

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
    """One prompt's token ids: --tokens, --prompt through the folder's tokenizer, or the
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


def _as_list(given: str | Sequence[str] | None) -> list[str]:
    if given is None:
        return []
    return [given] if isinstance(given, str) else list(given)


def prompts_for(
    recipe: Recipe,
    tokenizer: Any,
    prompts: str | Sequence[str] | None,
    tokens: str | Sequence[str] | None,
    folder: Any,
) -> list[list[int]]:
    """Each prompt's ids (--prompt or --tokens, either repeatable); with neither, the
    recipe's own prompt alone."""
    texts, id_lists = _as_list(prompts), _as_list(tokens)
    if texts and id_lists:
        raise ArgumentError("pass either --prompt or --tokens, not both")
    if id_lists:
        return [prompt_ids_for(recipe, tokenizer, None, t, folder) for t in id_lists]
    return [prompt_ids_for(recipe, tokenizer, p, None, folder) for p in texts or [None]]


def resolve_request(
    recipe: Recipe,
    checkpoint: Checkpoint | None = None,
    *,
    prompt: str | Sequence[str] | None = None,
    tokens: str | Sequence[str] | None = None,
    max_new_tokens: int | None = None,
    eos_ids: list[int] | None = None,
    no_eos: bool = False,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int | None = None,
    chat: bool = False,
    system: str | None = None,
) -> GenerationRequest:
    """The request ``acache run`` makes of ``recipe`` (its shapes as given), checked.

    ``prompt`` is text, ``tokens`` ids as text ("1,2,3"); a list of either is a batch.
    With ``chat`` (or a ``system`` turn) each text is the user's turn through the
    checkpoint's chat template (generate/chat.py). ``eos_ids`` replaces the
    checkpoint's EOS ids and ``no_eos`` never stops early (not both).
    """
    tok = checkpoint.tokenizer if checkpoint is not None else None
    folder = checkpoint.folder if checkpoint is not None else None
    if chat or system is not None:
        if _as_list(tokens):
            raise ArgumentError("--chat and --system apply to --prompt text, not to --tokens")
        from .chat import chat_prompt_ids

        prompts = chat_prompt_ids(checkpoint, _as_list(prompt) or [recipe.bench.prompt], system)
    else:
        prompts = prompts_for(recipe, tok, prompt, tokens, folder)
    if no_eos and eos_ids:
        raise ArgumentError("pass either --eos-id or --no-eos, not both")
    eos = () if no_eos else (tuple(eos_ids) if eos_ids else None)
    sampling = Sampling(temperature, top_k, top_p, seed)  # bad values: one line
    if sampling.greedy and seed is not None:
        # As top_k without a temperature: almost surely a forgotten --temperature.
        raise ArgumentError(
            "--sample-seed applies to sampling: set --temperature > 0 (0 is greedy)"
        )
    check_eos_ids(eos if eos is not None else (checkpoint.eos_token_ids if checkpoint else ()),
                  recipe.model.vocab_size)  # fmt: skip
    if max_new_tokens is None:
        # A batch is left-padded to its longest prompt: that one must fit.
        max_new_tokens = default_max_new_tokens(recipe, max(len(p) for p in prompts))
    return GenerationRequest(prompts, max_new_tokens, eos, sampling)


def rows_for(recipe: Recipe, prompts: int, max_batch: int | None) -> int:
    """The rows (``--max-batch``) of the artifact that runs ``prompts`` prompts at once.

    Given, it must hold them all. Not given: the recipe's, or just enough rows for the
    prompts where the recipe's are too few (a batch of three builds a three-row
    artifact rather than failing on a one-row one).
    """
    if max_batch is not None:
        if 0 < max_batch < prompts:  # one below 1 is the shapes' to refuse, as for build
            raise ArgumentError(
                f"{prompts} prompts do not fit --max-batch {max_batch}: pass --max-batch "
                f"{prompts} or more, or fewer prompts"
            )
        return max_batch
    return max(recipe.shapes.max_batch, prompts)
