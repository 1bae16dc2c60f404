"""The command line's defaults: fit for the machine and the model (artifactcache/defaults.py)."""

from __future__ import annotations

import json

import pytest
import typer
from typer.testing import CliRunner

from artifactcache import defaults
from artifactcache.choices import BuildChoices
from artifactcache.cli.app import DefaultBackendOpt, RecipeArg
from artifactcache.cli.choices import with_choices


def _folder(tmp_path, **config):
    d = tmp_path / "ckpt"
    d.mkdir(exist_ok=True)
    (d / "config.json").write_text(json.dumps(config))
    return d


@pytest.mark.parametrize(
    ("config", "device", "want"),
    [
        ({"torch_dtype": "bfloat16"}, "cpu", "bf16"),
        ({"dtype": "float16"}, "cuda", "fp16"),
        ({"dtype": "float16"}, "cpu", "fp32"),  # CPU fp16 kernels are slow or missing
        ({"torch_dtype": "float32"}, "cuda:1", "fp32"),
        ({"torch_dtype": "int8"}, "cuda", "bf16"),  # not one of ours: the device's default
        ({}, "cuda", "bf16"),
        ({}, "cpu", "fp32"),
    ],
)
def test_a_checkpoints_own_dtype_else_the_devices(tmp_path, config, device, want):
    assert defaults.default_dtype(device, _folder(tmp_path, **config)) == want


def test_the_model_folder_comes_from_weights_or_a_folder_recipe(tmp_path):
    folder = _folder(tmp_path, dtype="bfloat16")
    (folder / "model.safetensors").write_bytes(b"")
    assert defaults.model_folder(str(folder), None) == folder
    assert defaults.model_folder("tiny-llama", str(folder / "model.safetensors")) == folder
    assert defaults.model_folder("tiny-llama", None) is None
    assert defaults.model_folder(str(tmp_path), None) is None  # no config.json there
    assert (
        defaults.default_backend("cuda:0") == "aoti" and defaults.default_backend("cpu") == "eager"
    )


def _capture():
    app = typer.Typer()
    seen = {}

    @app.command()
    @with_choices
    def cmd(recipe: RecipeArg, choices: BuildChoices, backend: DefaultBackendOpt = None) -> None:
        seen.update(choices=choices, backend=backend)

    return app, seen


def test_the_command_line_fills_in_the_machines_defaults(tmp_path, monkeypatch):
    app, seen = _capture()

    def got():
        return seen["choices"].device, seen["choices"].dtype, seen["backend"]

    monkeypatch.setattr(defaults, "default_device", lambda backends=(): "cuda")
    folder = _folder(tmp_path, torch_dtype="float16")
    r = CliRunner().invoke(app, ["tiny-llama"])
    assert r.exit_code == 0, r.output
    assert got() == (
        "cuda",
        "bf16",
        "aoti",
    )
    CliRunner().invoke(app, [str(folder)])
    assert seen["choices"].dtype == "fp16"  # the checkpoint's own
    CliRunner().invoke(app, [str(folder), "--dtype", "fp32", "-b", "ort", "--device", "cpu"])
    assert got() == (
        "cpu",
        "fp32",
        "ort",
    )
    monkeypatch.setattr(defaults, "default_device", lambda backends=(): "cpu")
    CliRunner().invoke(app, ["tiny-llama"])
    assert got() == (
        "cpu",
        "fp32",
        "eager",
    )


def test_ort_gets_a_dtype_and_device_its_providers_run(tmp_path, monkeypatch):
    assert defaults.default_dtype("cuda", None, ("ort",)) == "fp16"
    assert defaults.default_dtype("cpu", _folder(tmp_path, dtype="bfloat16"), ("ort",)) == "fp32"
    assert defaults.default_dtype("cuda", None, ("eager", "ort")) == "fp16"  # compare's list
    app, seen = _capture()
    monkeypatch.setattr(defaults, "default_device", lambda backends=(): "cuda")
    CliRunner().invoke(app, ["tiny-llama", "-b", "ort"])
    assert (seen["choices"].device, seen["choices"].dtype) == ("cuda", "fp16")


def test_models_whose_own_dtypes_differ_need_a_dtype(tmp_path, monkeypatch):
    """compare's --recipes: one default for all of them, never the first one's alone."""
    seen = {}
    app = typer.Typer()

    @app.command()
    @with_choices
    def cmd(recipes: str = typer.Option(..., "--recipes"), *, choices: BuildChoices):
        seen["choices"] = choices

    monkeypatch.setattr(defaults, "default_device", lambda backends=(): "cuda")
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    bf16 = _folder(tmp_path / "a", torch_dtype="bfloat16")
    fp16 = _folder(tmp_path / "b", torch_dtype="float16")
    r = CliRunner().invoke(app, ["--recipes", f"{bf16},tiny-llama"])
    assert r.exit_code == 0, r.output
    assert seen["choices"].dtype == "bf16"  # the same default for both
    r = CliRunner().invoke(app, ["--recipes", f"{bf16},{fp16}"])
    said = str(r.exception)  # an ArgumentError: acache's app prints it as one line
    assert "dtypes differ" in said and "--dtype" in said and "\n" not in said
    r = CliRunner().invoke(app, ["--recipes", f"{bf16},{fp16}", "--dtype", "fp16"])
    assert r.exit_code == 0 and seen["choices"].dtype == "fp16"
