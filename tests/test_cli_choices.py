"""@with_choices: every build choice becomes an option of each command that takes it."""

from __future__ import annotations

import dataclasses
import json

import typer
from typer.testing import CliRunner

from artifactcache.choices import BuildChoices
from artifactcache.cli.choices import with_choices


def _app() -> typer.Typer:
    app = typer.Typer()

    @app.command("go")
    @with_choices
    def go(model: str, choices: BuildChoices, force: bool = False) -> None:
        print(json.dumps({"model": model, "force": force, "choices": choices.to_json()}))

    @app.command("other")
    def other() -> None:  # a second command, so "go" stays a subcommand
        pass

    return app


def test_each_field_is_an_option_and_reaches_the_command_whole():
    res = CliRunner().invoke(_app(), [
        "go", "tiny", "--device", "cuda", "--extra", "opset=18", "--extra", "fast=true",
        "--input", "1x2", "--input", "3x4", "--weights", "/tmp", "--max-batch", "4", "--force",
    ])  # fmt: skip
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    got = BuildChoices.from_json(out["choices"])
    assert out["model"] == "tiny" and out["force"] is True
    # No --dtype: the device's default (defaults.py), bf16 on cuda.
    assert got == BuildChoices(device="cuda", dtype="bf16", extra={"opset": 18, "fast": True},
                               inputs=("1x2", "3x4"), weights="/tmp", max_batch=4)  # fmt: skip


def test_help_lists_every_choice_flag():
    res = CliRunner().invoke(_app(), ["go", "--help"], env={"COLUMNS": "200"})
    assert res.exit_code == 0
    for f in dataclasses.fields(BuildChoices):
        assert f.metadata["flag"] in res.output, f.name


def test_bad_values_are_errors_before_the_command_runs():
    res = CliRunner().invoke(_app(), ["go", "tiny", "--extra", "novalue"])
    assert res.exit_code != 0 and "expected KEY=VALUE" in str(res.exception or res.output)
    res = CliRunner().invoke(_app(), ["go", "tiny", "--seed", str(2**64)])
    assert res.exit_code != 0
