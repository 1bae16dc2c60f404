"""artifactcache.compile(): any nn.Module, keyed without tracing, warm in a second process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from artifactcache.api import module as module_api
from artifactcache.errors import ModelSpecError, ShapeError
from artifactcache.sources.module import parse_input, spec_from_cli

ROOT = Path(__file__).resolve().parents[1]
CONVNET = str(ROOT / "examples" / "vision.py") + ":tiny_convnet"
CHILD = Path(__file__).with_name("_module_child.py")
# Stated in docs/modules.md: relative to the largest |eager output|, fp32.
TOLERANCE = {"eager": 0.0, "inductor": 1e-4, "aoti": 1e-4, "ort": 1e-4}


class TwoHeads(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(8, 16)
        self.a = nn.Linear(16, 4)
        self.register_buffer("scale", torch.tensor(2.0))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        h = torch.relu(self.body(x))
        return self.a(h) * self.scale, {"hidden": h}


class TwoHeadsEdited(TwoHeads):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        h = torch.tanh(self.body(x))
        return self.a(h) * self.scale, {"hidden": h}


def _model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return TwoHeads().eval()


def _key(model: nn.Module, backend: str, x: torch.Tensor, **kw) -> str:
    from artifactcache.sources.module import make_spec

    spec = make_spec(model, (x,), **kw)
    opts = module_api.module_choices(backend, spec, None)
    return module_api.module_key_for(backend, spec, opts)[1].key


def test_compile_is_reachable_from_every_public_path():
    import artifactcache
    from artifactcache import api
    from artifactcache.api import compile as api_compile

    assert artifactcache.compile is api_compile is api.compile
    assert artifactcache.build is api.build and artifactcache.load is api.load
    with pytest.raises(AttributeError):
        api.no_such_name  # noqa: B018


def test_eager_compile_builds_then_hits_with_same_outputs(cache_dir):
    m, x = _model(), torch.randn(3, 8)
    want = m(x)
    first = module_api.compile(m, (x,), backend="eager")
    second = module_api.compile(m, (x,), backend="eager")
    assert (first.source, second.source) == ("built", "local")
    got = second(x)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1]["hidden"], want[1]["hidden"])


def test_key_covers_class_source_inputs_and_user_version():
    x = torch.randn(3, 8)
    base = _key(_model(), "aoti", x)
    edited = TwoHeadsEdited().eval()
    edited.load_state_dict(_model().state_dict())
    assert _key(edited, "aoti", x) != base  # another forward, same tensors
    assert _key(_model(), "aoti", torch.randn(4, 8)) != base  # another input shape
    assert _key(_model(), "aoti", x, version="2") != base
    assert _key(_model(), "aoti", x, dynamic_shapes=[{0: (1, 16)}]) != base


def test_weights_are_in_the_key_only_where_the_artifact_holds_them():
    x = torch.randn(3, 8)
    for backend in ("aoti", "inductor", "eager"):
        assert _key(_model(0), backend, x) == _key(_model(1), backend, x)
    assert _key(_model(0), "ort", x) != _key(_model(1), "ort", x)
    assert _key(_model(0), "ort", x) == _key(_model(0), "ort", x)


def test_unreadable_class_source_is_named_with_a_note():
    from artifactcache.sources.module import class_sources

    ns: dict = {"nn": nn}
    exec("class Made(nn.Module):\n    def forward(self, x):\n        return x\n", ns)
    classes, notes = class_sources(ns["Made"]())
    assert "builtins.Made" in classes and classes["builtins.Made"] == "unreadable"
    assert notes and "not readable" in notes[0]


def test_calls_that_do_not_fit_the_artifact_are_refused(cache_dir):
    m = _model()
    f = module_api.compile(m, (torch.randn(3, 8),), backend="eager")
    with pytest.raises(ShapeError, match="built for 3x8:fp32"):
        f(torch.randn(4, 8))
    with pytest.raises(ShapeError, match="1 inputs, got 2"):
        f(torch.randn(3, 8), torch.randn(3, 8))
    g = module_api.compile(m, (torch.randn(3, 8),), backend="eager", dynamic_shapes=[{0: (1, 8)}])
    assert g(torch.randn(5, 8))[0].shape == (5, 4)
    with pytest.raises(ShapeError, match="dimension 0 in 1..8"):
        g(torch.randn(9, 8))


def test_inputs_the_model_rejects_fail_before_anything_is_cached(cache_dir):
    with pytest.raises(ShapeError, match="the model rejects inputs"):
        module_api.compile(_model(), (torch.randn(3, 5),), backend="eager")
    assert not list((cache_dir / "v1" / "entries").rglob("manifest.json"))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"dynamic_shapes": {0: (1, 4)}}, "one entry per input"),
        ({"dynamic_shapes": [{0: (4, 8)}]}, "must hold the example"),
        ({"dynamic_shapes": [{3: (1, 8)}]}, "not a dimension"),
        ({"dtype": "int8"}, "dtype must be one of"),
        ({"version": 2}, "version must be a string"),
    ],
)
def test_bad_arguments_are_one_line_errors(kwargs, match):
    with pytest.raises(ModelSpecError, match=match):
        module_api.compile(_model(), (torch.randn(3, 8),), backend="eager", **kwargs)


def test_not_a_module_is_refused():
    with pytest.raises(ModelSpecError, match="expected a torch.nn.Module"):
        module_api.compile(lambda x: x, (torch.randn(1),), backend="eager")


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("1x3:fp8", "dtype must be one of"),
        ("1xx3", "expected SHAPE"),
        ("1x0", "at least 1"),
        ("1x3:fp16", "pass --dtype fp16"),
        ("1x3:fp32:7", "HIGH is a positive bound"),
    ],
)
def test_input_specs_are_checked(text, match):
    with pytest.raises(ModelSpecError, match=match):
        parse_input(text)


def test_input_specs_parse():
    s = parse_input("2x16:int64:100")
    assert (s.shape, s.dtype, s.high) == ((2, 16), "int64", 100)
    t = s.make("cpu", torch.Generator().manual_seed(0))
    assert t.dtype == torch.int64 and 0 <= int(t.min()) and int(t.max()) < 100


def test_cli_spec_takes_the_factory_inputs_or_the_given_ones():
    spec = spec_from_cli(CONVNET, None)
    assert [s.describe() for s in spec.inputs] == ["2x3x32x32:fp32"]
    assert spec_from_cli(CONVNET, ["5x3x32x32"]).inputs[0].shape == (5, 3, 32, 32)
    assert spec_from_cli(CONVNET, None, batch=3).example_inputs[0].shape[0] == 3
    # The same seed gives the same random weights in every process: ort keys on them.
    a, b = spec_from_cli(CONVNET, None), spec_from_cli(CONVNET, None)
    from artifactcache.sources.module import state_digest

    assert state_digest(a.module) == state_digest(b.module)


# ------------------------------------------------------------------ the CLI --


def _acache(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "artifactcache.cli", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=600,
    )


@pytest.mark.parametrize(
    ("spec", "extra", "match"),
    [
        ("no_such_pkg_xyz.models:net", [], "cannot import 'no_such_pkg_xyz.models'"),
        (str(ROOT / "examples" / "vision.py") + ":nope", [], "has no callable 'nope'"),
        (str(ROOT / "examples" / "vision.py") + ":resnet50", [], "the factory raised"),
        (CONVNET, ["--input", "2x5x32x32"], "the model rejects inputs"),
        (CONVNET, ["--input", "2x3:fp8"], "dtype must be one of"),
        ("tiny-llama", ["--input", "1x3"], "--input is for a model spec"),
    ],
)
def test_cli_spec_errors_are_one_line_and_write_nothing(cache_dir, spec, extra, match):
    if "resnet50" in spec and _has_torchvision():
        pytest.skip("torchvision is installed: the factory works")
    out = _acache("build", spec, "--backend", "eager", *extra)
    assert out.returncode == 1, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and match in lines[0], lines
    assert not list(cache_dir.rglob("manifest.json"))


@pytest.mark.skipif(torch.cuda.is_available(), reason="torch sees a GPU here")
def test_cli_spec_on_a_gpu_torch_cannot_see_is_one_line(cache_dir):
    out = _acache("build", CONVNET, "--backend", "eager", "--device", "cuda")
    assert out.returncode == 1, out.stderr
    lines = out.stderr.strip().splitlines()
    assert lines == ["error: device 'cuda': torch sees no CUDA GPU; use --device cpu"], lines
    assert not list(cache_dir.rglob("manifest.json"))


def _has_torchvision() -> bool:
    import importlib.util

    return importlib.util.find_spec("torchvision") is not None


def test_cli_build_run_and_key_explain(cache_dir):
    built = _acache("build", CONVNET, "-b", "eager", "--json")
    assert built.returncode == 0, built.stderr
    key = json.loads(built.stdout)["key"]
    ran = _acache("run", CONVNET, "-b", "eager", "--json")
    assert ran.returncode == 0, ran.stderr
    run = json.loads(ran.stdout)
    assert run["status"] == "hit" and run["key"] == key
    assert run["outputs"][0]["shape"] == [2, 10]
    spec = spec_from_cli(CONVNET, None)
    with torch.no_grad():
        want = float(spec.module(*spec.example_inputs).double().sum())
    assert run["outputs"][0]["checksum"] == pytest.approx(want, rel=1e-6)
    explained = _acache("key", CONVNET, "-b", "eager", "--json")
    factors = json.loads(explained.stdout)
    assert factors["key"] == key
    assert factors["factors"]["recipe"]["inputs"] == [{"shape": [2, 3, 32, 32], "dtype": "fp32"}]
    assert any(k.endswith("TinyConvNet") for k in factors["factors"]["recipe"]["classes"])


def test_cli_bench_reports_latency_and_items_per_batch_size(cache_dir):
    out = _acache(
        "bench", CONVNET, "-b", "eager", "--batches", "1,4", "--iters", "3", "--warmup", "1",
        "--json",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)["batches"]
    assert [r["batch"] for r in rows] == [1, 4]
    for r in rows:
        assert r["iterations"] == 3 and r["items_per_s"] > 0
        assert r["latency"]["p50"] <= r["latency"]["p99"]
        assert r["inputs"] == [f"{r['batch']}x3x32x32:fp32"]


def test_cli_compare_runs_a_model_spec_and_reports_items_per_second(cache_dir, tmp_path):
    out = _acache(
        "compare", "--recipes", CONVNET, "--backends", "eager", "--runs", "1", "--iters", "2",
        "--out", str(tmp_path / "report"), "--json",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    bench = report["pairs"][f"{CONVNET}/eager"]["bench"]
    assert bench["kind"] == "module" and bench["items_per_s"] > 0 and bench["batch"] == 2
    assert "items/s" in (tmp_path / "report" / "report.md").read_text()


# ------------------------------------------- compiled backends (slow, CPU) --


def _load_in_child(root: Path, spec: str, backend: str) -> dict:
    out = subprocess.run(
        [sys.executable, str(CHILD), str(root), spec, backend],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "ACACHE_DIR": str(root)},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def _rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got - want).abs().max() / want.abs().max()).item()


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["inductor", "aoti", "ort"])
def test_compiled_backend_matches_eager_and_a_second_process_hits_without_export(
    cache_dir, backend
):
    spec = spec_from_cli(CONVNET, None)
    want = spec.module(*spec.example_inputs).detach()
    res, compiled = module_api.compile_with_result(spec, backend)
    assert res.built
    assert _rel_err(compiled(*spec.example_inputs), want) <= TOLERANCE[backend]

    child = _load_in_child(cache_dir, CONVNET, backend)  # export raises in there
    assert child["source"] == "local" and child["key"] == res.key
    assert _rel_err(torch.tensor(child["output"]), want) <= TOLERANCE[backend]
    inductor = child["counters"].get("inductor", {})
    if backend == "inductor":
        # Dynamo traces, the FX graph cache hits: nothing is lowered or compiled.
        assert inductor.get("fxgraph_cache_hit", 0) >= 1
        assert inductor.get("fxgraph_cache_miss", 0) == 0
    else:
        # Nothing traced or compiled: neither Dynamo nor Inductor is even imported.
        assert not child["dynamo_imported"] and not child["inductor_imported"]
