"""models/common.py: the attention mask of a left-padded batch."""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F

from artifactcache.models import build_model
from artifactcache.models.common import attention_mask, sdpa_without_cudnn
from artifactcache.recipes import load_recipe


def test_the_mask_hides_each_rows_padding_but_a_padding_query_sees_itself():
    pos = torch.arange(4)
    mask = attention_mask(pos, torch.arange(6), None, torch.tensor([0, 2]))
    assert mask.shape == (2, 1, 4, 6)
    causal = torch.tril(torch.ones(4, 6, dtype=torch.bool))
    assert torch.equal(mask[0, 0], causal)  # row_start 0: plain causal
    want = causal.clone()
    want[2:, :2] = False  # real queries never see the two padding slots
    want[1, 0] = False  # a padding query sees itself only
    assert torch.equal(mask[1, 0], want)
    assert torch.equal(attention_mask(pos, torch.arange(6), None), causal[None, None])


def test_a_left_padded_row_is_finite_and_equals_its_prompt_alone():
    recipe = load_recipe("tiny-llama")
    batched = build_model(recipe.with_shapes(max_batch=2))
    alone = build_model(recipe)
    prompt = torch.tensor([[1, 15043, 29892]])
    pad = 5  # row 0 is left-padded by 5; row 1 is 8 real tokens
    row0 = torch.cat([torch.zeros(1, pad, dtype=torch.int64), prompt], dim=1)
    row1 = torch.arange(100, 108)[None]
    with torch.no_grad():
        out = batched(torch.cat([row0, row1]), torch.arange(8), torch.tensor([pad, 0]))
        # A NaN key or value in the cache would poison P @ V of the real queries even
        # where P is 0.
        assert torch.isfinite(out).all()
        for layer in batched.model.layers:
            assert torch.isfinite(layer.self_attn.kv_cache.k_cache).all()
        want = alone(prompt, torch.arange(3))
        assert torch.allclose(out[0, pad:], want[0], rtol=1e-4, atol=1e-4)
        assert torch.allclose(out[1:], alone(row1, torch.arange(8)), rtol=1e-4, atol=1e-4)


def test_row_start_zero_is_the_causal_first_pass():
    """The masked whole-cache read with every row at slot 0 and a prompt's causal first
    pass (no row_start, no kv_pos: SDPA's is_causal) are one attention, two kernels."""
    model = build_model(load_recipe("tiny-phi-2"))
    idx, pos = torch.tensor([[1, 2, 3, 4]]), torch.arange(4)
    with torch.no_grad():
        causal = model(idx, pos)
        masked = model(idx, pos, torch.zeros(1, dtype=torch.int64))
    torch.testing.assert_close(masked, causal, rtol=1e-5, atol=1e-5)


def test_a_first_pass_must_start_at_position_zero():
    """Without row_start and kv_pos the step attends to its own keys only: correct at
    position 0 alone, so eager refuses any other start instead of a wrong answer."""
    model = build_model(load_recipe("tiny-llama"))
    with torch.no_grad():
        model(torch.tensor([[1, 2, 3, 4]]), torch.arange(4))
        with pytest.raises(ValueError, match="starts at position 0; pass row_start"):
            model(torch.tensor([[5]]), torch.tensor([4]))
        model(torch.tensor([[5]]), torch.tensor([4]), torch.zeros(1, dtype=torch.long))


CUDNN_OP = "_scaled_dot_product_cudnn_attention"
cuda_only = pytest.mark.skipif(not torch.cuda.is_available(), reason="cuDNN's attention is CUDA's")


def _ran(fn, *args) -> tuple[object, set[str]]:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        out = fn(*args)
    return out, {e.name for e in prof.events()}


def _torch_picks_cudnn() -> bool:
    """Whether SDPA picks cuDNN for a bf16 pass here (Hopper with a recent cuDNN)."""
    q = torch.randn(1, 4, 16, 64, device="cuda", dtype=torch.bfloat16)
    _, names = _ran(lambda: F.scaled_dot_product_attention(q, q, q, is_causal=True))
    return any(CUDNN_OP in n for n in names)


@cuda_only
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize(("t", "s"), [(16, 16), (16, 37), (5, 64)])
def test_sdpa_without_cudnn_matches_torchs_sdpa(dtype: torch.dtype, t: int, s: int):
    """Causal and masked (the runner's masks: each row sees at least itself), any
    column count (the bias is padded for the memory-efficient kernel)."""
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(2, 4, t, 64, device="cuda", dtype=dtype, generator=g)
    k, v = (torch.randn(2, 4, s, 64, device="cuda", dtype=dtype, generator=g) for _ in "kv")
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-4
    if t == s:
        want = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        got, names = _ran(sdpa_without_cudnn, q, k, v, None, True)
        assert not any(CUDNN_OP in n for n in names)
        torch.testing.assert_close(got, want, rtol=tol, atol=tol)
    pos = torch.arange(s - t, s, device="cuda")
    starts = torch.tensor([0, 3], device="cuda")
    mask = attention_mask(pos, torch.arange(s, device="cuda"), None, starts)
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    got, names = _ran(sdpa_without_cudnn, q, k, v, mask, False)
    assert not any(CUDNN_OP in n for n in names)
    torch.testing.assert_close(got, want, rtol=tol, atol=tol)


@cuda_only
@pytest.mark.parametrize("cudnn", [False, True])
def test_a_pass_keeps_off_cudnn_unless_asked_when_exported_compiled_or_eager(cudnn: bool):
    """Both passes (a first pass and one over the cache) in eager, in an exported and
    decomposed graph (what Inductor compiles) and through Dynamo, with the same logits."""
    rec = load_recipe("tiny-llama")
    model = build_model(rec, device="cuda", dtype="bf16", cudnn_prefill=cudnn)
    other = build_model(rec, device="cuda", dtype="bf16", cudnn_prefill=not cudnn)
    dev = torch.device("cuda")
    idx = torch.randint(0, rec.model.vocab_size, (1, 16), device=dev)
    pos = torch.arange(16, device=dev)
    kv_pos = torch.arange(rec.shapes.max_seq_len, device=dev)
    row_start = torch.zeros(1, dtype=torch.int64, device=dev)
    first, later = (idx, pos), (idx, pos + 16, row_start, kv_pos)
    expect = cudnn and _torch_picks_cudnn()
    for inputs in (first, later):
        out, names = _ran(model, *inputs)
        assert any(CUDNN_OP in n for n in names) is expect
        torch.testing.assert_close(out, other(*inputs), rtol=3e-2, atol=3e-2)
        ep = torch.export.export(model, inputs, strict=False).run_decompositions()
        assert (CUDNN_OP in ep.graph_module.code) is expect
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    _, names = _ran(compiled, *later)
    assert any(CUDNN_OP in n for n in names) is expect
