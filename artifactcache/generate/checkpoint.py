"""What a Hugging Face checkpoint folder says about generation, and text in and out.

- ``Checkpoint``: the folder's EOS ids (``eos_token_id``, an int or a list, from
  ``generation_config.json``, which is what transformers' ``generate`` uses, else
  from ``config.json``), its ``tokenizer.json``, read with the ``tokenizers``
  library (no transformers, no hub), and its chat template (generate/chat.py applies
  it). The files are read by sources/checkpoint.py.
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
from ..sources.checkpoint import eos_ids_from_folder, load_tokenizer, read_chat_template


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

    @cached_property
    def chat_template(self) -> tuple[str, dict[str, str]] | None:
        """(template, special tokens' text) or None: see sources/checkpoint.py."""
        return read_chat_template(self.folder)


def encode(tokenizer: Any, text: str, *, add_special_tokens: bool = True) -> list[int]:
    """Text -> ids with the tokenizer's special tokens (e.g. BOS), as transformers does;
    without them for a chat template's text, which writes its own."""
    ids = list(tokenizer.encode(text, add_special_tokens=add_special_tokens).ids)
    if not ids:
        raise GenerationError(f"the prompt {text!r} encodes to no tokens")
    return ids


# What a decoder writes for bytes that are not (yet) a whole UTF-8 character.
_PARTIAL = "\ufffd"


class TextStream:
    """Generated ids -> text, piece by piece, as they would read after the prompt.

    What is printed is the text of prompt + new ids less the prompt's own text, so
    the prompt never shows again. A character the prompt leaves unfinished (its ids
    end partway through a UTF-8 character, so its text ends in U+FFFD) counts as
    new text if the new ids complete it, and prints whole; if they do not, its
    U+FFFD is the prompt's and is not printed. A character the new ids leave
    unfinished prints nothing until an id completes it (at the very end: never).

    Decoding each id on its own would lose what depends on its neighbours (the
    leading space of a SentencePiece word, a UTF-8 character split over byte
    tokens); the library's DecodeStream keeps that context. Its ``ids=`` start
    forgets the prompt when the prompt's text ends unfinished and prints the prompt
    again, so such a start is decoded here until its text is whole, and only then
    handed to DecodeStream. Special tokens (EOS) print as nothing.
    """

    def __init__(self, tokenizer: Any, prompt_ids: Sequence[int]) -> None:
        self.tokenizer = tokenizer
        self.pieces: list[str] = []
        self._stream: Any = None
        self._pending = [int(i) for i in prompt_ids]
        prompt_text = self._decode(self._pending)
        self._whole = prompt_text.rstrip(_PARTIAL)
        self._unfinished = len(prompt_text) - len(self._whole)
        if not self._unfinished:
            self._start_stream()

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def _start_stream(self) -> None:
        from tokenizers.decoders import DecodeStream

        self._stream = DecodeStream(ids=self._pending, skip_special_tokens=True)
        self._pending = []

    def push(self, token_id: int) -> str:
        """The text this id completes ('' while a character is still partial)."""
        if self._stream is not None:
            piece = self._stream.step(self.tokenizer, int(token_id)) or ""
        else:
            piece = self._push_after_unfinished_prompt(int(token_id))
        self.pieces.append(piece)
        return piece

    def _push_after_unfinished_prompt(self, token_id: int) -> str:
        self._pending.append(token_id)
        text = self._decode(self._pending)
        if text.endswith(_PARTIAL):
            return ""
        if not text.startswith(self._whole):
            raise GenerationError(
                "the tokenizer's decoder rewrote the prompt's text after it; "
                "the generated text cannot be told apart from the prompt's"
            )
        piece = text[len(self._whole) :]
        # A leading U+FFFD here stands for prompt bytes the new ids did not complete:
        # the prompt's text showed it already.
        dropped = len(piece) - len(piece.lstrip(_PARTIAL))
        piece = piece[min(dropped, self._unfinished) :]
        self._start_stream()  # the text is whole now, which DecodeStream starts from
        return piece

    @property
    def text(self) -> str:
        return "".join(self.pieces)


def decode_continuation(tokenizer: Any, prompt_ids: Sequence[int], new_ids: Sequence[int]) -> str:
    """The text of new_ids after the prompt: what TextStream prints, all at once.

    That is the text of prompt + new_ids less the prompt's own text; a character
    the prompt leaves unfinished prints whole if new_ids complete it, and not at
    all if they do not (see TextStream).
    """
    stream = TextStream(tokenizer, prompt_ids)
    for t in new_ids:
        stream.push(t)
    return stream.text
