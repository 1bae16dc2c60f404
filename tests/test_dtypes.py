"""artifactcache/dtypes.py: one dtype table; torch, the CLI and bench agree with it."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from artifactcache.cli import app
from artifactcache.dtypes import DTYPE_NAMES, DTYPES, TORCH_DTYPE_NAMES, check_dtype, torch_dtype
from artifactcache.errors import BackendError
from artifactcache.measure.bench import bytes_per_token
from artifactcache.recipes import load_recipe


@pytest.mark.parametrize("name", DTYPE_NAMES)
def test_table_agrees_with_torch(name: str) -> None:
    t = torch_dtype(name)
    assert t.is_floating_point
    assert t.itemsize == DTYPES[name].bytes
    assert str(t) == f"torch.{DTYPES[name].torch_name}"


def test_names() -> None:
    assert DTYPE_NAMES == ("fp32", "bf16", "fp16")
    assert TORCH_DTYPE_NAMES == ("float32", "bfloat16", "float16")


@pytest.mark.parametrize("name", ["float32", "int8", "FP32", ""])
def test_unknown_dtype_is_one_line(name: str) -> None:
    with pytest.raises(BackendError, match=r"^unknown dtype .*: choose one of fp32, bf16, fp16 "):
        check_dtype(name)
    with pytest.raises(BackendError):
        torch_dtype(name)


@pytest.mark.parametrize(
    ("typed", "name"),
    [("bfloat16", "bf16"), ("torch.float16", "fp16"), ("half", "fp16"), ("Float32", "fp32"),
     ("BF16", "bf16"), ("fp8", "fp8")],
)  # fmt: skip
def test_a_build_choice_takes_every_spelling_of_a_dtype(typed: str, name: str) -> None:
    """Stored under the table's name, so `--dtype bfloat16` keys the `--dtype bf16` entry;
    an unknown name is kept for the backend's one-line refusal."""
    from artifactcache.choices import BuildChoices

    assert BuildChoices(dtype=typed).dtype == name
    assert BuildChoices(dtype=typed) == BuildChoices(dtype=name)


def test_the_cli_keys_a_dtype_alias_as_its_name() -> None:
    def key(dtype: str) -> str:
        r = CliRunner().invoke(app, ["key", "tiny-llama", "-b", "eager", "--dtype", dtype])
        assert r.exit_code == 0, r.output
        return r.output.strip().splitlines()[-1]

    assert key("bfloat16") == key("bf16") != key("fp32")


def test_bench_bytes_follow_the_table() -> None:
    recipe = load_recipe("tiny-llama")
    fp32, bf16 = bytes_per_token(recipe, "fp32"), bytes_per_token(recipe, "bf16")
    assert fp32["weights"] == 2 * bf16["weights"] > 0
    with pytest.raises(BackendError, match="unknown dtype 'int4'"):
        bytes_per_token(recipe, "int4")


def test_cli_help_lists_the_table() -> None:
    out = CliRunner().invoke(app, ["build", "--help"], env={"COLUMNS": "200"}).output
    assert "fp32 | bf16 | fp16" in out
