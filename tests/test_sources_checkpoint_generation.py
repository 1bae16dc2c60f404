"""What a checkpoint folder says about generation, read by sources/checkpoint.py: its
EOS ids (generation_config.json, else config.json) and its tokenizer.json, each a
bounded regular file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from artifactcache.errors import GenerationError
from artifactcache.sources.checkpoint import eos_ids_from_folder


@pytest.mark.parametrize(
    ("files", "want"),
    [
        ({"generation_config.json": {"eos_token_id": 2}}, (2,)),
        ({"generation_config.json": {"eos_token_id": [2, 7]}, "config.json": {}}, (2, 7)),
        ({"config.json": {"eos_token_id": 5}}, (5,)),
        ({"generation_config.json": {"eos_token_id": None}, "config.json": {"eos_token_id": 3}},
         (3,)),
        ({"config.json": {"model_type": "llama"}}, ()),
        ({}, ()),
    ],
)  # fmt: skip
def test_eos_ids_from_the_folder(files, want, tmp_path: Path):
    for name, data in files.items():
        (tmp_path / name).write_text(json.dumps(data))
    assert eos_ids_from_folder(tmp_path) == want


@pytest.mark.parametrize("bad", ['{"eos_token_id": "2"}', '{"eos_token_id": [1, -2]}', "{"])
def test_malformed_eos_ids_are_one_line_errors(bad: str, tmp_path: Path):
    (tmp_path / "generation_config.json").write_text(bad)
    with pytest.raises(GenerationError) as e:
        eos_ids_from_folder(tmp_path)
    assert "generation_config.json" in str(e.value) and "\n" not in str(e.value)


def _within(seconds: float, fn, release: list[Path]):
    """fn()'s exception (or None), failing if it blocks (a reader stuck on a FIFO)."""
    import os
    import threading

    out: list = []

    def run():
        try:
            fn()
            out.append(None)
        except Exception as e:
            out.append(e)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    if t.is_alive():
        for fifo in release:  # let the stuck reader go, then fail
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        t.join(10)
        pytest.fail(f"{fn} blocked on a special file")
    return out[0]


@pytest.mark.parametrize("name", ["generation_config.json", "config.json", "tokenizer.json"])
@pytest.mark.parametrize("kind", ["fifo", "huge"])
def test_checkpoint_files_are_bounded_regular_files(name: str, kind: str, tmp_path: Path):
    """A FIFO would hang `acache run`; a huge (here sparse) file would be read whole."""
    import os

    from artifactcache.limits import SMALL_FILE_MAX
    from artifactcache.sources.checkpoint import TOKENIZER_MAX, load_tokenizer

    path = tmp_path / name
    if kind == "fifo":
        os.mkfifo(path)
    else:
        with open(path, "wb") as f:
            f.truncate((TOKENIZER_MAX if name == "tokenizer.json" else SMALL_FILE_MAX) + 1)
    read = load_tokenizer if name == "tokenizer.json" else eos_ids_from_folder
    err = _within(30, lambda: read(tmp_path), [path] if kind == "fifo" else [])
    assert isinstance(err, GenerationError), err
    want = "is not a regular file" if kind == "fifo" else "bytes; at most"
    assert name in str(err) and want in str(err) and "\n" not in str(err)
