"""benchmarks/checkpoint_loading.py, checked on CPU at tiny shapes: the checkpoint the
GPU evidence writes (layout, config, weight scales, reuse) and its shard plan."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from _bench_scripts import load_script

from artifactcache.models import WeightsSpec, build_model
from artifactcache.recipes import load_recipe
from artifactcache.sources.checkpoint import INDEX_NAME, checkpoint_files


@pytest.fixture(scope="module")
def cl():
    return load_script("checkpoint_loading")


@pytest.fixture(scope="module")
def tiny_folder(cl, tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("ckpt")
    assert cl.write_checkpoint(folder, cl.base_recipe(tiny=True))["reused"] is False
    return folder


def test_the_checkpoint_is_laid_out_as_transformers_saves_one(cl, tiny_folder: Path):
    shards = sorted(p.name for p in tiny_folder.glob("*.safetensors"))
    n = len(shards)  # tiny-llama's two embedding tables fill a shard each: 3 of at most 4
    assert 1 < n <= 4 and shards == [
        f"model-{i:05d}-of-{n:05d}.safetensors" for i in range(1, n + 1)
    ]
    index = json.loads((tiny_folder / INDEX_NAME).read_text())
    names = set(cl.tensor_shapes(cl.base_recipe(tiny=True)))
    assert set(index["weight_map"]) == names and set(index["weight_map"].values()) == set(shards)
    assert index["metadata"]["total_size"] == cl.checkpoint_bytes(tiny_folder)
    assert [p.name for p in checkpoint_files(tiny_folder).shards] == shards


def test_its_config_derives_the_base_recipes_architecture(cl, tiny_folder: Path):
    """So that `RECIPE --weights DIR` accepts the folder, and llama-7b's keys can match."""
    base = cl.base_recipe(tiny=True)
    derived = load_recipe(str(tiny_folder)).with_shapes(max_seq_len=base.shapes.max_seq_len)
    assert derived.normalized()["model"] == base.normalized()["model"]
    assert derived.family == base.family == "llama"


def test_the_weights_load_and_have_the_scales_of_random_init(cl, tiny_folder: Path):
    base = cl.base_recipe(tiny=True)
    model = build_model(base, dtype="bf16", weights=WeightsSpec(tiny_folder))
    for name, p in model.named_parameters():
        if p.ndim == 1:
            assert torch.all(p == 1), name
        elif not name.endswith("embed_tokens.weight"):
            std = p.float().std().item()
            assert abs(std - p.shape[1] ** -0.5) < 0.1 * p.shape[1] ** -0.5, name


def test_a_matching_folder_is_reused_and_another_seed_rewrites_it(cl, tmp_path: Path):
    base = cl.base_recipe(tiny=True)
    assert cl.write_checkpoint(tmp_path, base, seed=1)["reused"] is False
    assert cl.write_checkpoint(tmp_path, base, seed=1)["reused"] is True
    assert cl.write_checkpoint(tmp_path, base, seed=2)["reused"] is False


def test_the_shard_plan_keeps_order_and_balances_bytes(cl):
    shapes = cl.tensor_shapes(cl.base_recipe(tiny=False))  # llama-7b's 291 tensors, on meta
    plan = cl.shard_plan(shapes, 4)
    assert [n for part in plan for n in part] == list(shapes)
    sizes = [sum(math.prod(shapes[n]) for n in part) for part in plan]
    assert len(plan) == 4 and max(sizes) < 1.3 * min(sizes)
    assert sum(sizes) * 2 > 13e9  # bf16: the 13.5 GB the issue measured


def test_the_sweep_spec_parses(cl):
    assert cl.parse_sweep("8x16, 4x64") == [(8, 16), (4, 64)]


def test_the_sweep_times_every_loader_and_checks_bits(cl, tiny_folder: Path):
    derived = load_recipe(str(tiny_folder))
    rows = cl.loader_sweep(derived, tiny_folder, "cpu", [(1, 1), (2, 1)], repeats=1)
    assert [r["loader"] for r in rows] == [
        "safe_open per tensor (before)",
        "load_checkpoint (maps the files)",
        "GPU reader into host memory: 1 threads x 1 MiB",
        "GPU reader into host memory: 2 threads x 1 MiB",
    ]
    assert all(len(r["seconds"]) == 1 and r["best_gbps"] > 0 for r in rows)
    assert cl.same_as_safe_open(derived, tiny_folder, "cpu")["identical"] is True
