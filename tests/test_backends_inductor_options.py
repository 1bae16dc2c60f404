"""inductor's --extra layer_regions: on by default for the llama families, a key factor,
one line for a bad value; and each block traced once when it is on."""

from __future__ import annotations

import dataclasses

import pytest

from artifactcache.backends.base import get_backend
from artifactcache.backends.inductor.options import layer_regions
from artifactcache.choices import BuildChoices
from artifactcache.errors import AcacheError
from artifactcache.recipes import load_recipe

torch = pytest.importorskip("torch")


def _opts(device: str = "cpu", **extra: object) -> BuildChoices:
    return BuildChoices(device=device, dtype="fp32", extra=dict(extra))


@pytest.mark.parametrize(
    ("recipe", "want"),
    [("tiny-llama", True), ("tiny-phi-3", True), ("tiny-qwen3", True), ("tiny-phi-2", False)],
)
def test_the_default_follows_the_family(recipe, want):
    assert layer_regions(load_recipe(recipe), _opts()) is want


def test_a_cuda_build_with_the_rope_in_the_split_kv_kernel_has_none():
    """phi-3's unquantized one-row CUDA build decodes with the rope inside the split-KV
    kernel by default (model_options), which a region cannot hold; its int8wo build and
    a llama build keep their regions, and asking for both is one line."""
    phi3 = load_recipe("tiny-phi-3")
    assert layer_regions(phi3, _opts("cuda")) is False
    int8 = BuildChoices(device="cuda", dtype="fp32", quant="int8wo")
    assert layer_regions(phi3, int8) is True
    assert layer_regions(load_recipe("tiny-llama"), _opts("cuda")) is True
    with pytest.raises(AcacheError, match="add --extra split_kv_rope=0") as e:
        layer_regions(phi3, _opts("cuda", layer_regions="1"))
    assert "\n" not in str(e.value)


def test_asked_for_it_is_the_answer_and_a_key_factor():
    b = get_backend("inductor")
    recipe = load_recipe("tiny-phi-2")
    on, off = _opts(layer_regions="1"), _opts(layer_regions="off")
    for opts in (on, off):
        b.check_options(opts)
    assert b.factors(recipe, on)["layer_regions"] is True
    assert b.factors(recipe, off)["layer_regions"] is False
    assert b.factors(load_recipe("tiny-llama"), _opts())["layer_regions"] is True


@pytest.mark.parametrize("value", ["2", "maybe", ""])
def test_a_bad_value_is_one_line(value):
    with pytest.raises(AcacheError, match="layer_regions=.*expected 0 or 1") as e:
        get_backend("inductor").check_options(_opts(layer_regions=value))
    assert "\n" not in str(e.value)


def test_aoti_takes_no_layer_regions():
    with pytest.raises(AcacheError, match="layer_regions"):
        get_backend("aoti").check_options(_opts(layer_regions="1"))


def _four_layer_model(cudnn_prefill: bool):
    from artifactcache.models import build_model

    recipe = load_recipe("tiny-llama")
    recipe = dataclasses.replace(recipe, model=dataclasses.replace(recipe.model, n_layers=4))
    # A pass of up to 32 tokens: the passes' token count is dynamic (16..32).
    recipe = dataclasses.replace(recipe, shapes=dataclasses.replace(recipe.shapes, prefill_len=32))
    return recipe, build_model(recipe, cudnn_prefill=cudnn_prefill)


@pytest.mark.parametrize(("step", "calls"), [("decode", 4), ("extend", 0), ("prefill", 0)])
def test_decode_calls_one_traced_block_per_layer_and_passes_stay_plain(step, calls):
    """With regions, decode's graph calls one subgraph four times; a pass (its token count
    dynamic, 16..32) calls none, traced through AOTAutograd as Inductor would; the
    outputs and the KV caches written equal the plain model's."""
    from artifactcache.backends.inductor.compiling import run_model, step_inputs

    graphs = []

    def capture(gm, example_inputs):
        graphs.append(gm)
        from torch._dynamo.backends.common import aot_autograd

        return aot_autograd(fw_compiler=lambda g, _: g)(gm, example_inputs)

    recipe, plain = _four_layer_model(cudnn_prefill=False)
    _, regions = _four_layer_model(cudnn_prefill=False)
    regions.layer_regions = True
    inputs = step_inputs(recipe, torch.device("cpu"), step)
    want = plain(*inputs)
    torch._dynamo.reset()
    got = torch.compile(run_model, fullgraph=True, backend=capture)(regions, *inputs)
    torch._dynamo.reset()
    assert torch.allclose(got, want, atol=1e-5)
    for a, b in zip(plain.model.layers, regions.model.layers, strict=True):
        ca, cb = a.self_attn.kv_cache, b.self_attn.kv_cache
        assert torch.allclose(ca.k_cache, cb.k_cache, atol=1e-5)
        assert torch.allclose(ca.v_cache, cb.v_cache, atol=1e-5)
    (gm,) = graphs
    found = [n for n in gm.graph.nodes if n.target is torch.ops.higher_order.invoke_subgraph]
    assert len(found) == calls
    assert len({n.args[0].target for n in found}) == min(calls, 1)  # one subgraph at most


def test_every_field_of_reads_reaches_the_layer_through_the_region():
    from artifactcache.models.common import Reads, layer_call

    seen = []

    def layer(x, cos, sin, reads, input_pos):
        seen.append((x, cos, sin, reads, input_pos))
        return x

    t = [torch.full((1,), float(i)) for i in range(7)]
    for reads in (
        Reads(mask=t[0], lo=t[1], own=True, cudnn=False, bias=t[2]),
        Reads(lo=t[3]),
    ):
        seen.clear()
        assert layer_call(True)(layer, t[4], t[5], t[6], reads, t[0]) is t[4]
        ((x, cos, sin, got, pos),) = seen
        assert (x, cos, sin, pos) == (t[4], t[5], t[6], t[0])
        assert got == reads  # mask, lo, own, cudnn and bias, each as given


def test_int8wo_takes_regions_by_default_and_int4wo_only_when_asked():
    recipe = load_recipe("tiny-llama")
    int8 = BuildChoices(device="cpu", dtype="fp32", quant="int8wo")
    assert layer_regions(recipe, int8) is True
    assert layer_regions(recipe, int8.replace(extra={"layer_regions": "0"})) is False
    int4 = BuildChoices(device="cuda", dtype="bf16", quant="int4wo")
    assert layer_regions(recipe, int4) is False
    assert layer_regions(recipe, int4.replace(extra={"layer_regions": "1"})) is True


def test_regions_compile_decode_without_the_per_call_asserts():
    from artifactcache.backends.inductor.options import region_configs

    assert region_configs(True) == {"size_asserts": False, "alignment_asserts": False}
    assert region_configs(False) == {}


def test_only_decode_is_compiled_with_the_region_config(monkeypatch, tmp_path):
    """save_aot_steps: decode gets region_configs, the passes their options as before."""
    from artifactcache.backends.inductor import compiling

    seen = {}

    def fake_compile(fn, args, options):
        step = "decode" if args[1].shape[1] == 1 else f"pass-{len(seen)}"
        seen[step] = dict(options)
        return lambda *a: None

    monkeypatch.setattr(compiling, "aot_compile_step", fake_compile)
    monkeypatch.setattr(compiling, "save_compiled_step", lambda c, p: p.write_bytes(b"x"))
    recipe, model = _four_layer_model(cudnn_prefill=True)
    compiling.save_aot_steps(model, _opts(), recipe, torch.device("cpu"), tmp_path)
    assert model.layer_regions is True
    assert seen["decode"]["size_asserts"] is False
    passes = [v for k, v in seen.items() if k != "decode"]
    assert len(passes) == 2
    assert all("size_asserts" not in v for v in passes)


def test_compile_steps_gives_only_decode_the_region_config(monkeypatch):
    """The megacache path (a torch without aot_compile, and its warm loads): the model
    set for regions before either wrapper traces, the region config on decode alone."""
    from artifactcache.backends.inductor import compiling

    wrappers = []

    def fake_compile(model, **kw):
        wrappers.append((kw.get("options") or {}, model.layer_regions))
        return model

    monkeypatch.setattr(torch, "compile", fake_compile)
    recipe, model = _four_layer_model(cudnn_prefill=True)
    compiling.compile_steps(model, _opts(), recipe, torch.device("cpu"))
    (decode, on_decode), (passes, on_passes) = wrappers
    assert on_decode is on_passes is True
    assert decode["size_asserts"] is False
    assert "size_asserts" not in passes


def test_split_kv_rope_builds_without_regions_and_refuses_them_asked():
    """torch cannot functionalize a region whose body writes its inputs through a custom
    op: a rope build drops the default regions, and asking for both is one line."""
    rec = load_recipe("tiny-llama")
    rope = BuildChoices(device="cuda", extra={"split_kv_rope": 1})
    assert layer_regions(rec, BuildChoices(device="cuda")) is True
    assert layer_regions(rec, rope) is False
    both = BuildChoices(device="cuda", extra={"split_kv_rope": 1, "layer_regions": 1})
    with pytest.raises(AcacheError, match="cannot take --extra split_kv_rope=1"):
        layer_regions(rec, both)


def test_regions_asked_on_phi_2_say_to_turn_its_default_rope_off():
    """phi-2 decodes with the rope inside split-KV by default (model_options): regions
    asked for there are one line that names the flag to add, and with it they build."""
    phi2 = load_recipe("tiny-phi-2")
    assert layer_regions(phi2, BuildChoices(device="cuda")) is False
    asked = BuildChoices(device="cuda", extra={"layer_regions": 1})
    with pytest.raises(AcacheError, match="by default.*add --extra split_kv_rope=0"):
        layer_regions(phi2, asked)
    get_backend("inductor").check_options(asked)  # the recipe decides, not the options
    no_rope = BuildChoices(device="cuda", extra={"layer_regions": 1, "split_kv_rope": 0})
    assert layer_regions(phi2, no_rope) is True


def test_regions_with_split_kv_rope_are_refused_from_the_options_alone():
    both = BuildChoices(device="cuda", extra={"split_kv_rope": 1, "layer_regions": 1})
    with pytest.raises(AcacheError, match="cannot take --extra split_kv_rope=1"):
        get_backend("inductor").check_options(both)
