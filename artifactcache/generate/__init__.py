"""Generation on top of a Runner's compiled steps: what a user expects of ``generate``.

- ``prefill``: a prompt of any length runs through the prefill steps in passes of up
  to ``prefill_len`` tokens (``plan_chunks``); a batch of prompts is left-padded to the
  longest (``left_pad``);
- ``sampling``: greedy, or temperature / top-k / top-p sampling on the device with no
  host sync per token (``Sampling`` validates, ``Sampler`` draws);
- ``checkpoint``: what a checkpoint folder says about generation (its EOS ids and
  tokenizer, read by sources/checkpoint.py), and text to ids and back;
- ``request``: one request's prompt ids, new tokens, EOS ids and sampling, resolved
  from what a caller (``acache run``) was given and checked (``resolve_request``).

Nothing here imports torch at module level, so the CLI can validate its options
before anything heavy is imported.
"""

from __future__ import annotations

from .checkpoint import Checkpoint, TextStream
from .prefill import CHUNK_ALIGN, PAD_ID, Chunk, chunk_len_range, left_pad, plan_chunks
from .request import GenerationRequest, resolve_request
from .sampling import Sampling, check_eos_ids, cut_at_eos, resolve_eos_ids

__all__ = [
    "CHUNK_ALIGN",
    "PAD_ID",
    "Checkpoint",
    "Chunk",
    "GenerationRequest",
    "Sampling",
    "TextStream",
    "check_eos_ids",
    "chunk_len_range",
    "cut_at_eos",
    "left_pad",
    "plan_chunks",
    "resolve_eos_ids",
    "resolve_request",
]
