"""ONNX export: the functional-KV step graph, its checker pass, and its own cache key."""

from __future__ import annotations

import onnx
import onnxruntime
import pytest
import torch

from artifactcache.api import recipe as recipe_api
from artifactcache.backends.base import BuildContext
from artifactcache.backends.onnx import export as ox
from artifactcache.backends.onnx import step_shapes as shapes
from artifactcache.choices import BuildChoices
from artifactcache.errors import BackendError
from artifactcache.models import WeightsSpec, build_model
from artifactcache.recipes import load_recipe
from artifactcache.store.keyformat import compute_key
from artifactcache.store.local import LocalStore


def _ctx(recipe: str = "tiny-llama", seed: int = 0, **extra) -> BuildContext:
    return BuildContext(
        recipe=load_recipe(recipe), opts=BuildChoices(extra=extra), weights=WeightsSpec(None, seed)
    )


def _export(ctx: BuildContext, spec: ox.ExportSpec, store: LocalStore):
    """(model.onnx, key, meta, source): the export opened the way api.py opens it for a backend."""
    dep = ox.export_dependency(ctx, recipe_api.weights_factor(ctx), spec)
    entry, source = recipe_api.open_dependency(dep, store)
    return entry.path / ox.MODEL_FILE, entry.key, entry.meta, source


def _export_key(ctx: BuildContext, spec: ox.ExportSpec) -> str:
    return compute_key(ox.export_factors(ctx.recipe, recipe_api.weights_factor(ctx), spec))


def _feeds(*tensors) -> dict:
    return {
        n: t.numpy() if isinstance(t, torch.Tensor) else t
        for n, t in zip(shapes.INPUT_NAMES, tensors, strict=True)
    }


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max())


def test_functional_step_matches_the_in_place_model():
    """The export wrapper (KV cache in and out) computes what the model computes."""
    recipe = load_recipe("tiny-mistral")  # sliding window: the mask matters
    ref = build_model(recipe)
    step = ox._step_module(build_model(recipe))
    ids, pos, rs, kv, _, keys, values = shapes.example_inputs(recipe, torch.float32)
    ids = torch.randint(0, 1000, ids.shape)
    with torch.no_grad():
        want = ref(ids, pos, rs)
        # A first pass reads its own positions and returns its last row.
        last, _, _ = step(ids, pos, *ox.first_pass_inputs(ids), keys, values)
        assert last.shape[1] == 1 and _rel(last, want[:, -1:]) < 1e-6
        logits, keys, values = step(ids, pos, rs, kv, ox.every_row(pos), keys, values)
        assert _rel(logits, want) < 1e-6
        for t in range(20):  # past the 16-token window
            tok, p = torch.tensor([[7 + t]]), torch.tensor([recipe.shapes.prefill_len + t])
            filled = torch.arange(int(p) + 1 + t % 3)  # any L past the position
            logits, keys, values = step(tok, p, rs, filled, ox.every_row(p), keys, values)
            assert _rel(logits, ref(tok, p, rs)) < 1e-5
    assert keys.shape == shapes.cache_shape(recipe)


def test_export_graph_contract_and_cache_entry(tmp_path):
    store = LocalStore(tmp_path / "c")
    ctx = _ctx()
    path, key, meta, source = _export(ctx, ox.ExportSpec(), store)
    assert source == "built" and meta["exporter_used"] == "dynamo", meta.get("dynamo_error")
    onnx.checker.check_model(str(path), full_check=True)
    graph = onnx.load(str(path)).graph
    assert [i.name for i in graph.input] == list(shapes.INPUT_NAMES)
    assert [o.name for o in graph.output] == list(shapes.OUTPUT_NAMES)
    ids_dims = graph.input[0].type.tensor_type.shape.dim
    assert ids_dims[0].dim_value == 1 and ids_dims[1].dim_param  # dynamic token axis
    axes = {i.name: i.type.tensor_type.shape.dim[0].dim_param for i in graph.input[3:5]}
    assert list(axes) == ["kv_pos", "logit_rows"] and all(axes.values())  # dynamic L, R
    assert len({*axes.values(), ids_dims[1].dim_param}) == 3  # L, R and T untied
    cache_dims = [d.dim_value for d in graph.input[5].type.tensor_type.shape.dim]
    assert tuple(cache_dims) == shapes.cache_shape(ctx.recipe)
    # A second request is a hit on the same entry: no second export.
    path2, key2, _, source2 = _export(_ctx(), ox.ExportSpec(), store)
    assert (path2, key2, source2) == (path, key, "local")
    assert store.get(key).label["backend"] == "onnx-export"

    # One graph, both steps: T = prefill_len, then T = 1 against the returned cache.
    recipe = ctx.recipe
    ref = build_model(recipe)
    sess = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    ids, pos, rs, kv, _, keys, values = shapes.example_inputs(recipe, torch.float32)
    ids = torch.randint(0, 1000, ids.shape)
    want = ref(ids, pos, rs)
    last = sess.run(None, _feeds(ids, pos, *ox.first_pass_inputs(ids), keys, values))[0]
    assert last.shape[1] == 1 and _rel(torch.from_numpy(last), want[:, -1:]) < 1e-4
    out = sess.run(None, _feeds(ids, pos, rs, kv, ox.every_row(pos), keys, values))
    assert _rel(torch.from_numpy(out[0]), want) < 1e-4
    tok, p = torch.tensor([[3]]), torch.tensor([recipe.shapes.prefill_len])
    filled = torch.arange(recipe.shapes.prefill_len + 1)  # the decode step reads no more
    out = sess.run(None, _feeds(tok, p, rs, filled, ox.every_row(p), out[1], out[2]))
    assert _rel(torch.from_numpy(out[0]), ref(tok, p, rs)) < 1e-4


def test_torchscript_exporter_on_request(tmp_path):
    ctx = _ctx("tiny-phi-2", exporter="torchscript")
    spec = ox.export_spec(ctx.opts)
    path, _, meta, _ = _export(ctx, spec, LocalStore(tmp_path / "c"))
    assert meta["exporter_used"] == "torchscript" and meta["opset"] == ox.DEFAULT_OPSET
    ref = build_model(ctx.recipe)
    sess = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    ids, pos, rs, kv, _, keys, values = shapes.example_inputs(ctx.recipe, torch.float32)
    out = sess.run(None, _feeds(ids, pos, rs, kv, ox.every_row(pos), keys, values))
    assert _rel(torch.from_numpy(out[0]), ref(ids, pos, rs)) < 1e-4
    last = sess.run(None, _feeds(ids, pos, *ox.first_pass_inputs(ids), keys, values))[0]
    assert _rel(torch.from_numpy(last), ref(ids, pos, rs)[:, -1:]) < 1e-4
    assert not ox.has_qdq(path)


def test_export_key_factors():
    ctx = _ctx()
    factors = ox.export_factors(ctx.recipe, recipe_api.weights_factor(ctx), ox.ExportSpec())
    base = compute_key(factors)
    assert factors["backend"]["name"] == "onnx-export"
    assert set(factors["toolchain"]) >= {"torch", "onnx", "onnxscript"}
    assert factors["hardware"] == {}  # one export serves CPU and GPU backends
    changed = [
        _export_key(ctx, ox.ExportSpec(opset=19)),
        _export_key(ctx, ox.ExportSpec(dtype="fp16")),
        _export_key(ctx, ox.ExportSpec(exporter="torchscript")),
        _export_key(_ctx(seed=1), ox.ExportSpec()),
        _export_key(_ctx("tiny-phi-3"), ox.ExportSpec()),
    ]
    assert len(set(changed)) == len(changed) and base not in changed


@pytest.mark.parametrize(
    "extra, dtype, message",
    [
        ({"opset": 13}, "fp32", "opset 13 is too old"),
        ({"opset": "x"}, "fp32", "opset must be an integer"),
        ({"exporter": "jit"}, "fp32", "unknown exporter 'jit'"),
        ({}, "int8", "ONNX export supports dtype"),
    ],
)
def test_export_spec_rejects_bad_options(extra, dtype, message):
    with pytest.raises(BackendError, match=message) as e:
        ox.export_spec(BuildChoices(dtype=dtype, extra=extra))
    assert "\n" not in str(e.value)


def test_a_backend_called_outside_api_has_no_export():
    with pytest.raises(BackendError, match="the ONNX export was not opened"):
        ox.exported(_ctx())
