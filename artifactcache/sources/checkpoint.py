"""Which files of a checkpoint hold its tensors: the one rule the loader and the key share.

- A ``.safetensors`` file: that file.
- A folder with ``model.safetensors.index.json``: exactly the shards its
  ``weight_map`` names, plus the index itself (the loader reads it to find them).
- A folder without an index: its ``*.safetensors`` files.

Anything else in the folder (``.bin``/``.pt`` files, a stray safetensors next to an
index, the tokenizer) is never read, so it is never hashed either. ``config.json``
reaches the key through the recipe parsed from it, not as raw bytes.

Torch-free: keys.py uses it to compute the weights digest.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ..errors import WeightsError
from ..limits import read_small_file

CONFIG_NAME = "config.json"
INDEX_NAME = "model.safetensors.index.json"


@dataclass(frozen=True)
class CheckpointFiles:
    shards: list[Path]  # the safetensors files the loader opens, in a stable order
    index: Path | None  # the shard index, when the folder has one

    @property
    def hashed(self) -> list[Path]:
        """What the weights digest covers: the index (if any) and every shard."""
        return ([self.index] if self.index else []) + self.shards


def _shards_from_index(index: Path) -> list[Path]:
    raw = read_small_file(index, "shard index", WeightsError)
    try:
        data = json.loads(raw.decode("utf-8"))
    except ValueError as e:  # UnicodeDecodeError is one
        raise WeightsError(f"{index}: not valid JSON ({e})") from None
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
    files = sorted(p for p in path.glob("*.safetensors") if p.is_file())
    if not files:
        raise WeightsError(
            f"no *.safetensors files in {path} (only safetensors checkpoints are supported)"
        )
    return CheckpointFiles(files, None)
