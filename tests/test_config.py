"""config.py: a recipe's shapes fit the request, and shapes chosen at build follow the
same rule as a recipe file's [shapes] (``shape_problem``)."""

from __future__ import annotations

import dataclasses

import pytest

from artifactcache.errors import ShapeError
from artifactcache.recipes import load_recipe


def test_check_fits():
    r = load_recipe("tiny-llama")
    r.check_fits(r.shapes.prefill_len, r.shapes.max_seq_len - r.shapes.prefill_len)
    r.check_fits(r.shapes.prefill_len + 1, 1)  # longer prompts run in chunks
    with pytest.raises(ShapeError, match="max_seq_len"):
        r.check_fits(2, r.shapes.max_seq_len)
    with pytest.raises(ShapeError, match="empty"):
        r.check_fits(0, 1)


def test_a_request_too_long_says_what_build_holds_it_or_that_none_does():
    r = load_recipe("tiny-llama")  # max_seq_len 64, max_position_embeddings 256
    with pytest.raises(ShapeError, match=r"= 100 exceeds max_seq_len 64; build with "
                       r"--max-seq-len 100 or more \(up to 256;"):  # fmt: skip
        r.check_fits(90, 10)
    # Past the model's positions no build holds it: the error does not suggest one.
    with pytest.raises(ShapeError) as e:
        r.check_fits(290, 10)
    assert "the model takes at most 256 positions (model.max_position_embeddings)" in str(e.value)
    assert "--max-seq-len" not in str(e.value)
    longrope = dataclasses.replace(r.model, rope_scaling={
        "type": "longrope", "original_max_position_embeddings": 128,
        "short_factor": [1.0] * 8, "long_factor": [1.0] * 8})  # fmt: skip
    ceiling = dataclasses.replace(r, model=longrope).longest_context()
    assert ceiling == (128, "model.rope_scaling.original_max_position_embeddings")
    wide = dataclasses.replace(longrope, rope_scaling={**longrope.rope_scaling,
                               "original_max_position_embeddings": 4096})  # fmt: skip
    assert dataclasses.replace(r, model=wide).longest_context()[0] == 256  # the lower one
    # Exactly the model's positions still fits a build: the suggestion, not the refusal.
    with pytest.raises(ShapeError, match="build with --max-seq-len 256 or more"):
        r.check_fits(250, 6)


@pytest.mark.parametrize(
    ("n", "needle"),
    [
        (0, "max_seq_len must be positive, got 0"),
        (-3, "max_seq_len must be positive"),
        (257, "max_seq_len (257) exceeds model.max_position_embeddings (256)"),
    ],
)
def test_a_context_the_recipe_file_could_not_ask_for_is_refused(n, needle):
    with pytest.raises(ShapeError) as e:
        load_recipe("tiny-llama").with_shapes(max_seq_len=n)
    assert needle in str(e.value) and "tiny-llama" in str(e.value)


def test_longrope_cannot_be_stretched_past_its_original_length_by_the_option():
    rec = load_recipe("tiny-phi-3")  # max_position_embeddings 256
    rope = {"type": "longrope", "original_max_position_embeddings": 64}
    rec = dataclasses.replace(rec, model=dataclasses.replace(rec.model, rope_scaling=rope))
    assert rec.with_shapes(max_seq_len=64).shapes.max_seq_len == 64
    with pytest.raises(ShapeError, match="longrope's long factors are not supported"):
        rec.with_shapes(max_seq_len=65)


@pytest.mark.parametrize(
    ("rows", "message"),
    [(0, "max_batch must be positive, got 0"), (True, "max_batch must be an integer")],
)
def test_bad_max_batch_is_a_one_line_shape_error(rows, message):
    with pytest.raises(ShapeError, match=message) as e:
        load_recipe("tiny-llama").with_shapes(max_batch=rows)
    assert "\n" not in str(e.value)
