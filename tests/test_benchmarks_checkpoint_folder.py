"""benchmarks/checkpoint_folder.py, the GPU evidence script, checked on CPU at tiny shapes:
the checkpoint it writes, its shard plan, and the report it derives from probe results.
The whole script also runs end to end on CPU (`--tiny --device cpu`, its docstring)."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest
import torch

from artifactcache.models import WeightsSpec, build_model
from artifactcache.recipes import load_recipe
from artifactcache.sources.checkpoint import INDEX_NAME, checkpoint_files

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "checkpoint_folder.py"


@pytest.fixture(scope="module")
def cf():
    spec = importlib.util.spec_from_file_location("checkpoint_folder", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def tiny_folder(cf, tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("ckpt")
    assert cf.write_checkpoint(folder, cf.base_recipe(tiny=True))["reused"] is False
    return folder


def test_the_checkpoint_is_laid_out_as_transformers_saves_one(cf, tiny_folder: Path):
    shards = sorted(p.name for p in tiny_folder.glob("*.safetensors"))
    n = len(shards)  # tiny-llama's two embedding tables fill a shard each: 3 of at most 4
    assert 1 < n <= 4 and shards == [
        f"model-{i:05d}-of-{n:05d}.safetensors" for i in range(1, n + 1)
    ]
    index = json.loads((tiny_folder / INDEX_NAME).read_text())
    names = set(cf.tensor_shapes(cf.base_recipe(tiny=True)))
    assert set(index["weight_map"]) == names and set(index["weight_map"].values()) == set(shards)
    assert index["metadata"]["total_size"] == cf.checkpoint_bytes(tiny_folder)
    assert [p.name for p in checkpoint_files(tiny_folder).shards] == shards


def test_its_config_derives_the_base_recipes_architecture(cf, tiny_folder: Path):
    """So that `RECIPE --weights DIR` accepts the folder, and llama-7b's keys can match."""
    base = cf.base_recipe(tiny=True)
    derived = load_recipe(str(tiny_folder)).with_shapes(max_seq_len=base.shapes.max_seq_len)
    assert derived.normalized()["model"] == base.normalized()["model"]
    assert derived.family == base.family == "llama"


def test_the_weights_load_and_have_the_scales_of_random_init(cf, tiny_folder: Path):
    base = cf.base_recipe(tiny=True)
    model = build_model(base, dtype="bf16", weights=WeightsSpec(tiny_folder))
    for name, p in model.named_parameters():
        if p.ndim == 1:
            assert torch.all(p == 1), name
        elif not name.endswith("embed_tokens.weight"):
            std = p.float().std().item()
            assert abs(std - p.shape[1] ** -0.5) < 0.1 * p.shape[1] ** -0.5, name


def test_a_matching_folder_is_reused_and_another_seed_rewrites_it(cf, tmp_path: Path):
    base = cf.base_recipe(tiny=True)
    assert cf.write_checkpoint(tmp_path, base, seed=1)["reused"] is False
    assert cf.write_checkpoint(tmp_path, base, seed=1)["reused"] is True
    assert cf.write_checkpoint(tmp_path, base, seed=2)["reused"] is False


def test_the_shard_plan_keeps_order_and_balances_bytes(cf):
    shapes = cf.tensor_shapes(cf.base_recipe(tiny=False))  # llama-7b's 291 tensors, on meta
    plan = cf.shard_plan(shapes, 4)
    assert [n for part in plan for n in part] == list(shapes)
    sizes = [sum(math.prod(shapes[n]) for n in part) for part in plan]
    assert len(plan) == 4 and max(sizes) < 1.3 * min(sizes)
    assert sum(sizes) * 2 > 13e9  # bf16: the 13.5 GB the issue measured


def test_the_phases_of_a_probe_are_its_warm_start_segments(cf):
    result = {
        "built": False,
        "phases": {
            "imports_done": 3.0, "entry_ready": 3.2, "weights_ready": 4.6,
            "artifact_ready": 4.9, "first_result": 5.0,
        },
        "subphases": {"device_ready": 3.35, "weights_checked": 3.4, "weights_allocated": 3.5},
    }  # fmt: skip
    ph = cf.phases(result, nbytes=int(12.5e9))
    assert ph["lookup_s"] == pytest.approx(0.2) and ph["context_s"] == pytest.approx(0.15)
    assert ph["weights_s"] == pytest.approx(1.25) and ph["weights_gbps"] == pytest.approx(10.0)
    assert ph["weights_read_s"] == pytest.approx(1.1)
    assert ph["ttft_over_imports_s"] == pytest.approx(2.0)


def test_the_report_renders_results_and_failures(cf):
    run = {
        "run": 1, "built": False, "imports_s": 3.0, "lookup_s": 0.2, "context_s": 0.1,
        "weights_s": 1.0, "weights_gbps": 13.5, "artifact_s": 0.3, "first_token_s": 0.1,
        "ttft_s": 4.7, "ttft_over_imports_s": 1.7, "decode_tok_s": 180.0,
    }  # fmt: skip
    report = {
        "date": "d", "host": "h", "command": "c",
        "checkpoint": {"folder": "/x", "tensor_bytes": 13.5e9, "shards": 4,
                       "page_cache_read": {"gbps": 9.0}},
        "sweep": [{"loader": "old", "seconds": [3.1], "gbps": [4.4], "best_gbps": 4.4},
                  {"loader": "new", "error": "RuntimeError: boom"}],
        "keys": {"folder": {"key": "a" * 64, "arch_key": "a" * 64}, "recipe": {"error": "no"}},
        "keys_equal": False,
        "probes": {"folder (TOML)": {"runs": [run], "decode_tok_s": 180.0},
                   "llama-7b --weights DIR": {"error": "probe failed: miss", "runs": []}},
    }  # fmt: skip
    md = cf.render(report)
    assert "| new | error: RuntimeError: boom |" in md
    assert "| folder (TOML) | 1 | no | 3.00 s |" in md and "| 13.5 |" in md
    assert "llama-7b --weights DIR | – | error: probe failed: miss" in md
    assert "share one entry: **False**" in md


def test_the_sweep_spec_parses(cf):
    assert cf.parse_sweep("8x16, 4x64") == [(8, 16), (4, 64)]
