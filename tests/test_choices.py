"""BuildChoices: one value carried from the CLI through the API into the probe."""

from __future__ import annotations

import dataclasses
import pickle

import pytest

from artifactcache.choices import NAMES, BuildChoices
from artifactcache.errors import AcacheError


def test_json_round_trip_keeps_every_field_and_its_type():
    c = BuildChoices(device="cuda:1", dtype="bf16", mode="max-autotune", extra={"opset": 18,
                     "fast": True}, weights="/w", seed=7, max_seq_len=256, quant="int8wo",
                     max_batch=4, inputs=("1x8:int64:100",))  # fmt: skip
    back = BuildChoices.from_json(c.to_json())
    assert back == c and back.extra["opset"] == 18 and back.extra["fast"] is True
    assert pickle.loads(pickle.dumps(c)) == c  # aoti's build workers receive it pickled


def test_values_are_normalized_so_equal_choices_are_equal(tmp_path):
    assert BuildChoices(weights=tmp_path, inputs=["1x2"]) == BuildChoices(
        weights=str(tmp_path), inputs=("1x2",)
    )


def test_every_field_declares_its_flag_help_and_scope():
    for f in dataclasses.fields(BuildChoices):
        assert f.metadata["flag"].startswith("--") and f.metadata["help"], f.name
        assert f.metadata["scope"] in ("any", "recipe", "module"), f.name
        if f.metadata["scope"] != "any":
            assert f.metadata["refusal"], f.name  # what the user is told, in one line


@pytest.mark.parametrize(
    "given, kind, message",
    [
        ({"max_seq_len": 64}, "module", "--max-seq-len is for a recipe"),
        ({"quant": "int8wo"}, "module", "--quant is for a recipe"),
        ({"max_batch": 2}, "module", "--max-batch is for a recipe"),
        ({"weights": "/w"}, "module", "--weights is for a recipe"),
        ({"inputs": ("1x2",)}, "recipe", "--input is for a model spec"),
    ],
)
def test_a_choice_outside_its_scope_is_one_line(given, kind, message):
    with pytest.raises(AcacheError, match=message):
        BuildChoices(**given).check_scope(kind)
    BuildChoices(**given).check_scope("module" if kind == "recipe" else "recipe")


def test_unknown_choices_and_bad_json_are_one_line():
    with pytest.raises(AcacheError, match="unknown build choice"):
        BuildChoices.of(max_len=3)
    with pytest.raises(AcacheError, match="JSON object"):
        BuildChoices.from_json("[1]")


def test_given_names_only_what_differs_from_the_defaults():
    assert BuildChoices().given() == {}
    assert BuildChoices(seed=3, extra={"a": 1}).given() == {"seed": 3, "extra": {"a": 1}}
    assert set(NAMES) == {f.name for f in dataclasses.fields(BuildChoices)}


def test_a_new_choice_reaches_the_key_through_the_cli_and_the_probe(tmp_path):
    """--tag, the latest choice: declared once in choices.py, read once in api/recipe.py."""
    from typer.testing import CliRunner

    from artifactcache.api import key_for, make_context
    from artifactcache.cli.app import app
    from artifactcache.measure.child import probe
    from artifactcache.measure.coldstart import ProbeSpec

    def key(**given):
        return key_for(*make_context("tiny-llama", "eager", check_memory=False, **given)).key

    assert key(tag="patched-triton") != key() == key(tag=None)
    res = CliRunner().invoke(app, ["key", "tiny-llama", "-b", "eager", "--tag", "patched-triton"])
    assert res.exit_code == 0 and res.stdout.strip() == key(tag="patched-triton")
    argv = ProbeSpec("tiny-llama", "eager", BuildChoices(tag="t")).argv(None)
    assert probe._parse(argv[argv.index("--recipe") :]).choices.tag == "t"
