"""The weights digest covers exactly the files the loader reads (sources/checkpoint.py).

With an index: the shards it names plus the index. Without: model.safetensors where
the folder has one, else the *.safetensors files. Stray .bin/.pt files, a safetensors
the index does not name or beside model.safetensors, and the raw bytes of config.json
are never read by the loader, so they never change the key.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from artifactcache import api
from artifactcache.cli.app import app
from artifactcache.errors import WeightsError
from artifactcache.keys import weights_digest
from artifactcache.sources.checkpoint import INDEX_NAME, checkpoint_files

transformers = pytest.importorskip("transformers")
T = transformers


def _llama(out: Path, **save_kw) -> Path:
    torch.manual_seed(0)
    cfg = T.LlamaConfig(
        vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=128,
    )  # fmt: skip
    T.LlamaForCausalLM(cfg).save_pretrained(out, **save_kw)
    return out


@pytest.fixture
def single(tmp_path: Path) -> Path:
    return _llama(tmp_path / "single")


@pytest.fixture
def sharded(tmp_path: Path) -> Path:
    d = _llama(tmp_path / "sharded", max_shard_size="40KB")
    assert (d / INDEX_NAME).is_file() and len(list(d.glob("*.safetensors"))) > 1
    return d


def test_stray_bin_and_pt_files_do_not_change_the_digest(single: Path):
    before = weights_digest(single)
    torch.save({"x": torch.ones(3)}, single / "pytorch_model.bin")
    (single / "training_args.pt").write_bytes(b"\0" * 64)
    (single / "tokenizer.json").write_text("{}")
    assert weights_digest(single) == before
    assert [f.name for f in checkpoint_files(single).hashed] == ["model.safetensors"]


def test_a_safetensors_the_index_does_not_name_is_neither_read_nor_hashed(
    sharded: Path, cache_dir: Path
):
    before = weights_digest(sharded)
    from safetensors.torch import save_file

    save_file({"unrelated": torch.zeros(4)}, str(sharded / "adapter_model.safetensors"))
    assert weights_digest(sharded) == before
    api.build(sharded, "eager", cache_dir=cache_dir)  # the loader ignores it too
    names = [f.name for f in checkpoint_files(sharded).hashed]
    assert names[0] == INDEX_NAME and "adapter_model.safetensors" not in names


def test_beside_model_safetensors_another_safetensors_is_neither_read_nor_hashed(
    single: Path, cache_dir: Path
):
    """As transformers loads a folder: its model.safetensors, not an adapter beside it."""
    before = weights_digest(single)
    from safetensors.torch import save_file

    save_file({"x": torch.zeros(4)}, str(single / "adapter_model.safetensors"))
    assert weights_digest(single) == before
    api.build(single, "eager", cache_dir=cache_dir)  # no "unexpected tensor 'x'"
    assert [f.name for f in checkpoint_files(single).hashed] == ["model.safetensors"]
    # Without model.safetensors every safetensors file is the checkpoint.
    (single / "model.safetensors").rename(single / "weights.safetensors")
    names = [f.name for f in checkpoint_files(single).hashed]
    assert names == ["adapter_model.safetensors", "weights.safetensors"]


def test_a_changed_shard_or_index_changes_the_digest(sharded: Path):
    before = weights_digest(sharded)
    shard = checkpoint_files(sharded).shards[-1]
    data = bytearray(shard.read_bytes())
    data[-1] ^= 1  # a flipped bit in the last tensor's bytes
    shard.write_bytes(bytes(data))
    after = weights_digest(sharded)
    assert after != before
    index = json.loads((sharded / INDEX_NAME).read_text())
    index["metadata"] = {"total_size": 1}
    (sharded / INDEX_NAME).write_text(json.dumps(index))
    assert weights_digest(sharded) != after


def test_config_json_reaches_the_key_only_through_the_recipe(single: Path, cache_dir: Path):
    key = api.build(single, "eager", cache_dir=cache_dir).key
    cfg = json.loads((single / "config.json").read_text())
    cfg["_name_or_path"] = "somewhere/else"  # no architecture field: same artifact
    (single / "config.json").write_text(json.dumps(cfg, indent=4))
    assert api.build(single, "eager", cache_dir=cache_dir).key == key
    cfg["rope_parameters"]["rope_theta"] = 20000.0  # architecture: another key
    (single / "config.json").write_text(json.dumps(cfg))
    assert api.build(single, "eager", cache_dir=cache_dir).key != key


def test_sharded_folder_gives_the_single_file_logits(single: Path, sharded: Path, cache_dir):
    ids = [1, 5, 9, 200, 3]
    a = api.load(single, "eager", cache_dir=cache_dir).logits(ids)
    b = api.load(sharded, "eager", cache_dir=cache_dir).logits(ids)
    assert torch.equal(a, b)


def _entries(root: Path) -> list[Path]:
    d = root / "v1" / "entries"
    return list(d.rglob("manifest.json")) if d.exists() else []


@pytest.mark.parametrize("how", ["missing", "outside", "not-json"])
def test_a_broken_index_is_one_line_and_caches_nothing(how: str, sharded: Path, cache_dir):
    index = sharded / INDEX_NAME
    if how == "missing":
        shard = checkpoint_files(sharded).shards[0]
        shard.unlink()
        want = f"{shard}: listed in {INDEX_NAME} but missing"
    elif how == "outside":
        data = json.loads(index.read_text())
        data["weight_map"][next(iter(data["weight_map"]))] = "../elsewhere.safetensors"
        index.write_text(json.dumps(data))
        want = "must be a .safetensors file name in the folder"
    else:
        index.write_text("{")
        want = "not valid JSON"
    with pytest.raises(WeightsError) as ei:
        weights_digest(sharded)
    assert want in str(ei.value)
    for args in (["build", sharded], ["key", sharded, "-b", "eager"]):
        r = CliRunner().invoke(app, [str(a) for a in args])
        lines = r.stderr.strip().splitlines()
        assert r.exit_code == 1 and len(lines) == 1 and want in lines[0], r.stderr
        assert "Traceback" not in r.stderr
    assert _entries(cache_dir) == []


def test_a_single_file_and_a_non_safetensors_file(single: Path, tmp_path: Path):
    f = tmp_path / "w.safetensors"
    shutil.copy(single / "model.safetensors", f)
    assert checkpoint_files(f).hashed == [f]
    bad = tmp_path / "w.bin"
    bad.write_bytes(b"x")
    with pytest.raises(WeightsError, match="only .safetensors"):
        weights_digest(bad)
