"""Checkpoint folders as recipes: transformers-saved tiny models against transformers.

Each case is a config no built-in recipe has (dims, heads, kv heads, head_dim, rope
scaling, tying, biases). The folder goes through ``api.load(DIR, "eager")``, i.e.
config.json -> recipe, the folder's safetensors -> weights, the cache, the runner.
The 48-token comparison runs both the loaded runner's model forward
(``runner.keepalive``, one call) and its public ``logits()`` (chunked prefill).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch

from artifactcache import api
from artifactcache.recipes import load_recipe, recipe_to_toml
from artifactcache.sources.hf import recipe_from_config

transformers = pytest.importorskip("transformers")
T = transformers

from _hf_checkpoints import CASES, COMMON, SEQ, save_hf  # noqa: E402  (needs transformers)


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, tuple[Path, Any]]:
    out = {}
    for name, (cfg, cls, kw) in CASES.items():
        d = tmp_path_factory.mktemp(name)
        out[name] = (d, save_hf(cfg, cls, kw, d))
    return out


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).abs().max() / b.abs().max()).item()


@pytest.mark.parametrize("name", list(CASES))
def test_folder_gives_transformers_logits(name: str, folders, cache_dir: Path):
    folder, hf = folders[name]
    runner = api.load(folder, "eager", cache_dir=cache_dir)
    ids = [(7 * i + 3) % COMMON["vocab_size"] for i in range(SEQ)]
    x, pos = torch.tensor([ids]), torch.arange(SEQ)
    model = runner.keepalive
    with torch.no_grad():
        want = hf(x).logits[0].float()
        served = model(x, pos)  # as the backends serve it: the last position only
        assert served.shape[1] == 1 and rel_err(served[0, -1], want[-1]) <= 1e-4
        model.first_pass_last_logits = False  # every position of the same causal path
        paths = {
            "causal first pass": model(x, pos)[0],
            "masked cache read": model(x, pos, torch.zeros(1, dtype=torch.long))[0],
            "runner": runner.logits(ids),
        }
    for path, got in paths.items():
        assert got.shape == want.shape, path
        assert rel_err(got, want) <= 1e-4, (path, rel_err(got, want))


@pytest.mark.parametrize("name", ["llama", "mistral", "phi-2"])
def test_a_prompt_in_several_passes_gives_transformers_logits(
    name: str, folders, tmp_path: Path, cache_dir: Path
):
    """Passes of 16 tokens (a recipe TOML of the folder with prefill_len written): the
    later passes read the cache through the mask (mistral's window is 12)."""
    folder, hf = folders[name]
    text = recipe_to_toml(load_recipe(folder)).replace("[shapes]\n", "[shapes]\nprefill_len = 16\n")
    toml = tmp_path / "passes.toml"
    toml.write_text(text)
    runner = api.load(toml, "eager", cache_dir=cache_dir)
    assert runner.recipe.shapes.prefill_len == 16 < SEQ
    ids = [(7 * i + 3) % COMMON["vocab_size"] for i in range(SEQ)]
    with torch.no_grad():
        want = hf(torch.tensor([ids])).logits[0].float()
    assert rel_err(runner.logits(ids), want) <= 1e-4


def test_the_config_is_read_not_guessed(folders):
    """Guards the parity test: the derived recipe carries what each config says."""
    r = {n: load_recipe(folders[n][0]) for n in CASES}
    assert r["llama-3.1-rope"].model.rope_scaling == {
        "type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 256,
    }  # fmt: skip
    assert r["llama-3.2-tied"].model.tie_embeddings is True
    m = r["llama-biases-head-dim"].model
    assert (m.head_dim, m.attention_bias, m.mlp_bias) == (24, True, True)
    assert r["mistral"].model.sliding_window == 12 and r["mistral"].model.rope_theta == 1e6
    assert r["phi-2"].family == "phi-2" and r["phi-2"].model.rotary_dim == 6
    assert r["phi-3"].model.sliding_window == 20
    lr = r["phi-3-longrope"].model.rope_scaling
    assert lr["type"] == "longrope" and lr["original_max_position_embeddings"] == 64
    assert math.isclose(lr["attention_factor"], math.sqrt(1 + math.log(8) / math.log(64)))
    assert r["phi-3-longrope"].shapes.max_seq_len == 64  # capped: long factors unsupported
    # max_position_embeddings (512) is under the 4096 cap: the whole context.
    assert r["llama"].shapes.max_seq_len == 512 and r["llama"].shapes.prefill_len == 511
    q2 = r["qwen2"].model
    assert r["qwen2"].family == "qwen2" and (q2.qkv_bias, q2.attention_bias) == (True, False)
    assert (q2.qk_norm, q2.sliding_window, q2.tie_embeddings, q2.rope_theta) == (
        False, None, False, 1e6)  # fmt: skip
    assert r["qwen2.5-tied"].model.tie_embeddings and r["qwen2.5-tied"].model.norm_eps == 1e-5
    assert r["qwen2-sliding"].model.sliding_window == 12
    assert r["qwen2-linear-rope"].model.rope_scaling == {"type": "linear", "factor": 2.0}
    q3 = r["qwen3"].model
    assert r["qwen3"].family == "qwen3" and (q3.qk_norm, q3.head_dim, q3.qkv_bias) == (
        True, 24, False)  # fmt: skip
    q3b = r["qwen3-tied-bias"].model
    assert (q3b.attention_bias, q3b.tie_embeddings, q3b.head_dim) == (True, True, 32)
    assert r["qwen3-llama3-rope"].model.rope_scaling["type"] == "llama3"


@pytest.mark.parametrize(
    "name", ["llama-3.1-rope", "phi-3-longrope", "mistral", "qwen2-sliding", "qwen3-llama3-rope"]
)
def test_each_rope_or_window_feature_changes_the_logits(name: str, folders):
    """Without the scaling / window the same weights give other logits, so the parity
    test above would catch a loader that dropped them."""
    import dataclasses

    from artifactcache.models import WeightsSpec, build_model

    folder, _ = folders[name]
    rec = load_recipe(folder)
    plain = dataclasses.replace(
        rec, model=dataclasses.replace(rec.model, rope_scaling=None, sliding_window=None)
    )
    x = torch.tensor([list(range(5, 5 + SEQ))])
    with torch.no_grad():
        a = build_model(rec, weights=WeightsSpec(folder))(x, torch.arange(SEQ))
        b = build_model(plain, weights=WeightsSpec(folder))(x, torch.arange(SEQ))
    assert rel_err(a[0], b[0]) > 1e-3


def test_llama3_inv_freq_matches_transformers():
    """The llama3 rope-scaling maths, against transformers' own function."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from artifactcache.models.rope import rope_inv_freq

    hf_cfg = T.LlamaConfig(
        hidden_size=2048, num_attention_heads=16, rope_theta=5e5, max_position_embeddings=131072,
        rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
    )  # fmt: skip
    want, scale = ROPE_INIT_FUNCTIONS["llama3"](hf_cfg, "cpu")
    data = json.loads(hf_cfg.to_json_string())
    ours = rope_inv_freq(recipe_from_config(data, "config.json", Path("llama-3.1")).model)
    assert scale == 1.0 and ours.shape == want.shape
    # All three bands occur at these settings, so each branch is compared.
    wavelen = 2 * math.pi / want
    assert (wavelen < 8192 / 4).any() and (wavelen > 8192).any()
    assert ((wavelen >= 8192 / 4) & (wavelen <= 8192)).any()
    assert torch.allclose(ours, want.float(), rtol=1e-5, atol=0)


def test_derived_toml_loads_back_with_the_same_key(folders, tmp_path: Path, cache_dir: Path):
    from artifactcache.backends.base import get_backend

    folder, _ = folders["llama-3.1-rope"]
    toml = tmp_path / "mine.toml"
    toml.write_text(recipe_to_toml(load_recipe(folder)))
    from_folder = api.make_context(folder, "eager")
    from_toml = api.make_context(toml, "eager")
    b = get_backend("eager")
    assert from_toml[1].recipe.weights == folder
    assert api.key_for(b, from_folder[1]).key == api.key_for(b, from_toml[1]).key
    # An edited shape is another key, with the same weights.
    edited = tmp_path / "edited.toml"
    assert "max_seq_len = 512" in toml.read_text()  # the folder's max_position_embeddings
    edited.write_text(toml.read_text().replace("max_seq_len = 512", "max_seq_len = 128"))
    assert (
        api.key_for(b, api.make_context(edited, "eager")[1]).key
        != api.key_for(b, from_folder[1]).key
    )


@pytest.mark.parametrize("name", ["qwen2", "qwen3-tied-bias", "qwen2-sliding"])
def test_qwen_recipe_toml_round_trips(name: str, folders, tmp_path: Path):
    """The printed TOML carries the family's flags (qkv_bias, qk_norm) and reads back equal."""
    rec = load_recipe(folders[name][0])
    text = recipe_to_toml(rec)
    assert ("qkv_bias = true" in text) == (rec.family == "qwen2")
    assert ("qk_norm = true" in text) == (rec.family == "qwen3")
    (tmp_path / "r.toml").write_text(text)
    assert load_recipe(tmp_path / "r.toml") == rec
