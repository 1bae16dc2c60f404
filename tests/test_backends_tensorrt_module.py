"""backends/module_trt.py: any nn.Module through ONNX -> TensorRT.

TensorRT cannot be installed here, so the build and load paths run against the
recording stand-in (tests/_trt_standin.py): what reaches the builder (the export,
profiles, flags), what the runner binds (names, shapes, dtypes), the key's factors.
The export itself is real. Whether an engine built this way runs, and matches eager,
is unverified: that test skips without tensorrt and a GPU.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from _trt_standin import Recording, StandinModule, bindings_names, bindings_wheel
from torch import nn
from typer.testing import CliRunner

from artifactcache.api import module as module_api
from artifactcache.backends.onnx.export_module import export_module
from artifactcache.backends.shared import runner as runner_mod
from artifactcache.backends.tensorrt import module as module_trt
from artifactcache.choices import BuildChoices
from artifactcache.dtypes import INPUT_DTYPES
from artifactcache.errors import BackendError, BackendUnavailable, StaleArtifact
from artifactcache.sources.module import make_spec
from artifactcache.store.local import LocalStore

HAVE_TRT = importlib.util.find_spec("tensorrt") is not None
ROOT = Path(__file__).resolve().parents[1]
CONVNET = str(ROOT / "examples" / "vision.py") + ":tiny_convnet"
VERSION = "11.4.0.106"
FAST = {"exporter": "torchscript"}  # the stand-in never reads the graph: the quick exporter


class Tagger(nn.Module):
    """A float input with a dynamic batch, an int64 input, an unused input, nested outputs."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor, ids: torch.Tensor, unused: torch.Tensor) -> tuple:
        return self.proj(x), {"ids": ids * 2}


def _spec(seed: int = 0, device: str = "cuda:0"):
    """A spec as make_spec builds it, then marked cuda: the tensors stay on the CPU."""
    torch.manual_seed(seed)
    inputs = (torch.randn(4, 8), torch.zeros(4, 3, dtype=torch.int64), torch.randn(2))
    spec = make_spec(Tagger().eval(), inputs, dynamic_shapes=[{0: (1, 16)}, {0: (1, 16)}, None])
    return dataclasses.replace(spec, device=device)


# The engine the stand-in pretends to have built from Tagger's torchscript export, which
# drops the unused input.
ENGINE_IO = {
    "input_0": ("INPUT", "FLOAT"),
    "input_1": ("INPUT", "INT64"),
    "output_0": ("OUTPUT", "FLOAT"),
    "output_1": ("OUTPUT", "INT64"),
}


def _recording(version: str = VERSION, io: dict | None = None, **kw) -> Recording:
    io = ENGINE_IO if io is None else io
    rec = Recording(version, **kw)
    names = list(io)
    # Enum members read as their names, so the engine can answer with them.
    rec.values.update({m: m for m in (*module_trt.TRT_TO_TORCH, "INPUT", "OUTPUT")})
    rec.values["num_io_tensors"] = len(names)

    def shape(name: str) -> tuple[int, ...]:
        # An output's shape follows the batch of the last input shape set on the context.
        batch = rec.called("set_input_shape")[-1][0][1][0]
        return {"output_0": (batch, 4), "output_1": (batch, 3)}[name]

    rec.computed.update(
        get_tensor_name=lambda i: names[i],
        get_tensor_mode=lambda n: io[n][0],
        get_tensor_dtype=lambda n: io[n][1],
        get_tensor_shape=shape,
    )
    return rec


def _install(monkeypatch, rec: Recording) -> None:
    monkeypatch.setitem(sys.modules, "tensorrt", StandinModule(rec))
    props = SimpleNamespace(name="Standin GPU", major=9, minor=0)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda idx=0: props)
    monkeypatch.setattr(
        torch.cuda, "current_stream", lambda device=None: SimpleNamespace(cuda_stream=7)
    )
    # The engine's tensors live on the CPU: only their addresses reach the stand-in.
    monkeypatch.setattr(runner_mod, "device_of", lambda opts: torch.device("cpu"))


def _compile(spec, store, **options):
    return module_api.compile_with_result(spec, "trt", options={**FAST, **options}, store=store)


# ------------------------------------------------------------------ profiles --


def test_profiles_from_the_example_inputs_and_dynamic_shapes():
    spec = _spec()
    assert module_trt.module_profiles(spec) == [
        {"input_0": ((1, 8), (4, 8), (16, 8)), "input_1": ((1, 3), (4, 3), (16, 3))}
    ]
    # An input the export dropped gets no entry; no dynamic input, no profile.
    graph = {"input_0": [None, 8], "input_2": [2]}
    assert module_trt.module_profiles(spec, graph) == [{"input_0": ((1, 8), (4, 8), (16, 8))}]
    static = make_spec(Tagger().eval(), spec.example_inputs)
    assert module_trt.module_profiles(static) == []
    with pytest.raises(BackendError, match="made dimension 0 of input 0 static"):
        module_trt.module_profiles(spec, {"input_0": [4, 8]})


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_the_export_is_dynamic_exactly_where_the_profile_ranges(tmp_path, exporter):
    spec = _spec(device="cpu")
    path = tmp_path / "m.onnx"
    opts = BuildChoices(extra={"exporter": exporter})
    export_module(spec, opts, path, 2, external=False)
    graph = module_trt.graph_inputs(path)
    (profile,) = module_trt.module_profiles(spec, graph)
    for name, (lo, _, hi) in profile.items():
        dynamic = [d for d, size in enumerate(graph[name]) if size is None]
        assert dynamic == [d for d in range(len(lo)) if lo[d] != hi[d]], name
    assert set(profile) <= set(graph)


def test_engine_dtypes_map_to_torch():
    trt = SimpleNamespace(
        DataType=SimpleNamespace(**{m: object() for m in module_trt.TRT_TO_TORCH})
    )
    assert module_trt.torch_dtype_of(trt, trt.DataType.HALF) is torch.float16
    assert module_trt.torch_dtype_of(trt, trt.DataType.INT64) is torch.int64
    with pytest.raises(BackendError, match="does not bind"):
        module_trt.torch_dtype_of(trt, object())
    # Every dtype a module's input or output may have in acache binds.
    assert {d.torch_name for d in INPUT_DTYPES.values()} <= set(module_trt.TRT_TO_TORCH.values())


# ----------------------------------------------------------------------- key --


def test_key_covers_the_weights_profiles_and_the_driver(monkeypatch):
    _install(monkeypatch, _recording())

    def key(spec, **options):
        opts = module_api.module_choices("trt", spec, {**FAST, **options})
        return module_api.module_key_for("trt", spec, opts)[1]

    base = key(_spec(0))
    f = base.factors
    assert f["weights"].startswith("blake3:")  # the engine holds the weights
    assert key(_spec(1)).key != base.key
    assert f["backend"]["options"]["profiles"][0]["input_0"] == [[1, 8], [4, 8], [16, 8]]
    assert f["backend"]["options"]["typing"] == "strong"
    assert "driver" in f["hardware"] and f["hardware"]["gpu"] == "Standin GPU"
    assert "tensorrt" in f["toolchain"] and "tensorrt_llm" not in f["toolchain"]
    assert key(_spec(0), mode="onnx").key == base.key  # onnx is the one mode
    assert key(_spec(0), opt_level=5).key != base.key


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"mode": "llm"}, "through its ONNX export"),
        ({"typing": "weak"}, "typing=weak is not offered for a module"),
        ({"timing_cache": False}, "does not take ['timing_cache'] for a module"),
        ({"opt_level": 9}, "opt_level must be 0-5"),
        ({"opset": 9}, "opset 9 is too old"),
    ],
)
def test_bad_options_are_one_line_errors(options, match):
    with pytest.raises(BackendError) as e:
        module_api.compile(Tagger().eval(), _spec(device="cpu").example_inputs, backend="trt",
                    options=options)  # fmt: skip
    assert match in str(e.value) and "\n" not in str(e.value)


@pytest.mark.skipif(HAVE_TRT, reason="tensorrt is importable here")
def test_without_tensorrt_a_build_is_one_line_naming_the_package(cache_dir):
    spec = _spec(device="cpu")
    with pytest.raises(BackendUnavailable, match=r"pip install 'artifactcache\[trt\]'"):
        module_api.compile(spec.module, spec.example_inputs, backend="trt")
    from artifactcache.cli.app import app

    r = CliRunner().invoke(app, ["build", CONVNET, "--backend", "trt"])
    assert r.exit_code == 1
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: backend 'trt' is unavailable: tensorrt")
    assert "pip install 'artifactcache[trt]'" in lines[0]
    assert not list(cache_dir.rglob("manifest.json"))


# ---------------------------------------------------------- build and load --


def test_build_then_hit_through_the_standin(monkeypatch, tmp_path):
    rec = _recording()
    _install(monkeypatch, rec)
    store = LocalStore(tmp_path / "c")
    spec = _spec()
    res, _ = _compile(spec, store, workspace_mb=64)
    assert res.built
    ((onnx_file,), _) = rec.called("parse_from_file")[0]
    assert Path(onnx_file).name == "export.onnx"
    # The torchscript export drops the unused input: its profile names the two others.
    assert [a for a, _ in rec.called("set_shape")] == [
        ("input_0", (1, 8), (4, 8), (16, 8)),
        ("input_1", (1, 3), (4, 3), (16, 3)),
    ]
    assert len(rec.called("add_optimization_profile")) == 1
    assert [repr(a[0]) for a, _ in rec.called("set_flag")] == []  # strongly typed, no flags
    pools = [(repr(a[0]), a[1]) for a, _ in rec.called("set_memory_pool_limit")]
    assert pools == [("<standin tensorrt.MemoryPoolType.WORKSPACE>", 64 << 20)]
    meta = res.entry.meta
    assert meta["tensorrt"] == VERSION and meta["engine_inputs"] == ["input_0", "input_1"]
    assert sorted(res.entry.files) == ["model.plan", "module.json"]  # the export is gone

    # A hit: nothing exported, parsed or built.
    def no_export(*a, **k):
        raise AssertionError("exported on a hit")

    monkeypatch.setattr(torch.onnx, "export", no_export)
    parsed = len(rec.called("parse_from_file"))
    res2, compiled = _compile(spec, store, workspace_mb=64)
    assert res2.source == "local" and len(rec.called("parse_from_file")) == parsed
    assert rec.assigned("engine_host_code_allowed")[-1] is False

    x, ids = torch.randn(6, 8), torch.ones(6, 3, dtype=torch.int64)
    out, extra = compiled(x, ids, torch.randn(2))
    # Shapes set on the context by name; outputs allocated at the shapes it reports,
    # in the engine's dtypes, and rebuilt into the module's output structure.
    assert [a for a, _ in rec.called("set_input_shape")] == [
        ("input_0", (6, 8)),
        ("input_1", (6, 3)),
    ]
    assert out.shape == (6, 4) and out.dtype == torch.float32
    assert extra["ids"].shape == (6, 3) and extra["ids"].dtype == torch.int64
    bound = [a[0] for a, _ in rec.called("set_tensor_address")]
    assert bound == ["input_0", "input_1", "output_0", "output_1"]
    assert rec.called("execute_async_v3") == [((7,), {})]  # torch's current stream


def _claim_host_code(entry) -> None:
    """Rewrite the entry's manifest so its meta asks for host code (as an imported or
    pulled entry could say: the manifest is the entry's own word, not its key)."""
    import json

    path = entry.path / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["meta"]["allow_host_code"] = True
    path.write_text(json.dumps(manifest))


def test_host_code_comes_from_the_options_never_from_the_entry(monkeypatch, tmp_path):
    from artifactcache.errors import IntegrityError

    rec = _recording()
    _install(monkeypatch, rec)
    store = LocalStore(tmp_path / "c")
    spec = _spec()
    res, _ = _compile(spec, store)
    _claim_host_code(res.entry)
    with pytest.raises(IntegrityError, match="runs host code .* its key does not allow") as e:
        module_api.compile_with_result(spec, "trt", options=FAST, store=store, build_on_miss=False)
    assert "\n" not in str(e.value)
    assert True not in rec.assigned("engine_host_code_allowed")
    # Asked for (and so in the key): allowed.
    _compile(spec, store, allow_host_code=True)
    assert rec.assigned("engine_host_code_allowed")[-1] is True


def test_engine_inputs_cast_to_the_engines_dtype(monkeypatch, tmp_path):
    """An engine that took int64 ids as int32 (TensorRT before 10) is bound int32 tensors."""
    io = {**ENGINE_IO, "input_1": ("INPUT", "INT32")}
    _install(monkeypatch, _recording(io=io))
    spec = _spec()
    _, compiled = _compile(spec, LocalStore(tmp_path / "c"))
    engine = compiled._fn
    assert isinstance(engine, module_trt.EngineModule)
    bound = engine.bind_inputs(spec.example_inputs)
    assert [t.dtype for t in bound] == [torch.float32, torch.int32]
    assert [tuple(t.shape) for t in bound] == [(4, 8), (4, 3)]


def test_a_stale_engine_is_rebuilt_once(monkeypatch, tmp_path):
    store = LocalStore(tmp_path / "c")
    spec = _spec()
    _install(monkeypatch, _recording("11.4.0"))
    first, _ = _compile(spec, store)
    # Another TensorRT at load, the same key (the stand-in has no package version).
    _install(monkeypatch, _recording("11.5.0"))
    with pytest.raises(StaleArtifact, match="built with TensorRT 11.4.0"):
        module_api.compile_with_result(spec, "trt", options=FAST, store=store, build_on_miss=False)
    again, _ = _compile(spec, store)
    assert again.key == first.key and again.source == "built"
    assert again.entry.meta["tensorrt"] == "11.5.0"


def test_an_engine_that_does_not_deserialize_is_one_line(monkeypatch, tmp_path):
    rec = _recording(returns={"deserialize_cuda_engine": None})
    _install(monkeypatch, rec)
    with pytest.raises(StaleArtifact, match="could not deserialize") as e:
        _compile(_spec(), LocalStore(tmp_path / "c"))
    assert "\n" not in str(e.value)
    assert len(rec.called("build_serialized_network")) == 2  # built, then rebuilt once


@pytest.mark.parametrize(
    ("io", "match"),
    [
        ({k: v for k, v in ENGINE_IO.items() if k != "output_1"}, "engine's outputs"),
        ({**ENGINE_IO, "extra": ("INPUT", "FLOAT")}, r"inputs \['extra'\] the module does not"),
        ({**ENGINE_IO, "output_0": ("OUTPUT", "FP4")}, "does not bind"),
    ],
)
def test_an_engine_that_does_not_fit_the_module_is_refused(monkeypatch, tmp_path, io, match):
    _install(monkeypatch, _recording(io=io))
    with pytest.raises(BackendError, match=match):
        _compile(_spec(), LocalStore(tmp_path / "c"))


def test_a_data_dependent_output_shape_is_refused(monkeypatch, tmp_path):
    rec = _recording()
    _install(monkeypatch, rec)
    rec.computed["get_tensor_shape"] = lambda name: (-1, 4)
    spec = _spec()
    _, compiled = _compile(spec, LocalStore(tmp_path / "c"))
    with pytest.raises(BackendError, match="data-dependent shape"):
        compiled(*spec.example_inputs)


def test_every_tensorrt_name_the_module_path_touches_is_in_the_real_bindings(monkeypatch, tmp_path):
    names = bindings_names(bindings_wheel())
    rec = _recording(names.version)
    _install(monkeypatch, rec)
    spec = _spec()
    _, compiled = _compile(spec, LocalStore(tmp_path / "c"), workspace_mb=64)
    compiled(*spec.example_inputs)
    touched = rec.names() | set(module_trt.TRT_TO_TORCH)  # every type the runner maps
    assert {"get_tensor_shape", "get_tensor_dtype", "set_shape", "num_io_tensors"} <= touched
    missing = sorted(n for n in touched if not names.has(n))
    assert not missing, f"not in TensorRT {names.version}'s Python bindings: {missing}"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.skipif(not HAVE_TRT, reason="tensorrt not importable")
def test_engine_matches_eager_on_a_gpu(tmp_path):
    from artifactcache.sources.module import spec_from_cli

    spec = spec_from_cli(CONVNET, None, device="cuda")
    want = spec.module(*spec.example_inputs).detach()
    _, compiled = module_api.compile_with_result(spec, "trt", store=LocalStore(tmp_path / "c"))
    got = compiled(*spec.example_inputs)
    assert float((got - want).abs().max() / want.abs().max()) <= 1e-3
