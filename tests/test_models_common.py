"""models/common.py: the attention mask of a left-padded batch."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch.nn import functional as F

from artifactcache.backends.aoti.backend import export_dynamic_shapes, exported_range
from artifactcache.backends.inductor.compiling import step_inputs
from artifactcache.backends.shared.steps import dynamic_ranges, example_inputs
from artifactcache.backends.shared.torch_private import export_user_error
from artifactcache.models import build_model, common
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
NAMED = ("_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention")
cuda_only = pytest.mark.skipif(not torch.cuda.is_available(), reason="cuDNN's attention is CUDA's")


def _long(name: str, max_seq_len: int = 1024, prefill_len: int = 64):
    """A tiny recipe with dynamic pass lengths and KV buckets (and, for tiny-mistral, a
    window shorter than the context: a first pass with a square mask)."""
    rec = load_recipe(name)
    rec = dataclasses.replace(
        rec, model=dataclasses.replace(rec.model, max_position_embeddings=4096)
    )
    return dataclasses.replace(
        rec,
        shapes=dataclasses.replace(rec.shapes, max_seq_len=max_seq_len, prefill_len=prefill_len),
    )


@pytest.fixture
def off_cudnn_on_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """Trace the CUDA path kept off cuDNN on the CPU: torch.export and Dynamo run the
    named kernels' meta functions, which need no GPU."""
    monkeypatch.setattr(common, "keeps_off_cudnn", lambda cudnn, t: not cudnn)


# The kernel each pass names, off cuDNN: a bf16 first pass without a mask runs flash.
KERNELS = {
    ("tiny-mistral", "prefill"): "efficient", ("tiny-mistral", "extend"): "efficient",
    ("tiny-llama", "prefill"): "flash", ("tiny-llama", "extend"): "efficient",
}  # fmt: skip


def _export_strict(model, args, rec, step: str):
    """Strict Dims, as aoti's export_step tries first. torch 2.11's solver cannot prove
    one guard the named kernels' meta functions add, min(16*T, 32*T) == 16*T, true for
    every T > 0 (seen on the H100, 2026-12-05); there export_step keeps it as a runtime
    check through Dim.DYNAMIC, and so does this test. Any other refused guard (a pad
    to T's own multiple of 8 gave T % 8) fails it, on every torch."""
    shapes = export_dynamic_shapes(rec, step, strict=True)
    try:
        return torch.export.export(model, args, dynamic_shapes=shapes, strict=False)
    except export_user_error() as e:
        old_solver = tuple(int(x) for x in torch.__version__.split(".")[:2]) < (2, 13)
        if not (old_solver and "min(16*" in str(e)):
            raise
    shapes = export_dynamic_shapes(rec, step, strict=False)
    return torch.export.export(model, args, dynamic_shapes=shapes, strict=False)


@pytest.mark.parametrize("name", ["tiny-mistral", "tiny-llama"])  # a windowed first pass; plain
def test_off_cudnn_passes_export_over_their_whole_dynamic_ranges(off_cudnn_on_cpu, name: str):
    """Strict Dims: export proves every guard over the pass lengths and KV lengths, and
    the graph names its kernel (never SDPA whole, never cuDNN); the memory-efficient one
    gets the mask, as one bias padded once for the whole step."""
    rec = _long(name)
    model = build_model(rec, dtype="bf16", cudnn_prefill=False)
    cpu = torch.device("cpu")
    for step in ("prefill", "extend"):
        args = example_inputs(rec, cpu, step)
        ep = _export_strict(model, args, rec, step)
        for (index, dim), span in dynamic_ranges(rec, step).items():
            assert exported_range(ep, index % len(args), dim) == span, (step, index, dim)
        graph = ep.run_decompositions().graph
        targets = [str(n.target) for n in graph.nodes if n.op == "call_function"]
        assert not any("cudnn" in t or t == "aten.scaled_dot_product_attention.default"
                       for t in targets), step  # fmt: skip
        calls = [n for n in graph.nodes if "_scaled_dot_product_" in str(n.target)]
        kernel = KERNELS[(name, step)]
        assert calls and all(f"_{kernel}_attention" in str(n.target) for n in calls), step
        if kernel == "efficient":
            assert all(n.args[3] is not None for n in calls), step  # the mask's bias
            assert sum("constant_pad_nd" in t for t in targets) == 1, step


@pytest.mark.parametrize("name", ["tiny-mistral", "tiny-llama"])
def test_off_cudnn_passes_trace_whole_through_dynamo(off_cudnn_on_cpu, name: str):
    """The inductor backend's marking (step_inputs): no guard outside the ranges."""
    rec = _long(name)
    model = build_model(rec, dtype="bf16", cudnn_prefill=False)
    graphs: list[str] = []

    def record(gm: torch.fx.GraphModule, example_inputs: list) -> object:
        graphs.append(gm.code)
        return lambda *a: (torch.zeros(1),)  # the CUDA-only kernels cannot run here

    for step in ("prefill", "extend"):
        torch._dynamo.reset()
        compiled = torch.compile(model, backend=record, fullgraph=True, dynamic=False)
        compiled(*step_inputs(rec, torch.device("cpu"), step))
        assert f"_{KERNELS[(name, step)]}_attention" in graphs[-1], step


def _reference_kernels(q, k, v, bias, causal):
    """sdpa_without_cudnn's contract, runnable on the CPU: an additive bias or causal."""
    assert bias is None or (bias.stride(-2) % 8 == 0 and bias.dtype == q.dtype)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, is_causal=causal)


@pytest.mark.parametrize("name", ["tiny-mistral", "tiny-llama"])
def test_off_cudnn_passes_give_the_masked_logits(off_cudnn_on_cpu, monkeypatch, name: str):
    """What the forward hands the kernels (the bias, causal or not) gives the logits of
    the plain path, for a first pass and a left-padded pass over the cache."""
    monkeypatch.setattr(common, "sdpa_without_cudnn", _reference_kernels)
    rec = _long(name, max_seq_len=128, prefill_len=40)
    off = build_model(rec, dtype="fp32", cudnn_prefill=False)
    on = build_model(rec, dtype="fp32", cudnn_prefill=True)
    on.load_state_dict(off.state_dict())
    idx = torch.randint(1, 1000, (1, 40), generator=torch.Generator().manual_seed(0))
    pos = torch.arange(40)
    for inputs in ((idx, pos), (idx, pos + 40, torch.tensor([3]), torch.arange(96))):
        torch.testing.assert_close(off(*inputs), on(*inputs))


def test_attention_bias_is_the_mask_in_rows_of_a_fixed_stride():
    pos = torch.arange(3, 8)
    mask = attention_mask(pos, torch.arange(10), None, torch.tensor([0, 2]))
    bias = common.attention_bias(mask, torch.bfloat16, max_seq_len=12)
    assert bias.shape == mask.shape and bias.dtype == torch.bfloat16
    assert bias.stride(-2) == 16 and bias.stride(-1) == 1  # 12 // 8 + 1 = 2 groups of 8
    assert torch.equal(bias == 0, mask) and bool(torch.isinf(bias[~mask]).all())


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
@pytest.mark.parametrize(
    ("t", "s", "window"), [(16, 16, None), (16, 16, 5), (16, 37, None), (5, 64, 9)]
)
def test_sdpa_without_cudnn_matches_torchs_sdpa(dtype: torch.dtype, t: int, s: int, window):
    """Causal and masked (the runner's masks: each row sees at least itself; one mask
    row broadcast over two sequences, or one per sequence), windows, any column count."""
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(2, 4, t, 64, device="cuda", dtype=dtype, generator=g)
    k, v = (torch.randn(2, 4, s, 64, device="cuda", dtype=dtype, generator=g) for _ in "kv")
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-4
    if t == s and window is None:
        want = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        got = sdpa_without_cudnn(q, k, v, None, True)
        torch.testing.assert_close(got, want, rtol=tol, atol=tol)
    pos = torch.arange(s - t, s, device="cuda")
    for starts in (None, torch.tensor([0, 3], device="cuda")):  # [1, 1, T, S] or [2, 1, T, S]
        mask = attention_mask(pos, torch.arange(s, device="cuda"), window, starts)
        want = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        bias = common.attention_bias(mask, dtype, max_seq_len=s)
        got, names = _ran(sdpa_without_cudnn, q, k, v, bias, False)
        assert any("efficient_attention" in n for n in names)
        torch.testing.assert_close(got, want, rtol=tol, atol=tol)


@cuda_only
@pytest.mark.parametrize("cudnn", [False, True])
def test_a_pass_keeps_off_cudnn_unless_asked_when_exported_compiled_or_eager(cudnn: bool):
    """Both passes (a first pass and one over the cache) in eager, in an exported and
    decomposed graph (what Inductor compiles) and through Dynamo, with the same logits;
    off, the flash or memory-efficient kernel runs on any CUDA GPU."""
    rec = load_recipe("tiny-llama")
    model = build_model(rec, device="cuda", dtype="bf16", cudnn_prefill=cudnn)
    other = build_model(rec, device="cuda", dtype="bf16", cudnn_prefill=not cudnn)
    dev = torch.device("cuda")
    idx = torch.randint(0, rec.model.vocab_size, (1, 16), device=dev)
    pos = torch.arange(16, device=dev)
    kv_pos = torch.arange(rec.shapes.max_seq_len, device=dev)
    row_start = torch.zeros(1, dtype=torch.int64, device=dev)
    first, later = (idx, pos), (idx, pos + 16, row_start, kv_pos)
    picks_cudnn = _torch_picks_cudnn()
    for inputs in (first, later):
        out, names = _ran(model, *inputs)
        if cudnn:
            assert any(CUDNN_OP in n for n in names) is picks_cudnn
        else:
            assert any(k in n for n in names for k in NAMED)
            assert not any(CUDNN_OP in n for n in names)
        torch.testing.assert_close(out, other(*inputs), rtol=3e-2, atol=3e-2)
        code = (
            torch.export.export(model, inputs, strict=False).run_decompositions().graph_module.code
        )
        assert (CUDNN_OP in code) is (cudnn and picks_cudnn)
        assert cudnn or any(k in code for k in NAMED)
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    _, names = _ran(compiled, *later)
    assert any(CUDNN_OP in n for n in names) is (cudnn and picks_cudnn)


def test_a_layer_region_gets_every_field_of_the_reads():
    """The region path takes Reads apart (Dynamo reuses a region's trace only for plain
    inputs) and rebuilds it: a field it left out would silently be its default inside
    every region (phi-3-mini's layers are regions)."""
    import dataclasses

    from artifactcache.models.common import Reads, _run_layer_region

    seen = []

    def layer(x, cos, sin, reads, input_pos):
        seen.append(reads)
        return x

    values = {"mask": torch.ones(1, 1, 1, 4, dtype=torch.bool), "lo": torch.zeros(1),
              "own": True, "cudnn": False, "bias": torch.zeros(1), "prefetch": 4 << 20}  # fmt: skip
    assert set(values) == {f.name for f in dataclasses.fields(Reads)}
    _run_layer_region(layer, torch.zeros(1), None, None, Reads(**values), torch.zeros(1))
    for name, value in values.items():
        assert getattr(seen[0], name) is value, name
