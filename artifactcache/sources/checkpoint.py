"""A Hugging Face checkpoint folder's files: the one module that reads them.

Which files hold its tensors, the one rule the loader and the key share:

- A ``.safetensors`` file: that file.
- A folder with ``model.safetensors.index.json``: exactly the shards its
  ``weight_map`` names, plus the index itself (the loader reads it to find them).
- A folder without an index: its ``model.safetensors`` where it has one (as
  transformers loads it, so an adapter or a second export beside it is not the
  model's), else its ``*.safetensors`` files.

Anything else in the folder (``.bin``/``.pt`` files, a stray safetensors next to an
index, the tokenizer) is never read by the loader, so it is never hashed either.
``config.json`` reaches the key through the recipe parsed from it (``read_config``
here, sources/hf.py turns it into a recipe), not as raw bytes.

What the folder says about generation, read only when asked: its EOS ids
(``generation_config.json``, else ``config.json``), its ``tokenizer.json``, and its chat
template (``chat_template.jinja``, else ``tokenizer_config.json``'s ``chat_template``)
with the special tokens' text from ``tokenizer_config.json``.

Every file is read as a bounded regular file (limits.read_small_file): a FIFO or a
huge file is a one-line error, not a hang. Torch-free: keys.py uses it to compute the
weights digest, and the CLI to validate before anything heavy is imported.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import GenerationError, RecipeError, WeightsError
from ..limits import read_small_file

CONFIG_NAME = "config.json"
INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"  # an unsharded checkpoint's one file, by transformers' name
GENERATION_CONFIG_NAME = "generation_config.json"
TOKENIZER_NAME = "tokenizer.json"
# A chat template: its own file (what transformers writes since 4.49), else a field of
# the tokenizer's config, beside the special tokens' text the template names.
CHAT_TEMPLATE_NAME = "chat_template.jinja"
TOKENIZER_CONFIG_NAME = "tokenizer_config.json"
# The largest tokenizer.json read: the largest vocabularies' files are tens of MiB.
TOKENIZER_MAX = 256 << 20
# Where the EOS ids come from, first found wins: what transformers' generate uses.
EOS_SOURCES = (GENERATION_CONFIG_NAME, CONFIG_NAME)


def _read_json(path: Path, what: str, error: type[Exception], **loads: Any) -> Any:
    """A small JSON file of the checkpoint; one-line ``error`` when it is not JSON."""
    raw = read_small_file(path, what, error)  # a FIFO or a huge file: one line
    try:
        return json.loads(raw.decode("utf-8"), **loads)
    except ValueError as e:  # UnicodeDecodeError is one
        raise error(f"{path}: not valid JSON ({e})") from None


@dataclass(frozen=True)
class CheckpointFiles:
    shards: list[Path]  # the safetensors files the loader opens, in a stable order
    index: Path | None  # the shard index, when the folder has one

    @property
    def hashed(self) -> list[Path]:
        """What the weights digest covers: the index (if any) and every shard."""
        return ([self.index] if self.index else []) + self.shards


def _shards_from_index(index: Path) -> list[Path]:
    data = _read_json(index, "shard index", WeightsError)
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        raise WeightsError(f"{index}: field 'weight_map' must be a non-empty object")
    names = set()
    for tensor, name in weight_map.items():
        if not isinstance(name, str) or not name.endswith(".safetensors") or "/" in name:
            raise WeightsError(
                f"{index}: weight_map['{tensor}'] must be a .safetensors file name in the "
                f"folder, got {name!r}"
            )
        names.add(name)
    shards = [index.parent / n for n in sorted(names)]
    for f in shards:
        if not f.is_file():
            raise WeightsError(f"{f}: listed in {INDEX_NAME} but missing")
    return shards


def checkpoint_files(path: Path) -> CheckpointFiles:
    """The files a checkpoint's loader reads; one-line WeightsError when there are none."""
    if path.is_file():
        if path.suffix != ".safetensors":
            raise WeightsError(
                f"{path}: only .safetensors weights are supported (convert with safetensors)"
            )
        return CheckpointFiles([path], None)
    if not path.is_dir():
        if path.exists():  # a FIFO or a device: hashing it would block or never end
            raise WeightsError(f"weights {path} is not a regular file or a folder")
        raise WeightsError(f"weights not found: {path} (pass a safetensors file or HF folder)")
    index = path / INDEX_NAME
    if index.is_file():
        return CheckpointFiles(_shards_from_index(index), index)
    single = path / SINGLE_NAME
    if single.is_file():
        return CheckpointFiles([single], None)
    files = sorted(p for p in path.glob("*.safetensors") if p.is_file())
    if not files:
        raise WeightsError(
            f"no *.safetensors files in {path} (only safetensors checkpoints are supported)"
        )
    return CheckpointFiles(files, None)


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


# ----------------------------------------------------------------- config.json --


def has_config(path: Path) -> bool:
    """Whether ``path`` is a folder with a config.json (a single file has none)."""
    return path.is_dir() and (path / CONFIG_NAME).is_file()


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a finite number")


def read_config(folder: Path) -> dict[str, Any]:
    """The folder's config.json as a JSON object; one-line RecipeError otherwise."""
    path = folder / CONFIG_NAME
    if not os.path.lexists(path):
        raise RecipeError(
            f"{folder} has no {CONFIG_NAME}: a recipe folder must be a Hugging Face checkpoint "
            "(config.json and *.safetensors)"
        )
    # json.loads takes NaN and Infinity, which no config field means: refused here.
    data = _read_json(path, "checkpoint config", RecipeError, parse_constant=_no_constant)
    if not isinstance(data, dict):
        raise RecipeError(f"{path}: must hold a JSON object, got {type(data).__name__}")
    return data


# ------------------------------------------------------------------ generation --


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
    path = Path(folder) / TOKENIZER_NAME
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


def _token_text(value: Any) -> str | None:
    """A special token in tokenizer_config.json: its text, or its AddedToken's content."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def read_chat_template(folder: str | Path) -> tuple[str, dict[str, str]] | None:
    """(the folder's chat template, the special tokens' text by name: bos_token,
    eos_token...) or None when it has no template. A list of named templates gives the
    one named "default", as transformers does."""
    folder = Path(folder)
    config: dict[str, Any] = {}
    path = folder / TOKENIZER_CONFIG_NAME
    if os.path.lexists(path):
        data = _read_json(path, "tokenizer config", GenerationError)
        config = data if isinstance(data, dict) else {}
    template: Any = config.get("chat_template")
    jinja = folder / CHAT_TEMPLATE_NAME
    if os.path.lexists(jinja):
        raw = read_small_file(jinja, "chat template", GenerationError)
        try:
            template = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise GenerationError(f"{jinja}: not UTF-8 text") from None
    if isinstance(template, list):
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    if template is None:
        return None
    if not isinstance(template, str):
        raise GenerationError(f"{path}: chat_template must be text, got {type(template).__name__}")
    names = ("bos_token", "eos_token", "unk_token", "pad_token")
    specials = {n: t for n in names if (t := _token_text(config.get(n))) is not None}
    return template, specials
