"""The trt backend's --mode onnx build and load paths, run against a recording stand-in
for the tensorrt module (tests/_trt_standin.py), and every TensorRT name they touch
checked against the names in the real TensorRT Python bindings.

The bindings wheel (tensorrt-cu13-bindings) is read from $ACACHE_TRT_BINDINGS_WHEEL;
CI downloads it, so under CI=true a missing wheel fails instead of skipping. What this
cannot catch: a name that exists but on another class, a wrong argument, wrong
behaviour. It stays unverified on real TensorRT.
"""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from _trt_standin import Recording, StandinModule, bindings_names, bindings_wheel

from artifactcache import api
from artifactcache.backends.base import BuildContext
from artifactcache.backends.onnx import export as ox
from artifactcache.backends.onnx import step_shapes
from artifactcache.backends.shared import runner as runner_mod
from artifactcache.backends.tensorrt import BACKEND as TRT
from artifactcache.backends.tensorrt import loader
from artifactcache.choices import BuildChoices
from artifactcache.errors import BackendError
from artifactcache.models import WeightsSpec
from artifactcache.recipes import load_recipe
from artifactcache.store.keyformat import compute_key
from artifactcache.store.local import LocalStore

STANDIN_VERSION = "11.4.0.106"  # the served bindings' version; the wheel's own when given
# torchscript: the fast exporter (the stand-in never reads the graph).
EXTRA = {"exporter": "torchscript", "allow_host_code": True, "workspace_mb": 64}


def _install(monkeypatch, rec: Recording) -> None:
    """tensorrt -> the stand-in; a CUDA device that torch (CPU build) pretends to have."""
    monkeypatch.setitem(sys.modules, "tensorrt", StandinModule(rec))
    props = SimpleNamespace(name="Standin GPU", major=9, minor=0)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda idx=0: props)
    monkeypatch.setattr(
        torch.cuda, "current_stream", lambda device=None: SimpleNamespace(cuda_stream=0)
    )
    # The engine's tensors live on the CPU: only their addresses reach the stand-in.
    monkeypatch.setattr(runner_mod, "device_of", lambda opts: torch.device("cpu"))


def _exercise(monkeypatch, tmp_path: Path, rec: Recording, dtype: str = "fp32", **extra) -> dict:
    """Build twice (the second merges timing caches), load, generate, and a parser failure."""
    _install(monkeypatch, rec)
    store = LocalStore(tmp_path / "c")
    choice = dict(device="cuda", mode="onnx", dtype=dtype, extra={**EXTRA, **extra}, store=store)
    first = api.build("tiny-llama", "trt", **choice)
    second = api.build("tiny-llama", "trt", force=True, **choice)
    notes: list[str] = []
    ctx = BuildContext(recipe=None, opts=None, weights=None, progress=notes.append)
    runner = api.load("tiny-llama", "trt", context=ctx, **choice)
    tokens = runner.generate([1, 2, 3], 4)
    failing = Recording(rec.version, returns={"parse_from_file": False}, values={"num_errors": 2})
    _install(monkeypatch, failing)
    with pytest.raises(BackendError, match="TensorRT's ONNX parser rejected model.onnx") as err:
        api.build("tiny-llama", "trt", force=True, **choice)
    rec.paths |= failing.paths
    return {"first": first, "second": second, "tokens": tokens, "store": store,
            "error": str(err.value), "notes": notes}  # fmt: skip


def test_build_and_load_through_the_standin(monkeypatch, tmp_path):
    rec = Recording(STANDIN_VERSION)
    out = _exercise(monkeypatch, tmp_path, rec)
    meta = out["first"].entry.meta
    assert meta["tensorrt"] == STANDIN_VERSION and meta["allow_host_code"] is True
    assert meta["strongly_typed"] is True and meta["builder_flags"] == []
    # The builder got what the options and the recipe asked for.
    ((onnx_file,), _) = rec.called("parse_from_file")[0]
    assert Path(onnx_file).name == ox.MODEL_FILE
    assert Path(onnx_file).parent.name == meta["export_key"]
    flags = [repr(a[0]) for a, _ in rec.called("set_flag")]
    assert "<standin tensorrt.BuilderFlag.VERSION_COMPATIBLE>" in flags
    pools = [(repr(a[0]), a[1]) for a, _ in rec.called("set_memory_pool_limit")]
    assert ("<standin tensorrt.MemoryPoolType.WORKSPACE>", 64 << 20) in pools
    shapes = [a for a, _ in rec.called("set_shape")][:8]  # the first build's two profiles
    assert shapes == [
        ("input_ids", (1, 1), (1, 8), (1, 8)),
        ("input_pos", (1,), (8,), (8,)),
        ("kv_pos", (1,), (8,), (64,)),
        ("logit_rows", (1,), (1,), (8,)),
        ("input_ids", (1, 1), (1, 1), (1, 1)),
        ("input_pos", (1,), (1,), (1,)),
        ("kv_pos", (1,), (64,), (64,)),
        ("logit_rows", (1,), (1,), (1,)),
    ]
    assert rec.assigned("builder_optimization_level")[0] == 3
    # The timing cache: absent for the first build, read by the second, merged after each.
    assert (meta["timing_cache_loaded"], out["second"].entry.meta["timing_cache_loaded"]) == (
        False,
        True,
    )
    assert len(rec.called("combine")) == 1
    tc = out["store"].get(meta["built_from"][loader.TIMING_CACHE_DEP])
    assert tc.meta["merged_builds"] == 2 and tc.label["backend"] == "trt-timing-cache"
    # Load: host code allowed because the engine was built version-compatible; seven
    # bound tensors per step; one prefill and three decode steps.
    assert rec.assigned("engine_host_code_allowed") == [True]
    assert len(out["tokens"]) == 4
    assert len(rec.called("execute_async_v3")) == 4
    bound = {a[0] for a, _ in rec.called("set_tensor_address")}
    assert bound == set(step_shapes.INPUT_NAMES) | set(step_shapes.OUTPUT_NAMES)
    assert out["error"].count("get_error") == 2  # num_errors errors, each named


def test_a_plain_trt_build_is_the_onnx_engine(monkeypatch, tmp_path):
    """No --mode builds the plain TensorRT engine (model.plan, no TensorRT-LLM), and
    --mode onnx then finds that same entry: the key records the resolved mode."""
    rec = Recording(STANDIN_VERSION)
    _install(monkeypatch, rec)
    monkeypatch.delitem(sys.modules, "tensorrt_llm", raising=False)
    store = LocalStore(tmp_path / "c")
    choice = dict(device="cuda", extra={"exporter": "torchscript"}, store=store)
    default = api.build("tiny-llama", "trt", **choice)
    assert default.built and "model.plan" in default.entry.files
    assert rec.called("parse_from_file") and "tensorrt_llm" not in sys.modules
    onnx = api.build("tiny-llama", "trt", mode="onnx", **choice)
    assert not onnx.built and onnx.entry.key == default.entry.key
    assert api.load("tiny-llama", "trt", mode="onnx", **choice).generate([1, 2, 3], 2)


def test_an_entry_cannot_turn_on_host_code_for_itself(monkeypatch, tmp_path):
    """engine_host_code_allowed comes from the options (which the key covers); an entry
    whose meta claims host code they did not ask for is refused, never loaded with it."""
    import json

    from artifactcache.errors import IntegrityError

    rec = Recording(STANDIN_VERSION)
    _install(monkeypatch, rec)
    store = LocalStore(tmp_path / "c")
    choice = dict(
        device="cuda", mode="onnx", extra={**EXTRA, "allow_host_code": False}, store=store
    )
    entry = api.build("tiny-llama", "trt", **choice).entry
    assert entry.meta["allow_host_code"] is False
    manifest = json.loads((entry.path / "manifest.json").read_text())
    manifest["meta"]["allow_host_code"] = True
    (entry.path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(IntegrityError, match="runs host code .* its key does not allow"):
        api.load("tiny-llama", "trt", **choice)
    assert True not in rec.assigned("engine_host_code_allowed")


def test_a_disagreeing_plan_header_is_a_note_not_a_rebuild(monkeypatch, tmp_path):
    """The stand-in's plan bytes do not follow TensorRT's layout: the load must go on."""
    rec = Recording(STANDIN_VERSION)
    _install(monkeypatch, rec)
    store = LocalStore(tmp_path / "c")
    choice = dict(device="cuda", mode="onnx", extra={"exporter": "torchscript"}, store=store)
    entry = api.build("tiny-llama", "trt", **choice).entry
    head = bytearray(32)
    head[24:27] = bytes([10, 2, 0])  # reads as TensorRT 10.2.0; the manifest says 11.4
    plan = entry.path / "model.plan"
    blob = bytes(head) + plan.read_bytes()
    # Rewrite the entry's plan and its digest as a builder would have written them.
    rebuilt = store.get_or_build(
        entry.key, entry.factors, lambda w: _copy_entry(entry, w, blob), force=True
    )[0]
    notes: list[str] = []
    ctx = BuildContext(recipe=None, opts=None, weights=None, progress=notes.append)
    result, _ = api.load_with_result("tiny-llama", "trt", context=ctx, **choice)
    assert result.source == "local" and result.entry.key == rebuilt.key
    assert any("plan header reads TensorRT 10.2.0" in n for n in notes)
    assert not any(n.startswith("rebuilding") for n in notes)


def _copy_entry(entry, workdir: Path, blob: bytes) -> dict:
    (workdir / "model.plan").write_bytes(blob)
    return dict(entry.meta)


def test_trt_and_ort_share_one_export(monkeypatch, tmp_path):
    rec = Recording(STANDIN_VERSION)
    _install(monkeypatch, rec)
    ctx = BuildContext(
        recipe=load_recipe("tiny-llama"),
        opts=BuildChoices(device="cuda", mode="onnx"),
        weights=WeightsSpec(None, 0),
    )
    trt_export = TRT.dependencies(ctx, "random:0", for_load=False)[0]
    from artifactcache.backends.onnx import backend as ort_backend

    def ort_export_key(opts: BuildChoices) -> str:
        ctx.opts = opts
        (ort_export,) = ort_backend.BACKEND.dependencies(ctx, "random:0", for_load=False)
        assert trt_export.name == ort_export.name == ox.EXPORT_DEP
        return compute_key(ort_export.factors)

    trt_key = compute_key(trt_export.factors)
    # ort on the GPU exports at the same opset as trt: one export serves both.
    assert ort_export_key(BuildChoices(device="cuda", dtype="fp32")) == trt_key
    # ort on the CPU defaults to ONNX's Attention op (opset 23, onnxruntime >= 1.23): its
    # own export then, and the shared one again when the opsets are made equal.
    cpu_default = ort_export_key(BuildChoices())
    assert (cpu_default == trt_key) == (ort_backend.default_opset("cpu") == ox.DEFAULT_OPSET)
    assert ort_export_key(BuildChoices(extra={"opset": ox.DEFAULT_OPSET})) == trt_key
    ctx.opts = BuildChoices(device="cuda", mode="onnx")
    assert TRT.dependencies(ctx, "random:0", for_load=True) == []  # an engine stands alone


def test_every_tensorrt_name_the_code_touches_is_in_the_real_bindings(monkeypatch, tmp_path):
    wheel = bindings_wheel()
    names = bindings_names(wheel)
    rec = Recording(names.version)
    _exercise(monkeypatch, tmp_path, rec)
    if int(names.version.split(".")[0]) < 11:  # weak typing and its builder flags exist
        _exercise(monkeypatch, tmp_path / "weak", rec, "fp16", typing="weak")
        assert "FP16" in rec.names()
    touched = rec.names()
    assert {"Builder", "OnnxParser", "Runtime", "execute_async_v3"} <= touched
    missing = sorted(n for n in touched if not names.has(n))
    assert not missing, f"not in TensorRT {names.version}'s Python bindings: {missing}"


def test_the_names_check_can_fail(tmp_path):
    """A misspelt name is not in the bindings (the check is not vacuous)."""
    names = bindings_names(bindings_wheel())
    assert names.has("set_memory_pool_limit") and names.has("Builder")
    assert not names.has("set_memory_pool_limt")
    if int(names.version.split(".")[0]) >= 11:
        assert not names.has("FP16")  # TensorRT 11 removed the weak-typing builder flags
