"""generate/request.py: one request's prompt ids, new tokens, EOS ids and sampling,
resolved with the same one-line errors `acache run` shows (tests/test_cli_build.py
runs them through the CLI)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from artifactcache.errors import AcacheError, ArgumentError, GenerationError
from artifactcache.generate import Sampling
from artifactcache.generate.request import (
    default_max_new_tokens,
    parse_token_ids,
    prompt_ids_for,
    prompts_for,
    resolve_request,
    rows_for,
)
from artifactcache.recipes import load_recipe

RECIPE = load_recipe("tiny-llama")  # max_seq_len 64, bench.max_new_tokens 200, 6 prompt ids


def _ckpt(eos=(2,), tokenizer=None, folder="/ckpt"):
    return SimpleNamespace(eos_token_ids=tuple(eos), tokenizer=tokenizer, folder=folder)


def test_parse_token_ids():
    assert parse_token_ids(" 1, 2 3 ") == [1, 2, 3]
    assert parse_token_ids("-5") == [-5]  # refused later, with the vocabulary's range
    with pytest.raises(AcacheError):
        parse_token_ids(" , ")


@pytest.mark.parametrize("text", ["1,,2", "1, ,2", "\uff11,2", "--5", "1.5", "+3", "0x10"])
def test_parse_token_ids_refuses_what_is_no_list_of_ids(text):
    with pytest.raises(AcacheError, match="--tokens must be integers") as e:
        parse_token_ids(text)
    assert "\n" not in str(e.value)


def test_the_recipes_own_prompt_needs_no_tokenizer():
    recorded = list(RECIPE.bench.prompt_ids)
    assert prompt_ids_for(RECIPE, None, None, None, None) == recorded
    assert prompt_ids_for(RECIPE, None, RECIPE.bench.prompt, None, None) == recorded
    with pytest.raises(ArgumentError, match="not both"):
        prompt_ids_for(RECIPE, None, "hi", "1", None)
    with pytest.raises(ArgumentError, match="no checkpoint folder"):
        prompt_ids_for(RECIPE, None, "other text", None, None)
    with pytest.raises(ArgumentError, match="no tokenizer.json in /ckpt"):
        prompt_ids_for(RECIPE, None, "other text", None, "/ckpt")


def test_a_default_request_is_the_recipes_prompt_cut_to_fit():
    req = resolve_request(RECIPE)
    assert req.prompt_ids == list(RECIPE.bench.prompt_ids)
    assert req.max_new_tokens == 64 - 6 == default_max_new_tokens(RECIPE, 6)
    assert req.eos_token_ids is None and req.sampling == Sampling()
    assert default_max_new_tokens(RECIPE, 64) == 1  # never below 1: check_generation refuses
    assert req.generate_kwargs() == {
        "eos_token_ids": None, "temperature": 0.0, "top_k": None, "top_p": None, "seed": None,
    }  # fmt: skip


def test_eos_and_sampling_choices():
    req = resolve_request(RECIPE, _ckpt(), tokens="1,2", max_new_tokens=3, eos_ids=[7, 7],
                          temperature=0.5, top_k=4, top_p=0.9, seed=3)  # fmt: skip
    assert (req.prompt_ids, req.max_new_tokens, req.eos_token_ids) == ([1, 2], 3, (7, 7))
    assert req.sampling == Sampling(0.5, 4, 0.9, 3)
    assert resolve_request(RECIPE, _ckpt(), no_eos=True).eos_token_ids == ()
    with pytest.raises(ArgumentError, match="either --eos-id or --no-eos"):
        resolve_request(RECIPE, eos_ids=[2], no_eos=True)
    with pytest.raises(GenerationError, match=r"top_p \(--top-p\) must be in"):
        resolve_request(RECIPE, top_p=1.5)
    with pytest.raises(GenerationError, match="EOS token id 32000 is outside"):
        resolve_request(RECIPE, eos_ids=[32000])
    # The checkpoint's own EOS ids are checked too when no --eos-id replaces them.
    with pytest.raises(GenerationError, match="EOS token id 99999"):
        resolve_request(RECIPE, _ckpt(eos=(99999,)))
    assert resolve_request(RECIPE, _ckpt(eos=(99999,)), eos_ids=[2]).eos_token_ids == (2,)


def test_several_prompts_are_one_batch_and_the_longest_sets_the_default_length():
    req = resolve_request(RECIPE, tokens=["1,2", "3,4,5,6,7,8,9,10"])
    assert req.prompts == [[1, 2], [3, 4, 5, 6, 7, 8, 9, 10]] and req.prompt_ids == [1, 2]
    assert req.max_new_tokens == 64 - 8  # the batch is left-padded to its longest prompt
    assert prompts_for(RECIPE, None, None, None, None) == [list(RECIPE.bench.prompt_ids)]
    assert prompts_for(RECIPE, None, [RECIPE.bench.prompt], None, None) == [
        list(RECIPE.bench.prompt_ids)
    ]
    with pytest.raises(ArgumentError, match="not both"):
        prompts_for(RECIPE, None, ["a"], ["1"], None)


def test_the_rows_hold_every_prompt():
    assert rows_for(RECIPE, 1, None) == RECIPE.shapes.max_batch == 1
    assert rows_for(RECIPE, 3, None) == 3  # not given: grown to the prompts
    assert rows_for(RECIPE.with_shapes(max_batch=4), 2, None) == 4  # the recipe's suffice
    assert rows_for(RECIPE, 2, 8) == 8
    with pytest.raises(ArgumentError, match="3 prompts do not fit --max-batch 2") as e:
        rows_for(RECIPE, 3, 2)
    assert "\n" not in str(e.value)
