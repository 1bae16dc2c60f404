"""Weight-only int8 (models/quant.py): the rounding bound, which layers, the old weights
freed, a loose sanity bound against the float model, and the compiled backends held
to eager on the quantized model.

How far int8wo is from the float model on a real checkpoint is not asserted here:
benchmarks/quant_agreement.py prints it (max relative logits error, first differing
greedy token).
"""

from __future__ import annotations

import gc
import weakref

import pytest
import torch
from _backend_util import private_dir, rel_err
from torch import nn

from artifactcache import api
from artifactcache.models import build_model
from artifactcache.models.quant import Int8WeightOnlyLinear, quantize, quantize_int8
from artifactcache.recipes import load_recipe


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_each_row_is_rounded_against_its_own_scale(dtype: torch.dtype):
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(300, 70, generator=gen) * torch.logspace(-3, 2, 300)[:, None]
    w[5] = 0.0  # an all-zero row must not divide by zero
    w = w.to(dtype)
    q, s = quantize_int8(w)
    assert q.dtype == torch.int8 and s.dtype == dtype and s.shape == (300,)
    assert q.abs().max() <= 127 and torch.all(q[5] == 0)
    assert torch.all(q.abs().amax(dim=1)[torch.arange(300) != 5] >= 126)  # the range is used
    err = (q.float() * s.float()[:, None] - w.float()).abs()
    assert torch.all(err <= s.float()[:, None] / 2 * (1 + 1e-6))


def test_every_block_linear_is_quantized_and_the_lm_head_is_not():
    rec = load_recipe("tiny-llama")
    model = build_model(rec)
    old = [m.weight for m in model.model.modules() if isinstance(m, nn.Linear)]
    refs = [weakref.ref(t) for t in old]
    del old
    assert quantize(model, "int8wo") == 7 * rec.model.n_layers  # q, k, v, o, gate, up, down
    gc.collect()
    assert all(r() is None for r in refs), "a float weight is still alive"
    assert not any(isinstance(m, nn.Linear) for m in model.model.modules())
    assert type(model.lm_head) is nn.Linear and model.lm_head.weight.dtype == torch.float32
    q = model.model.layers[0].self_attn.q_proj
    assert isinstance(q, Int8WeightOnlyLinear) and q.weight.dtype == torch.int8


@pytest.mark.parametrize(("dtype", "fused"), [("fp32", False), ("bf16", True)])
def test_int8wo_stays_close_to_the_float_model(dtype: str, fused: bool):
    """A loose sanity bound (tiny random models sit near 1-3%): a scale applied to the
    wrong rows, or a transposed weight, is off by far more."""
    rec = load_recipe("tiny-qwen2")  # biases on q/k/v: added after the scales
    ids = [(31 * i + 7) % rec.model.vocab_size for i in range(16)]
    pos = torch.arange(len(ids))
    with torch.no_grad():
        want = build_model(rec, dtype=dtype)(torch.tensor([ids]), pos)[0]
        model = build_model(rec, dtype=dtype, fuse_projections=fused, quant="int8wo")
        got = model(torch.tensor([ids]), pos)[0]
    assert 0 < rel_err(got, want) < 0.1


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["inductor", "aoti"])
def test_compiled_int8wo_matches_eager_int8wo(backend: str, tmp_path_factory):
    """int8 constants reach the compiled graphs (aoti: as user-managed constants) and
    compute what eager computes on the same quantized, fused model."""
    root = private_dir(tmp_path_factory, f"int8wo-{backend}")
    opts = dict(quant="int8wo", extra={"fuse_projections": 1}, cache_dir=root)
    rec = load_recipe("tiny-llama")
    ids = [(31 * i + 7) % rec.model.vocab_size for i in range(16)]
    prompt = list(rec.bench.prompt_ids)
    eager = api.load("tiny-llama", "eager", **opts)
    runner = api.load("tiny-llama", backend, **opts)
    assert rel_err(runner.logits(ids), eager.logits(ids)) <= 1e-4
    assert runner.generate(prompt, 8) == eager.generate(prompt, 8)
