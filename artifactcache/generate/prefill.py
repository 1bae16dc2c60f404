"""Chunked prefill: a prompt of any length through steps built for up to ``prefill_len``
tokens.

The prefill steps take T tokens and their positions, for T anywhere in
``chunk_len_range(prefill_len)`` (a dynamic dimension of the compiled steps), and write
their keys and values into the static KV cache at those positions. A prompt of n
tokens runs as one pass when n <= P = prefill_len, else as chunks at positions 0, P,
2P, ... Each pass is as long as its tokens, at least CHUNK_ALIGN and at most P: a
6-token prompt costs a 16-token pass, not a P-token one, and a longer pass ends on the
prompt's last token, whose logits alone the causal first pass returns (models/common.py).

The padding at the end of a pass writes junk into cache slots past the prompt, which
is harmless: the causal mask (key s is seen by query p only when s <= p) hides those
slots from every real query, and each decode step writes its own slot before
attending to it, so the junk is overwritten before anyone reads it. Only when the
padded pass would run past the cache's end does the last chunk instead end exactly at
n, overlapping the previous one: the overlap recomputes tokens already in the cache,
writing the same keys and values again, and its rows of logits are not kept.

A batch shares the positions: ``left_pad`` pads every prompt on the left to the
longest, and each row's ``row_start`` (its first real slot) lets the attention mask
hide the padding (models/common.py), so all rows run through the same chunks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

PAD_ID = 0  # any id in the vocabulary: padded rows are never read
# The shortest pass when P is longer: the steps' dynamic token dimension starts here
# (torch.export and Dynamo specialize a dimension of 0 or 1, so it cannot start at 1).
CHUNK_ALIGN = 16


@dataclass(frozen=True)
class Chunk:
    """One prefill call: ``ids`` at positions start .. start+len(ids)-1.

    ``keep`` is the [lo, hi) range of its output rows that are new prompt tokens.
    """

    start: int
    ids: tuple[int, ...]
    keep: tuple[int, int]


def chunk_len_range(prefill_len: int) -> tuple[int, int] | None:
    """(shortest, longest) pass a prefill step takes: its dynamic token dimension, or None
    when every pass is exactly ``prefill_len`` tokens (P <= CHUNK_ALIGN: a static T)."""
    if prefill_len <= CHUNK_ALIGN:
        return None
    return CHUNK_ALIGN, prefill_len


def pass_len(tokens: int, prefill_len: int) -> int:
    """The length of a pass over ``tokens`` (<= prefill_len) new tokens: exactly them,
    padded up to CHUNK_ALIGN when fewer."""
    if chunk_len_range(prefill_len) is None:
        return prefill_len
    return min(prefill_len, max(tokens, CHUNK_ALIGN))


def plan_chunks(ids: list[int], prefill_len: int, max_seq_len: int) -> list[Chunk]:
    """The prefill calls for ``ids`` (1 <= len(ids) <= max_seq_len, checked by the caller;
    prefill_len < max_seq_len, checked by the recipe)."""
    n, p = len(ids), prefill_len
    chunks: list[Chunk] = []
    for start in range(0, n, p):
        real = ids[start : start + p]
        size = pass_len(len(real), p)
        if start + size <= max_seq_len:
            padded = tuple(real) + (PAD_ID,) * (size - len(real))
            chunks.append(Chunk(start, padded, (0, len(real))))
        else:
            # Only a later chunk can run past the end (size <= p < max_seq_len), and
            # then start >= p >= size, so the shifted start n - size is >= 0.
            shifted = n - size
            chunks.append(Chunk(shifted, tuple(ids[shifted:]), (start - shifted, size)))
    return chunks


def left_pad(prompts: Sequence[Sequence[int]], rows: int) -> tuple[list[list[int]], list[int]]:
    """(rows padded rows, row_start of each): the prompts left-padded to the longest, then
    filler rows up to ``rows`` (the steps' static batch; 1 <= len(prompts) <= rows).

    A filler row is all PAD_ID and starts at slot 0: its logits are never read, and a
    row that attends to its own padding keeps every score finite.
    """
    longest = max(len(p) for p in prompts)
    padded = [[PAD_ID] * (longest - len(p)) + list(p) for p in prompts]
    starts = [longest - len(p) for p in prompts]
    fillers = rows - len(prompts)
    return padded + [[PAD_ID] * longest for _ in range(fillers)], starts + [0] * fillers
