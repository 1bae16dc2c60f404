"""Recipes: every built-in one loads; malformed ones are one-line errors naming file + field."""

from __future__ import annotations

from pathlib import Path

import pytest

from artifactcache.config import FAMILIES, Shapes, default_prefill_len
from artifactcache.errors import RecipeError
from artifactcache.recipes import (
    BUILTIN_DIR,
    builtin_names,
    list_recipes,
    load_recipe,
    recipe_to_toml,
)

SEED_MODELS = {"llama-7b", "llama-3-8b", "mistral-7b", "phi-2", "phi-3-mini"}
TINY = {"tiny-llama", "tiny-mistral", "tiny-phi-2", "tiny-phi-3"}

GOOD = """
name = "mine"
family = "llama"

[model]
vocab_size = 1000
dim = 64
n_layers = 2
n_heads = 4
n_kv_heads = 2
intermediate_size = 128

[shapes]
max_seq_len = 64
prefill_len = 8

[bench]
prompt_ids = [1, 2, 3]
"""


def test_builtins_cover_the_seed_models_and_tiny_variants():
    assert SEED_MODELS | TINY <= set(builtin_names())
    recs = list_recipes()
    assert {r.family for r in recs} == set(FAMILIES)
    for r in recs:
        assert r.bench.prompt == "Hello, my name is"
        assert r.bench.prompt_ids, r.name
        assert r.bench.max_new_tokens == 200 and r.bench.batch_size == 1
        assert r.model.dim % r.model.n_heads == 0


def test_an_unwritten_prefill_len_fits_a_short_context(tmp_path: Path):
    p = tmp_path / "short.toml"
    p.write_text(GOOD.replace("max_seq_len = 64\nprefill_len = 8", "max_seq_len = 12"))
    assert load_recipe(p).shapes.prefill_len == 11  # a longer pass would leave no decode
    p.write_text(GOOD.replace("prefill_len = 8\n", ""))
    assert load_recipe(p).shapes.prefill_len == 63  # max_seq_len 64
    p.write_text(GOOD.replace("max_seq_len = 64\nprefill_len = 8", "max_seq_len = 4096"))
    assert load_recipe(p).shapes.prefill_len == 4095  # the context, less decode's slot


def test_the_default_prefill_len_follows_the_shapes_a_build_asks_for():
    r = load_recipe("llama-7b")  # unwritten prefill_len: the default for 256 positions
    assert r.shapes.prefill_len == 255
    assert r.with_shapes(max_seq_len=4096).shapes.prefill_len == 4095
    assert r.with_shapes(max_seq_len=4096, max_batch=32).shapes.prefill_len == 128
    assert r.with_shapes(max_seq_len=4096, max_batch=3000).shapes.prefill_len == 16
    tiny = load_recipe("tiny-llama")  # a written prefill_len (8) is kept
    assert tiny.with_shapes(max_seq_len=128, max_batch=4).shapes.prefill_len == 8
    assert Shapes().prefill_len == default_prefill_len(Shapes().max_seq_len, 1)


def test_mistral_keeps_its_sliding_window():
    assert load_recipe("mistral-7b").model.sliding_window == 4096
    assert load_recipe("tiny-mistral").model.sliding_window is not None


def test_user_file_by_path(tmp_path: Path):
    p = tmp_path / "mine.toml"
    p.write_text(GOOD)
    r = load_recipe(p)
    assert r.name == "mine" and r.model.n_kv_heads == 2 and r.source == str(p)


def _bad(tmp_path: Path, text: str) -> str:
    p = tmp_path / "bad.toml"
    p.write_text(text)
    with pytest.raises(RecipeError) as ei:
        load_recipe(p)
    msg = str(ei.value)
    assert "\n" not in msg and str(p) in msg
    return msg


@pytest.mark.parametrize(
    ("old", "new", "field"),
    [
        ("n_layers = 2\n", "", "model.n_layers"),  # missing
        ("dim = 64", 'dim = "64"', "model.dim"),  # wrong type
        ("n_layers = 2", "n_layers = 2.5", "model.n_layers"),  # float for int
        ("vocab_size = 1000", "vocab_size = -5", "model.vocab_size"),  # negative
        ("max_seq_len = 64", "max_seq_len = 0", "shapes.max_seq_len"),
        ("n_heads = 4", "n_heads = 5", "model.n_heads"),  # 5 does not divide 64
        ("n_kv_heads = 2", "n_kv_heads = 3", "model.n_kv_heads"),  # 3 does not divide 4
        ('family = "llama"', 'family = "gpt"', "family"),
        ("prefill_len = 8", "prefill_len = 128", "shapes.prefill_len"),
        ("prefill_len = 8", "prefill_len = 64", "shapes.prefill_len"),  # no room to decode
        (
            "max_seq_len = 64\nprefill_len = 8",
            "max_seq_len = 1\nprefill_len = 1",
            "shapes.max_seq_len",
        ),
        ("prompt_ids = [1, 2, 3]", "prompt_ids = [1, 2000]", "bench.prompt_ids[1]"),
        ("[shapes]", "bogus = 1\n[shapes]", "model.bogus"),
        (
            "[shapes]",
            'rope_scaling = { type = "yarn", factor = 2.0 }\n[shapes]',
            "model.rope_scaling.type",
        ),
        ("[shapes]", 'rope_scaling = { type = "linear" }\n[shapes]', "model.rope_scaling.factor"),
        (
            "[shapes]",
            'rope_scaling = { type = "linear", factor = 2.0, low_freq_factor = 1.0 }\n[shapes]',
            "model.rope_scaling.low_freq_factor",
        ),
        (
            "[shapes]",
            'rope_scaling = { type = "longrope", short_factor = [1.0], '
            "long_factor = [1.0] }\n[shapes]",
            "model.rope_scaling.short_factor",
        ),
        ("[shapes]", "head_dim = 0\n[shapes]", "model.head_dim"),
        ("[shapes]", 'attention_bias = "yes"\n[shapes]', "model.attention_bias"),
        ('family = "llama"', 'family = "llama"\nweights = "nowhere"', "weights"),
    ],
)
def test_malformed_recipe_names_file_and_field(tmp_path: Path, old: str, new: str, field: str):
    assert old in GOOD
    msg = _bad(tmp_path, GOOD.replace(old, new, 1))
    assert f"'{field}'" in msg, msg


def test_every_builtin_round_trips_through_its_toml(tmp_path: Path):
    """What `acache recipe` prints loads back into the same recipe (so the same key)."""
    for r in list_recipes():
        p = tmp_path / f"{r.name}.toml"
        p.write_text(recipe_to_toml(r))
        back = load_recipe(p)
        assert back == r and back.normalized() == r.normalized()


def test_explicit_head_dim_biases_and_phi2_defaults(tmp_path: Path):
    p = tmp_path / "wide.toml"
    p.write_text(GOOD.replace("n_heads = 4", "n_heads = 6\nhead_dim = 32\nattention_bias = true"))
    m = load_recipe(p).model
    assert (m.head_dim, m.attention_bias, m.mlp_bias) == (32, True, False)
    assert load_recipe("tiny-llama").model.head_dim == 16
    phi2 = load_recipe("phi-2").model
    assert phi2.attention_bias and phi2.mlp_bias  # phi-2 is biased throughout


def test_weights_in_a_recipe_are_relative_to_its_file(tmp_path: Path):
    (tmp_path / "ckpt").mkdir()
    p = tmp_path / "mine.toml"
    p.write_text(GOOD.replace('family = "llama"', 'family = "llama"\nweights = "ckpt"'))
    assert load_recipe(p).weights == tmp_path / "ckpt"


@pytest.mark.parametrize(
    ("old", "new", "needle"),
    [
        ("dim = 64", "dim = 1" + "0" * 30, "'model.dim' must be at most"),
        ("prefill_len = 8", "prefill_len = 8\nmax_batch = " + "9" * 20, "'shapes.max_batch'"),
        ("n_kv_heads = 2", "n_kv_heads = 2\nnorm_eps = nan", "'model.norm_eps' must be a finite"),
        ("n_kv_heads = 2", "n_kv_heads = 2\nrope_theta = inf", "'model.rope_theta' must be a fin"),
        ("n_kv_heads = 2", "n_kv_heads = 2\npartial_rotary_factor = nan", "partial_rotary_factor"),
        # an integer past the largest float, where a float is meant
        (
            "n_kv_heads = 2",
            "n_kv_heads = 2\nnorm_eps = 1" + "0" * 400,
            "'model.norm_eps' must be a finite number, got an integer of 401 digits",
        ),
    ],
)
def test_numbers_past_any_model_and_nan_inf_are_refused(tmp_path: Path, old, new, needle):
    assert old in GOOD
    assert needle in _bad(tmp_path, GOOD.replace(old, new, 1))


def test_not_toml_and_unknown_name(tmp_path: Path):
    assert "not valid TOML" in _bad(tmp_path, "name = \n")
    with pytest.raises(RecipeError, match="unknown recipe 'nope'"):
        load_recipe("nope")


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("./tiny-llama", "./tiny-llama not found"),  # a path, never the built-in recipe
        ("missing.toml", "missing.toml not found"),
        ("some/dir/model", "some/dir/model not found"),
        ("meta-llama/Llama-2-7b-hf", "hub ids are not supported yet: download it"),
        ("nope", "unknown recipe 'nope'"),  # a name: the built-in list
    ],
)
def test_a_missing_path_says_what_it_is(text: str, said: str):
    with pytest.raises(RecipeError) as e:
        load_recipe(text)
    assert said in str(e.value) and "\n" not in str(e.value)


def test_a_weights_file_is_not_a_recipe(tmp_path: Path):
    f = tmp_path / "model.safetensors"
    f.write_bytes(b"\0" * 8)
    with pytest.raises(RecipeError, match="is a .safetensors file, not a recipe: pass the"):
        load_recipe(f)


def test_an_explicit_folder_wins_over_a_built_in_name(tmp_path: Path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tiny-llama").mkdir()  # a folder, but no checkpoint in it
    with pytest.raises(RecipeError, match="config.json"):
        load_recipe("./tiny-llama")


def test_a_request_past_the_context_says_which_file_to_change(tmp_path: Path):
    """A built-in recipe is the installed package's file: the advice is a saved copy of
    it; a user's own TOML is named as it is."""
    from artifactcache.errors import ShapeError

    builtin = load_recipe("tiny-llama")
    assert builtin.builtin
    # 201 positions: past the recipe's 64, within the model's 256, so a build holds it.
    with pytest.raises(ShapeError, match="in a copy saved from `acache recipe tiny-llama`"):
        builtin.check_fits(1, 200)
    own = tmp_path / "mine.toml"
    own.write_text((BUILTIN_DIR / "tiny-llama.toml").read_text())
    mine = load_recipe(own)
    assert not mine.builtin and mine == builtin  # the flag is not part of the recipe
    with pytest.raises(ShapeError, match=f"raise \\[shapes\\].max_seq_len in {own}$"):
        mine.check_fits(1, 200)
