"""ort backend: parity with eager on every tiny recipe, warm sessions skip the optimizer,
the shared export cache, and one-line errors for bad inputs."""

from __future__ import annotations

import sys

import pytest
import torch
from _backend_util import BATCH_PROMPTS, assert_rows_match_alone
from typer.testing import CliRunner

from artifactcache import api
from artifactcache.backends.base import BuildContext
from artifactcache.backends.onnx import backend as ortb
from artifactcache.backends.onnx import export as ox
from artifactcache.backends.onnx import step_shapes as shapes
from artifactcache.choices import BuildChoices
from artifactcache.errors import BackendError, ShapeError
from artifactcache.models import WeightsSpec
from artifactcache.recipes import list_recipes, load_recipe
from artifactcache.store.local import LocalStore

TINY = [r.name for r in list_recipes() if r.name.startswith("tiny-")]


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """One store for the module, so each recipe is exported and optimized once."""
    root = tmp_path_factory.mktemp("ort-store")
    root.chmod(0o700)
    return LocalStore(root)


def _prompt(name: str) -> list[int]:
    return [r for r in list_recipes() if r.name == name][0].bench.prompt_ids


@pytest.mark.parametrize("recipe", TINY)
def test_parity_with_eager(recipe, store):
    res = api.build(recipe, "ort", store=store)
    assert res.entry.meta["ep"] == "cpu" and res.entry.meta["exporter_used"] == "dynamo"
    assert (res.entry.path / ortb.OPT_MODEL).is_file()
    ort_runner = api.load(recipe, "ort", store=store)
    eager = api.load(recipe, "eager", store=store)
    ids = list(_prompt(recipe))
    got, want = ort_runner.logits(ids), eager.logits(ids)
    assert got.dtype == torch.float32 and got.shape == want.shape
    rel = float((got - want).abs().max() / want.abs().max())
    assert rel <= 1e-4, f"{recipe}: max relative error {rel:.2e}"
    n = 24  # crosses tiny-mistral's 16-token sliding window
    assert ort_runner.generate(ids, n) == eager.generate(ids, n)


def test_batch_rows_equal_each_prompt_run_alone(store):
    """A max_batch 4 graph (static batch axis, row_start input) against eager batch 1."""
    # tiny-mistral: 24 new tokens after the 19-token prompt cross its 16-token window.
    batched = api.load("tiny-mistral", "ort", store=store, max_batch=4)
    assert shapes.cache_shape(batched.recipe)[1] == 4
    alone = api.load("tiny-mistral", "eager", store=store)
    assert_rows_match_alone(batched, alone, BATCH_PROMPTS, 24)
    assert_rows_match_alone(batched, alone, BATCH_PROMPTS[1:3], 6)  # two rows pad to four
    assert batched.generate(BATCH_PROMPTS[0], 10) == alone.generate(BATCH_PROMPTS[0], 10)
    with pytest.raises(ShapeError, match="a batch of 5 exceeds the artifact's max_batch 4"):
        batched.generate_batch([[1]] * 5, 2)


def test_warm_session_skips_optimization(store, monkeypatch, capfd):
    """ORT's own log: a build runs the optimizer passes, a warm load registers none."""
    api.build("tiny-llama", "ort", store=store)
    capfd.readouterr()
    monkeypatch.setenv("ACACHE_ORT_VERBOSE", "1")
    ctx = BuildContext(recipe=None, opts=None, weights=None)
    api.load("tiny-llama", "ort", store=store, context=ctx)
    warm_log = capfd.readouterr().err
    assert "No graph transformers registered for level 1" in warm_log
    assert "graph transformer(s) for level" not in warm_log
    api.build("tiny-llama", "ort", store=store, force=True)  # the export stays a hit
    cold_log = capfd.readouterr().err
    assert "graph transformer(s) for level 1" in cold_log
    assert ctx.phases["artifact_ready"] >= ctx.phases["entry_ready"]


def test_the_export_is_a_recorded_dependency(store):
    """api.py opens the export for ort and records its key; the CPU EP needs it only to build."""
    res = api.build("tiny-llama", "ort", store=store)
    ekey = res.entry.meta["export_key"]
    assert res.entry.meta["built_from"] == {ox.EXPORT_DEP: ekey}
    assert res.entry.depends_on == ()  # the optimized graph stands alone
    assert store.get(ekey).label["backend"] == "onnx-export"


def test_the_tensorrt_ep_needs_the_export_at_load():
    ctx = BuildContext(recipe=list_recipes()[0], opts=BuildChoices(), weights=WeightsSpec(None, 0))
    for mode, device, at_load in [("cpu", "cpu", False), ("tensorrt", "cuda", True)]:
        ctx.opts = BuildChoices(device=device, mode=mode)
        (dep,) = ortb.BACKEND.dependencies(ctx, "random:0", for_load=False)
        assert (dep.name, dep.at_load) == (ox.EXPORT_DEP, at_load)


def test_export_options_change_the_ort_key():
    b, ctx = api.make_context("tiny-llama", "ort")
    base = api.key_for(b, ctx).key
    keys = {
        api.key_for(*api.make_context("tiny-llama", "ort", extra={"opset": 19})).key,
        api.key_for(*api.make_context("tiny-llama", "ort", extra={"exporter": "torchscript"})).key,
        api.key_for(
            *api.make_context("tiny-llama", "ort", extra={"graph_optimization": "basic"})
        ).key,
        api.key_for(*api.make_context("tiny-llama", "ort", seed=1)).key,
    }
    assert len(keys) == 4 and base not in keys
    factors = api.key_for(b, ctx).factors
    assert factors["backend"]["options"]["export"]["opset"] == ortb.default_opset("cpu")
    assert "onnxruntime" in factors["toolchain"] and "cpu_isa" in factors["hardware"]


@pytest.mark.parametrize(
    ("ep", "version", "opset"),
    [
        ("cpu", (1, 32), 23),  # ONNX's Attention op, one CPU kernel
        ("cpu", (1, 23), 23),
        ("cpu", (1, 22), 18),  # no CPU Attention kernel yet
        ("cuda", (1, 32), 18),  # the CUDA EP ran Attention on the CPU
        ("tensorrt", (1, 32), 18),  # unverified with it
    ],
)
def test_the_default_opset_follows_the_execution_provider(monkeypatch, ep, version, opset):
    monkeypatch.setattr(ortb, "ort_version", lambda: version)
    assert ortb.default_opset(ep) == opset
    # An explicit --extra opset wins over the default.
    opts = BuildChoices(device="cpu", dtype="fp32", extra={"opset": 19})
    assert ortb.ort_export_spec(opts).opset == 19


def test_without_onnxruntime_ort_is_unavailable_not_a_traceback(monkeypatch, cache_dir):
    """check_options (the default opset) runs before require_available, and compare's
    availability() catches only AcacheError: neither may import onnxruntime."""
    from artifactcache.cli.app import app
    from artifactcache.measure import compare

    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # find_spec None, import fails
    assert ortb.ort_version() is None
    assert ortb.default_opset("cpu") == ox.DEFAULT_OPSET == 18
    r = CliRunner().invoke(app, ["build", "tiny-llama", "-b", "ort"])
    assert r.exit_code == 1, r.output
    assert r.exception is None or isinstance(r.exception, SystemExit), r.exception
    assert r.output.strip().count("\n") == 0, r.output
    assert "unavailable" in r.output and "onnxruntime not importable" in r.output
    spec = compare.CompareSpec(recipes=["tiny-llama"], backends=["ort"])
    ok, reason = compare.availability(spec)["ort"]
    assert not ok and "onnxruntime not importable" in reason


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"dtype": "bf16"}, "supports dtype fp32, not 'bf16'"),
        ({"dtype": "fp16"}, "supports dtype fp32, not 'fp16'"),
        ({"mode": "tensorrt"}, "--mode tensorrt runs on --device cuda"),
        ({"mode": "vulkan"}, "has modes cpu, cuda, tensorrt"),
        ({"extra": {"threads": 4}}, "does not take ['threads']"),
        ({"extra": {"graph_optimization": "max"}}, "graph_optimization must be one of"),
    ],
)
def test_bad_options_are_one_line_errors(kwargs, message):
    with pytest.raises(BackendError) as e:
        api.make_context("tiny-llama", "ort", **kwargs)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_prompt_outside_the_context(store):
    runner = api.load("tiny-llama", "ort", store=store)
    with pytest.raises(ShapeError, match="exceeds max_seq_len 64"):
        runner.logits(list(range(1, 66)))
    with pytest.raises(ShapeError, match="exceeds max_seq_len 64"):
        runner.generate([1, 2], 63)


def test_cli_bad_inputs_exit_1(cache_dir):
    from artifactcache.cli.app import app

    cli = CliRunner()
    r = cli.invoke(app, ["build", "tiny-llama", "--backend", "ort", "--dtype", "bf16"])
    assert r.exit_code == 1
    assert r.output.strip().count("\n") == 0 and "supports dtype fp32" in r.output
    tokens = ",".join(["1"] * 65)
    r = cli.invoke(app, ["run", "tiny-llama", "--backend", "ort", "--tokens", tokens])
    assert r.exit_code == 1, r.output
    assert r.output.strip().splitlines()[-1].startswith("error: 65 prompt + 1 new tokens")


def test_ort_tensorrt_ep_takes_the_same_prefill_profile(tmp_path):
    """The EP's one profile is the trt backend's prefill profile (step_shapes.step_profiles)."""
    recipe = load_recipe("tiny-llama").with_shapes(max_batch=2)  # prefill_len 8
    o = ortb.trt_ep_options(recipe, tmp_path, 0)
    assert o["trt_profile_min_shapes"] == "input_ids:2x1,input_pos:1,kv_pos:1,logit_rows:1"
    assert o["trt_profile_opt_shapes"] == "input_ids:2x8,input_pos:8,kv_pos:8,logit_rows:1"
    assert o["trt_profile_max_shapes"] == "input_ids:2x8,input_pos:8,kv_pos:64,logit_rows:8"
