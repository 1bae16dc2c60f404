"""Fused projections (models/fuse.py): same logits and tokens as the checkpoint's layout,
the old tensors freed, and transformers-saved checkpoints still load by their names.
Phi-2's fused block (in_proj, out_proj) is tested alike."""

from __future__ import annotations

import gc
import weakref
from pathlib import Path

import pytest
import torch
from _backend_util import rel_err

from artifactcache import api
from artifactcache.models import build_model
from artifactcache.models.fuse import fuse_projections
from artifactcache.recipes import load_recipe

FUSABLE = ["tiny-llama", "tiny-mistral", "tiny-qwen2", "tiny-qwen3"]
SEQ = 16


def _logits(model: torch.nn.Module, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([ids]), torch.arange(len(ids)))[0]


@pytest.mark.parametrize("name", FUSABLE)
def test_fused_model_gives_the_unfused_logits_and_tokens(name: str, cache_dir: Path):
    rec = load_recipe(name)
    ids = [(31 * i + 7) % rec.model.vocab_size for i in range(SEQ)]
    plain = build_model(rec)
    fused = build_model(rec, fuse_projections=True)
    attn, mlp = fused.model.layers[0].self_attn, fused.model.layers[0].mlp
    assert attn.fused and mlp.fused
    assert not hasattr(attn, "q_proj") and not hasattr(mlp, "gate_proj")
    assert attn.qkv_proj.weight.shape[0] == attn.q_size + 2 * attn.kv_size
    assert rel_err(_logits(fused, ids), _logits(plain, ids)) <= 1e-5
    prompt = list(rec.bench.prompt_ids)
    eager = api.load(name, "eager", cache_dir=cache_dir)
    eager_fused = api.load(name, "eager", extra={"fuse_projections": 1}, cache_dir=cache_dir)
    assert eager_fused.generate(prompt, 8) == eager.generate(prompt, 8)


def test_fusing_frees_the_old_projections_and_keeps_their_rows_in_order():
    rec = load_recipe("tiny-qwen2")  # biases on q/k/v: they are concatenated too
    model = build_model(rec)
    attn, mlp = model.model.layers[0].self_attn, model.model.layers[0].mlp
    old = [attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight, attn.q_proj.bias,
           mlp.gate_proj.weight, mlp.up_proj.weight]  # fmt: skip
    want_qkv = torch.cat([t.clone() for t in old[:3]])
    want_bias = torch.cat([attn.q_proj.bias, attn.k_proj.bias, attn.v_proj.bias]).clone()
    want_gate_up = torch.cat([t.clone() for t in old[4:]])
    refs = [weakref.ref(t) for t in old]
    del old
    assert fuse_projections(model) == 2 * rec.model.n_layers
    gc.collect()
    assert all(r() is None for r in refs), "an unfused tensor is still alive"
    assert torch.equal(attn.qkv_proj.weight, want_qkv)
    assert torch.equal(attn.qkv_proj.bias, want_bias)
    assert torch.equal(mlp.gate_up_proj.weight, want_gate_up)
    assert fuse_projections(model) == 0  # already fused: nothing left to do


def test_fused_phi2_gives_the_unfused_logits_and_tokens(cache_dir: Path):
    rec = load_recipe("tiny-phi-2")
    ids = [(31 * i + 7) % rec.model.vocab_size for i in range(SEQ)]
    plain = build_model(rec)
    fused = build_model(rec, fuse_projections=True)
    block = fused.model.layers[0]
    assert block.fused and block.outputs_fused
    assert not hasattr(block.self_attn, "q_proj") and not hasattr(block.mlp, "fc1")
    assert rel_err(_logits(fused, ids), _logits(plain, ids)) <= 1e-5
    prompt = list(rec.bench.prompt_ids)
    eager = api.load("tiny-phi-2", "eager", cache_dir=cache_dir)
    fuse = {"fuse_projections": 1}
    eager_fused = api.load("tiny-phi-2", "eager", extra=fuse, cache_dir=cache_dir)
    assert eager_fused.keepalive.model.layers[0].fused
    assert eager_fused.generate(prompt, 8) == eager.generate(prompt, 8)


def test_phi2_fusion_stacks_the_inputs_and_sums_the_outputs():
    model = build_model(load_recipe("tiny-phi-2"))
    block = model.model.layers[0]
    attn, mlp = block.self_attn, block.mlp
    ins = [attn.q_proj, attn.k_proj, attn.v_proj, mlp.fc1]
    want_in = torch.cat([p.weight for p in ins]).clone()
    want_in_bias = torch.cat([p.bias for p in ins]).clone()
    want_out = torch.cat([attn.dense.weight, mlp.fc2.weight], dim=1).clone()
    want_out_bias = (attn.dense.bias + mlp.fc2.bias).clone()
    refs = [weakref.ref(p.weight) for p in (*ins, attn.dense, mlp.fc2)]
    del ins
    assert fuse_projections(model) == len(model.model.layers)
    gc.collect()
    assert all(r() is None for r in refs), "an unfused tensor is still alive"
    assert torch.equal(block.in_proj.weight, want_in)
    assert torch.equal(block.in_proj.bias, want_in_bias)
    assert torch.equal(block.out_proj.weight, want_out)
    assert torch.equal(block.out_proj.bias, want_out_bias)
    assert block.out_proj.in_features == want_out.shape[1]
    assert fuse_projections(model) == 0


@pytest.mark.parametrize("quant", ["int8wo", "int4wo"])
def test_a_quantized_phi2_keeps_dense_and_fc2_apart(quant: str):
    """One int8 scale per output row: a row of [dense | fc2] would share it across both."""
    rec = load_recipe("tiny-phi-2")
    model = build_model(rec, fuse_projections=True, quant=quant)
    block = model.model.layers[0]
    assert block.fused and not block.outputs_fused and not hasattr(block, "out_proj")
    assert hasattr(block.self_attn, "dense") and hasattr(block.mlp, "fc2")
    ids = [(31 * i + 7) % rec.model.vocab_size for i in range(SEQ)]
    plain = build_model(rec, quant=quant)  # the same rows, the same scales
    assert rel_err(_logits(model, ids), _logits(plain, ids)) <= 1e-5


def test_phi3_is_left_as_it_is():
    model = build_model(load_recipe("tiny-phi-3"))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    assert fuse_projections(model) == 0
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


# Every feature the fused layers carry: q/k/v and MLP biases, a free head_dim, GQA,
# qk-norm, a sliding window.
HF_CASES = ["llama-biases-head-dim", "qwen2", "qwen3-tied-bias", "mistral", "phi-2"]


@pytest.mark.parametrize("case", HF_CASES)
def test_a_transformers_checkpoint_loads_into_the_fused_model(case: str, tmp_path: Path, cache_dir):
    pytest.importorskip("transformers")
    from _hf_checkpoints import CASES, COMMON, save_hf

    cfg, cls, kw = CASES[case]
    hf = save_hf(cfg, cls, kw, tmp_path / case)
    runner = api.load(tmp_path / case, "eager", extra={"fuse_projections": 1}, cache_dir=cache_dir)
    layer = runner.keepalive.model.layers[0]
    assert layer.fused if case == "phi-2" else layer.self_attn.fused
    ids = [(7 * i + 3) % COMMON["vocab_size"] for i in range(SEQ)]
    with torch.no_grad():
        want = hf(torch.tensor([ids])).logits[0].float()
    assert rel_err(runner.logits(ids), want) <= 1e-4
