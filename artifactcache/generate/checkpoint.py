"""What a Hugging Face checkpoint folder says about generation, and text in and out.

- ``Checkpoint``: the folder's EOS ids (``eos_token_id``, an int or a list, from
  ``generation_config.json``, which is what transformers' ``generate`` uses, else
  from ``config.json``) and its ``tokenizer.json``, read with the ``tokenizers``
  library (no transformers, no hub). The files are read by sources/checkpoint.py.
- ``encode``, ``TextStream``, ``decode_continuation``: prompt text to ids, and
  generated ids back to text.

Both files are read lazily: a runner that only measures decode speed never pays for
parsing a multi-megabyte tokenizer.json.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cached_property
from pathlib import Path
from typing import Any

from ..errors import GenerationError
from ..sources.checkpoint import eos_ids_from_folder, load_tokenizer


class Checkpoint:
    """A checkpoint folder's generation facts, each read on first use."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)

    @cached_property
    def eos_token_ids(self) -> tuple[int, ...]:
        return eos_ids_from_folder(self.folder)

    @cached_property
    def tokenizer(self) -> Any:
        return load_tokenizer(self.folder)


def encode(tokenizer: Any, text: str) -> list[int]:
    """Text -> ids with the tokenizer's special tokens (e.g. BOS), as transformers does."""
    ids = list(tokenizer.encode(text).ids)
    if not ids:
        raise GenerationError(f"the prompt {text!r} encodes to no tokens")
    return ids


class TextStream:
    """Generated ids -> text, piece by piece, as they would read after the prompt.

    Decoding each id on its own would lose what depends on its neighbours (the
    leading space of a SentencePiece word, a UTF-8 character split over byte
    tokens); the library's DecodeStream keeps that context, starting from the
    prompt's ids. Special tokens (EOS) print as nothing.
    """

    def __init__(self, tokenizer: Any, prompt_ids: Sequence[int]) -> None:
        from tokenizers.decoders import DecodeStream

        self.tokenizer = tokenizer
        self._stream = DecodeStream(ids=list(prompt_ids), skip_special_tokens=True)
        self.pieces: list[str] = []

    def push(self, token_id: int) -> str:
        """The text this id completes ('' while a character is still partial)."""
        piece = self._stream.step(self.tokenizer, int(token_id)) or ""
        self.pieces.append(piece)
        return piece

    @property
    def text(self) -> str:
        return "".join(self.pieces)


def decode_continuation(tokenizer: Any, prompt_ids: Sequence[int], new_ids: Sequence[int]) -> str:
    """The text of new_ids after the prompt: what TextStream prints, all at once."""
    stream = TextStream(tokenizer, prompt_ids)
    for t in new_ids:
        stream.push(t)
    return stream.text
