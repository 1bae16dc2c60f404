"""What a Hugging Face checkpoint folder says about generation: EOS ids and the tokenizer.

- EOS ids: ``eos_token_id`` (an int or a list) from ``generation_config.json``, which
  is what transformers' ``generate`` uses, else from ``config.json``.
- The tokenizer: ``tokenizer.json`` read with the ``tokenizers`` library (no
  transformers, no hub).

Both are read lazily: a runner that only measures decode speed never pays for
parsing a multi-megabyte tokenizer.json.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from functools import cached_property
from pathlib import Path
from typing import Any

from ..errors import GenerationError
from ..limits import read_small_file

TOKENIZER_FILE = "tokenizer.json"
# The largest tokenizer.json read: the largest vocabularies' files are tens of MiB.
TOKENIZER_MAX = 256 << 20
EOS_SOURCES = ("generation_config.json", "config.json")


def checkpoint_folder(weights: str | Path | None) -> Path | None:
    """The folder a weights path belongs to: itself, or a .safetensors file's folder."""
    if weights is None:
        return None
    path = Path(weights)
    if path.is_dir():
        return path
    if path.is_file():
        return path.parent
    return None


def _eos_field(path: Path) -> tuple[bool, tuple[int, ...]]:
    """(present, ids) for one JSON file's eos_token_id; a malformed value is an error."""
    if not os.path.lexists(path):
        return False, ()
    # A regular file of at most SMALL_FILE_MAX bytes: a FIFO or a device is an error, not a hang.
    raw_bytes = read_small_file(path, "checkpoint file", GenerationError)
    try:
        data = json.loads(raw_bytes.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise GenerationError(f"{path}: cannot read it as JSON ({e})") from None
    if not isinstance(data, dict) or data.get("eos_token_id") is None:
        return False, ()
    raw = data["eos_token_id"]
    ids = raw if isinstance(raw, list) else [raw]
    for t in ids:
        if isinstance(t, bool) or not isinstance(t, int) or t < 0:
            raise GenerationError(
                f"{path}: eos_token_id must be an id or a list of ids, got {raw!r}"
            )
    return True, tuple(ids)


def eos_ids_from_folder(folder: str | Path) -> tuple[int, ...]:
    """The folder's EOS ids (generation_config.json first, then config.json); () if none."""
    for name in EOS_SOURCES:
        present, ids = _eos_field(Path(folder) / name)
        if present:
            return ids
    return ()


def load_tokenizer(folder: str | Path) -> Any:
    """A ``tokenizers.Tokenizer`` from folder/tokenizer.json, or None when there is none."""
    path = Path(folder) / TOKENIZER_FILE
    if not os.path.lexists(path):
        return None
    data = read_small_file(path, "tokenizer", GenerationError, max_bytes=TOKENIZER_MAX)
    from tokenizers import Tokenizer

    try:
        return Tokenizer.from_str(data.decode("utf-8"))
    except Exception as e:  # the library raises a bare Exception for a malformed file
        raise GenerationError(
            f"{path}: not a tokenizer the tokenizers library reads ({e})"
        ) from None


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
