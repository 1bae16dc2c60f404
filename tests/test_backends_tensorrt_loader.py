"""backends/tensorrt/loader.py: optimization profiles and the timing-cache entry."""

from __future__ import annotations

import pytest

from artifactcache.api import recipe as recipe_api
from artifactcache.backends.tensorrt import loader, options
from artifactcache.backends.tensorrt import runner as trt_runner
from artifactcache.backends.tensorrt.loader import TIMING_CACHE_FILE
from artifactcache.errors import ShapeError
from artifactcache.recipes import load_recipe
from artifactcache.store.keyformat import compute_key
from artifactcache.store.local import LocalStore


def test_profiles_from_recipe_shapes():
    r = load_recipe("tiny-llama")  # prefill_len 8
    prefill, decode = loader.profiles_for(r)
    assert prefill["input_ids"] == ((1, 1), (1, 8), (1, 8))
    assert prefill["input_pos"] == ((1,), (8,), (8,))
    assert prefill["logit_rows"] == ((1,), (1,), (8,))  # tuned for a first pass's last row
    assert prefill["kv_pos"] == ((1,), (8,), (64,))  # ... reading its own 8 positions
    assert decode == {
        "input_ids": ((1, 1),) * 3, "input_pos": ((1,),) * 3, "logit_rows": ((1,),) * 3,
        "kv_pos": ((1,), (64,), (64,)),
    }  # fmt: skip
    assert "past_keys" not in prefill  # static cache inputs need no profile
    big = load_recipe("llama-7b")  # prefill_len 255: the default for 256 positions
    assert loader.profiles_for(big)[0]["input_ids"][2] == (1, 255)
    assert [trt_runner.profile_for_tokens(r, n) for n in (1, 2, 8)] == [1, 0, 0]
    with pytest.raises(ShapeError, match=r"outside the engine's profiles \(1..8\)"):
        trt_runner.profile_for_tokens(r, 9)


def test_timing_cache_key_factors():
    plan = options.precision_plan("fp16", 10, "strong", False)
    eo = options.EngineOptions()
    base = loader.timing_cache_factors("NVIDIA H200", "9.0", "10.3.0", plan, eo)
    assert base["recipe"] == {} and base["weights"] == "none"  # shared across models
    others = [
        loader.timing_cache_factors("NVIDIA A100", "8.0", "10.3.0", plan, eo),
        loader.timing_cache_factors("NVIDIA H200", "9.0", "10.4.0", plan, eo),
        loader.timing_cache_factors(
            "NVIDIA H200", "9.0", "10.3.0", plan, options.EngineOptions(opt_level=5)
        ),
        loader.timing_cache_factors(
            "NVIDIA H200", "9.0", "10.3.0", options.precision_plan("fp16", 10, "weak", False), eo
        ),
    ]
    assert len({compute_key(f) for f in others} | {compute_key(base)}) == 5


def test_timing_cache_entry_is_merged_after_each_build(tmp_path):
    """The store side of load-before / merge-after, with a set-union merge standing in
    for ITimingCache.combine (the only part that needs TensorRT)."""
    store = LocalStore(tmp_path / "c")
    plan = options.precision_plan("fp32", 10, "strong", False)
    factors = loader.timing_cache_factors("GPU", "9.0", "10.3.0", plan, options.EngineOptions())

    def union(old: bytes | None, new: bytes) -> bytes:
        return b"\n".join(sorted(set((old or b"").split()) | set(new.split())))

    dep = loader.timing_cache_dependency(factors, merge=union)
    assert recipe_api.open_dependency(dep, store) == (
        None,
        "absent",
    )  # optional: never built for it
    recipe_api.refresh_dependency(dep, store, b"tactic-a")
    recipe_api.refresh_dependency(dep, store, b"tactic-b")
    entry = store.get(compute_key(factors))
    assert (entry.path / TIMING_CACHE_FILE).read_bytes() == b"tactic-a\ntactic-b"
    assert entry.meta["merged_builds"] == 2 and entry.label["backend"] == "trt-timing-cache"


@pytest.mark.parametrize(
    ("exporter", "max_batch"), [("torchscript", 1), ("torchscript", 3), ("dynamo", 3)]
)
def test_profiles_follow_the_exported_graph(tmp_path, exporter, max_batch):
    """Each profile's ranges sit exactly on the graph's dynamic dimensions, and its
    fixed sizes are the graph's, for a context and batch chosen at build."""
    import onnx

    from artifactcache.backends.base import BuildContext
    from artifactcache.backends.onnx import export as ox
    from artifactcache.backends.onnx import step_shapes as shapes
    from artifactcache.choices import BuildChoices
    from artifactcache.models import WeightsSpec

    recipe = load_recipe("tiny-llama").with_shapes(max_seq_len=40, max_batch=max_batch)
    ctx = BuildContext(recipe, BuildChoices(extra={"exporter": exporter}), WeightsSpec(None, 0))
    ox.export_to(tmp_path, ctx, ox.export_spec(ctx.opts))
    graph = onnx.load(str(tmp_path / ox.MODEL_FILE), load_external_data=False).graph
    dims = {
        i.name: [
            d.dim_value if d.HasField("dim_value") else None for d in i.type.tensor_type.shape.dim
        ]
        for i in graph.input
    }
    assert dims["past_keys"] == list(shapes.cache_shape(recipe)) == [2, max_batch, 2, 41, 16]
    prefill, decode = loader.profiles_for(recipe)
    for profile in (prefill, decode):
        for name, (lo, opt, hi) in profile.items():
            for d, size in enumerate(dims[name]):
                if size is None:
                    assert lo[d] <= opt[d] <= hi[d], (name, d)
                else:
                    assert lo[d] == opt[d] == hi[d] == size, (name, d)
    assert {n for n, ds in dims.items() if None in ds} == set(prefill)
    assert prefill["input_ids"] == ((max_batch, 1), (max_batch, 8), (max_batch, 8))
    assert decode["input_ids"] == ((max_batch, 1),) * 3
    assert dims["row_start"] == [max_batch]
