"""Chunked prefill: a prompt of any length through a step built for ``prefill_len`` tokens.

The compiled prefill step takes exactly P = prefill_len tokens and their positions,
and writes their keys and values into the static KV cache at those positions. A
prompt of n tokens therefore runs as chunks at positions 0, P, 2P, ...

The last chunk, when shorter than P, is right-padded. The padding writes junk into
cache slots n .. start+P-1, which is harmless: the causal mask (key s is seen by
query p only when s <= p) hides those slots from every real query, and each decode
step writes its own slot before attending to it, so the junk is overwritten before
anyone reads it. Only when the padded chunk would run past the cache's end
(max_seq_len not a multiple of P) does the last chunk instead end exactly at n,
overlapping the previous one: the overlap recomputes tokens already in the cache,
writing the same keys and values again, and its rows of logits are not kept.

A batch shares the positions: ``left_pad`` pads every prompt on the left to the
longest, and each row's ``row_start`` (its first real slot) lets the attention mask
hide the padding (models/common.py), so all rows run through the same chunks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

PAD_ID = 0  # any id in the vocabulary: padded rows are never read


@dataclass(frozen=True)
class Chunk:
    """One prefill call: ``ids`` (exactly P of them) at positions start .. start+P-1.

    ``keep`` is the [lo, hi) range of its output rows that are new prompt tokens.
    """

    start: int
    ids: tuple[int, ...]
    keep: tuple[int, int]


def plan_chunks(ids: list[int], prefill_len: int, max_seq_len: int) -> list[Chunk]:
    """The prefill calls for ``ids`` (1 <= len(ids) <= max_seq_len, checked by the caller)."""
    n, p = len(ids), prefill_len
    chunks: list[Chunk] = []
    for start in range(0, n, p):
        real = ids[start : start + p]
        if len(real) == p or start + p <= max_seq_len:
            padded = tuple(real) + (PAD_ID,) * (p - len(real))
            chunks.append(Chunk(start, padded, (0, len(real))))
        else:
            # start >= p here (prefill_len <= max_seq_len), so n - p >= 0.
            shifted = n - p
            chunks.append(Chunk(shifted, tuple(ids[shifted:]), (start - shifted, p)))
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
