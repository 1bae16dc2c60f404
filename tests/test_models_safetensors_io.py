"""The threaded safetensors reader (models/safetensors_io.py) behind load_checkpoint.

Every loaded tensor must be bit-identical to what safetensors' own reader gives
(then ``.to(dtype)``), for bf16 and fp32 checkpoints, several shards, tied
embeddings, any thread count and chunk size, and the staged (GPU) bookkeeping run
on CPU. Each corrupt header is a one-line WeightsError naming the file.
"""

from __future__ import annotations

import dataclasses
import json
import math
import struct
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner

from artifactcache import api
from artifactcache.cli.app import app
from artifactcache.errors import ArgumentError, WeightsError
from artifactcache.models import WeightsSpec, build_model
from artifactcache.models.safetensors_io import (
    CHUNK_MB_ENV,
    THREADS_ENV,
    read_header,
    read_into,
    resolve_chunk_bytes,
    resolve_threads,
)
from artifactcache.models.weights import load_checkpoint
from artifactcache.recipes import load_recipe
from artifactcache.sources.checkpoint import INDEX_NAME

LAYER = "model.layers.1.self_attn.k_proj.weight"


def _recipe(tied: bool = False):
    r = load_recipe("tiny-llama")
    return dataclasses.replace(r, model=dataclasses.replace(r.model, tie_embeddings=tied))


def _state(dtype: torch.dtype, tied: bool = False, seed: int = 3) -> dict[str, torch.Tensor]:
    """A tiny-llama state dict with distinct values everywhere (norms too)."""
    model = build_model(_recipe(tied), weights=WeightsSpec(seed=seed))
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for name, t in model.state_dict().items():
        if tied and name == "lm_head.weight":
            continue  # saved once, as transformers does for tied embeddings
        out[name] = (t.float() + 0.01 * torch.randn(t.shape, generator=gen)).to(dtype)
    return out


def _save_sharded(state: dict[str, torch.Tensor], folder: Path, shards: int) -> Path:
    """HF layout: model-0000i-of-0000n.safetensors + the index naming each tensor's shard."""
    folder.mkdir(parents=True, exist_ok=True)
    names = list(state)
    weight_map = {}
    for i in range(shards):
        part = names[i::shards]
        fname = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        save_file({k: state[k].contiguous() for k in part}, str(folder / fname))
        weight_map.update(dict.fromkeys(part, fname))
    (folder / INDEX_NAME).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return folder


def _reference(folder: Path) -> dict[str, torch.Tensor]:
    out = {}
    for f in sorted(folder.glob("*.safetensors")):
        out.update(load_file(str(f)))
    return out


def _bits(t: torch.Tensor) -> torch.Tensor:
    """The raw bytes, so that equality is bit equality (NaN payloads, -0.0 included)."""
    return t.detach().contiguous().reshape(-1).view(torch.uint8)


@pytest.fixture(params=["map", "read"])
def load_path(request, monkeypatch) -> str:
    """Both CPU loads: the file map, and the GPU reader run on CPU destinations."""
    if request.param == "read":
        from artifactcache.models import weights

        monkeypatch.setattr(weights, "maps_files", lambda device: False)
    return request.param


@pytest.mark.parametrize(
    ("stored", "model_dtype", "tied", "shards"),
    [
        (torch.bfloat16, "bf16", False, 3),
        (torch.float32, "fp32", False, 4),
        (torch.bfloat16, "bf16", True, 2),
        (torch.float32, "bf16", False, 3),  # converted while loading
        (torch.bfloat16, "fp32", True, 1),
    ],
)
def test_loaded_tensors_are_bit_identical_to_safetensors_reader(
    stored, model_dtype, tied, shards, load_path: str, tmp_path: Path
):
    folder = _save_sharded(_state(stored, tied), tmp_path / "ckpt", shards)
    want = _reference(folder)
    model = build_model(_recipe(tied), dtype=model_dtype, weights=WeightsSpec(folder))
    target = model.lm_head.weight.dtype
    got = model.state_dict()
    assert set(got) == set(want) | ({"lm_head.weight"} if tied else set())
    for name, ref in want.items():
        assert torch.equal(_bits(got[name]), _bits(ref.to(target))), name
    if tied:
        assert model.lm_head.weight is model.model.embed_tokens.weight


@pytest.mark.parametrize(("threads", "chunk_bytes"), [(1, 4096), (3, 4096), (8, 1 << 20)])
def test_thread_count_and_chunk_size_never_change_the_result(threads, chunk_bytes, tmp_path: Path):
    """The GPU reader's bookkeeping, run on CPU destinations: 4 KiB chunks split every
    large tensor into many pieces; 1 MiB ones pack the small tensors into shared buffers."""
    folder = _save_sharded(_state(torch.float32), tmp_path / "ckpt", 3)
    want = _reference(folder)
    for dtype in (torch.float32, torch.bfloat16):
        pairs = []
        for f in sorted(folder.glob("*.safetensors")):
            for t in read_header(f):
                pairs.append((t, torch.full(t.shape, float("nan"), dtype=dtype)))
        read_into(pairs, threads=threads, chunk_bytes=chunk_bytes)
        for t, dest in pairs:
            assert torch.equal(_bits(dest), _bits(want[t.name].to(dtype))), t.name


def _write_raw(path: Path, tensors: list[tuple[str, str, list[int], bytes]]) -> Path:
    """A safetensors file laid out by hand, tensors back to back with no alignment."""
    header, blob = {}, b""
    for name, code, shape, data in tensors:
        header[name] = {
            "dtype": code,
            "shape": shape,
            "data_offsets": [len(blob), len(blob) + len(data)],
        }
        blob += data
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + blob)
    return path


def test_unaligned_tensors_are_converted_correctly(tmp_path: Path):
    """A 3-element F16 tensor puts the F32 one after it at an offset that is no multiple
    of 4: the reader must still view it as float32 correctly."""
    half = torch.tensor([1.5, -2.0, 3.25], dtype=torch.float16)
    full = torch.arange(5000, dtype=torch.float32) / 7
    f = _write_raw(
        tmp_path / "odd.safetensors",
        [("a", "F16", [3], half.numpy().tobytes()), ("b", "F32", [5000], full.numpy().tobytes())],
    )
    pairs = [(t, torch.empty(t.shape, dtype=torch.bfloat16)) for t in read_header(f)]
    read_into(pairs, threads=2, chunk_bytes=8192)
    got = {t.name: d for t, d in pairs}
    assert torch.equal(got["a"], half.to(torch.bfloat16))
    assert torch.equal(got["b"], full.to(torch.bfloat16))


def test_a_tied_head_saved_beside_its_embedding_keeps_the_tie(load_path: str, tmp_path: Path):
    state = _state(torch.float32, tied=True)
    state["lm_head.weight"] = state["model.embed_tokens.weight"].clone()
    folder = _save_sharded(state, tmp_path / "ckpt", 2)
    model = build_model(_recipe(tied=True), weights=WeightsSpec(folder))
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert torch.equal(model.lm_head.weight, state["model.embed_tokens.weight"])


# ------------------------------------------------------------------- errors --


def _single(tmp_path: Path) -> Path:
    p = tmp_path / "model.safetensors"
    save_file(_state(torch.float32), str(p))
    return p


def _header(data: bytes) -> tuple[int, dict]:
    n = struct.unpack("<Q", data[:8])[0]
    return n, json.loads(data[8 : 8 + n])


def _rewrite(path: Path, header: dict, data: bytes) -> None:
    n, _ = _header(data)
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data[8 + n :])


CORRUPT = {
    "tiny": "shorter than the 8-byte header length",
    "length": "header length",
    "not-json": "header is not valid JSON",
    "not-object": "header is not a JSON object",
    "offsets": "outside the file",
    "size": "its dtype and shape need",
    "dtype": "expected a float dtype",
    "shape-type": "has shape",
}


@pytest.mark.parametrize("how", list(CORRUPT))
def test_a_corrupt_file_is_one_line_naming_it_and_caches_nothing(
    how: str, tmp_path: Path, cache_dir: Path
):
    p = _single(tmp_path)
    data = p.read_bytes()
    n, header = _header(data)
    entry = header[LAYER]
    if how == "tiny":
        p.write_bytes(data[:5])
    elif how == "length":
        p.write_bytes(struct.pack("<Q", len(data)) + data[8:])
    elif how == "not-json":
        p.write_bytes(data[:8] + b"{" * n + data[8 + n :])
    elif how == "not-object":
        _rewrite(p, [1, 2], data)  # type: ignore[arg-type]
    elif how == "offsets":
        entry["data_offsets"] = [entry["data_offsets"][0], len(data)]
        _rewrite(p, header, data)
    elif how == "size":
        entry["shape"] = [entry["shape"][0], entry["shape"][1] - 1]
        _rewrite(p, header, data)
    elif how == "dtype":
        entry["dtype"] = "Q9"
        _rewrite(p, header, data)
    else:
        entry["shape"] = ["16", 64]
        _rewrite(p, header, data)
    r = CliRunner().invoke(app, ["build", "tiny-llama", "-b", "eager", "--weights", str(p)])
    lines = r.stderr.strip().splitlines()
    assert r.exit_code == 1 and len(lines) == 1, r.stderr
    assert lines[0].startswith("error: ") and str(p) in lines[0] and CORRUPT[how] in lines[0]
    assert "Traceback" not in r.stderr
    if how not in ("tiny", "length", "not-json", "not-object"):
        assert LAYER in lines[0]
    assert not (cache_dir / "v1" / "entries").exists() or not any(
        (cache_dir / "v1" / "entries").rglob("manifest.json")
    )


def test_a_file_truncated_after_its_header_was_read_is_one_line(tmp_path: Path):
    p = _single(tmp_path)
    pairs = [(t, torch.empty(t.shape)) for t in read_header(p)]
    p.write_bytes(p.read_bytes()[:-100])  # shorter than the header just read says
    with pytest.raises(WeightsError, match="the file ends at byte") as ei:
        read_into(pairs, threads=4, chunk_bytes=1 << 16)
    assert "\n" not in str(ei.value)


def test_a_tensor_in_two_shards_is_refused(tmp_path: Path):
    state = _state(torch.float32)
    folder = _save_sharded(state, tmp_path / "ckpt", 2)
    owner = json.loads((folder / INDEX_NAME).read_text())["weight_map"][LAYER]
    other = next(f for f in folder.glob("*.safetensors") if f.name != owner)
    again = load_file(str(other))
    again[LAYER] = state[LAYER]
    save_file(again, str(other))
    with pytest.raises(WeightsError, match="is also in") as ei:
        build_model(_recipe(), weights=WeightsSpec(folder))
    assert LAYER in str(ei.value)


def test_checks_run_before_any_memory_is_allocated(load_path: str, tmp_path: Path, monkeypatch):
    """A missing tensor is found from the headers: nothing is materialized or mapped."""
    from artifactcache.models import weights

    state = _state(torch.float32)
    del state[LAYER]
    p = tmp_path / "model.safetensors"
    save_file(state, str(p))
    calls = []
    monkeypatch.setattr(weights, "materialize", lambda *a: calls.append(a))
    monkeypatch.setattr(weights, "_map_on_cpu", lambda *a: calls.append(a))
    with pytest.raises(WeightsError, match=f"'{LAYER}' is missing"):
        build_model(_recipe(), weights=WeightsSpec(p))
    assert calls == []


def test_a_load_stamps_its_steps(load_path: str, tmp_path: Path):
    """The probe's subphases split the weights phase: checked, then (GPU reader) allocated."""
    import time

    stamps: dict[str, float] = {}
    t0 = time.perf_counter()
    build_model(_recipe(), weights=WeightsSpec(_single(tmp_path)), stamps=stamps)
    want = ["weights_checked"] + (["weights_allocated"] if load_path == "read" else [])
    assert sorted(stamps) == sorted(want)
    assert t0 <= stamps["weights_checked"] <= stamps.get("weights_allocated", math.inf)


# ------------------------------------------------------------------ options --


def test_threads_and_chunk_come_from_the_arguments_then_the_environment(monkeypatch):
    monkeypatch.delenv(THREADS_ENV, raising=False)
    monkeypatch.delenv(CHUNK_MB_ENV, raising=False)
    assert 1 <= resolve_threads(None) <= 8
    assert resolve_chunk_bytes(None) == 16 << 20
    monkeypatch.setenv(THREADS_ENV, "3")
    monkeypatch.setenv(CHUNK_MB_ENV, "2")
    assert resolve_threads(None) == 3 and resolve_chunk_bytes(None) == 2 << 20
    assert resolve_threads(5) == 5 and resolve_chunk_bytes(8192) == 8192


@pytest.mark.parametrize(
    ("var", "value"), [(THREADS_ENV, "0"), (THREADS_ENV, "many"), (CHUNK_MB_ENV, "-1")]
)
def test_a_bad_loader_setting_is_one_line(var, value, monkeypatch, tmp_path: Path, cache_dir):
    p = _single(tmp_path)
    monkeypatch.setenv(var, value)
    r = CliRunner().invoke(app, ["build", "tiny-llama", "-b", "eager", "--weights", str(p)])
    lines = r.stderr.strip().splitlines()
    assert r.exit_code == 1 and len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    assert var in lines[0] and repr(value) in lines[0]
    assert not any(cache_dir.rglob("manifest.json"))


@pytest.mark.parametrize("kw", [{"threads": 0}, {"chunk_bytes": 4097}, {"chunk_bytes": 0}])
def test_bad_loader_arguments_are_refused(kw, tmp_path: Path):
    p = _single(tmp_path)
    with torch.device("meta"):
        from artifactcache.models import architecture

        model = architecture(_recipe())
    with pytest.raises(ArgumentError):
        load_checkpoint(model, p, torch.device("cpu"), **kw)


def test_the_loader_gives_the_old_logits(load_path: str, tmp_path: Path, cache_dir: Path):
    """End to end through api.load: a sharded bf16 checkpoint, eager, equals the model
    built from safetensors' own tensors with load_state_dict."""
    folder = _save_sharded(_state(torch.bfloat16), tmp_path / "ckpt", 3)
    ids = [1, 5, 9, 200, 3]
    got = api.load("tiny-llama", "eager", weights=folder, dtype="bf16").logits(ids)
    ref = build_model(_recipe(), dtype="bf16")
    ref.load_state_dict(_reference(folder), strict=True)
    with torch.no_grad():
        # logits() reads every position through the masked path (row_start given).
        want = ref(torch.tensor([ids]), torch.arange(len(ids)), torch.zeros(1, dtype=torch.long))
        want = want[0].float()
    assert torch.equal(got, want)
