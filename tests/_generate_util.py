"""Helpers shared by the generate tests (not a test module): tiny recipes and folders."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from _backend_util import rel_err

# tiny-llama's architecture with a context long enough for a 300-token prompt.
LONG_RECIPE = """\
name = "{name}"
family = "llama"

[model]
vocab_size = {vocab}
dim = 64
n_layers = 2
n_heads = 4
n_kv_heads = 2
intermediate_size = 172
max_position_embeddings = {max_positions}

[shapes]
max_seq_len = {max_seq_len}
prefill_len = {prefill_len}

[bench]
prompt_ids = {bench_ids}
max_new_tokens = 8
"""

WORDS = (
    "hello my name is bob and the cat sat on a mat while we talk about tokens that "
    "stream out one word at a time"
)


def write_recipe(
    tmp: Path, *, name: str = "long", vocab: int = 32000, max_seq_len: int = 320,
    prefill_len: int = 16, bench_ids: str = "[1, 15043, 29892, 590, 1024, 338]",
    max_positions: int = 512,
) -> Path:  # fmt: skip
    path = tmp / f"{name}.toml"
    path.write_text(
        LONG_RECIPE.format(
            name=name,
            vocab=vocab,
            max_seq_len=max_seq_len,
            prefill_len=prefill_len,
            bench_ids=bench_ids,
            max_positions=max_positions,
        )  # fmt: skip
    )
    return path


def masked_forward(model: Any, ids: list[int]) -> torch.Tensor:
    """Logits [1, T, vocab] of one forward over ``ids`` through the masked whole-cache
    read (row_start given): not the causal first-pass path (models/common.py) that the
    runner takes, so it checks that path rather than repeating it."""
    return model(torch.tensor([ids]), torch.arange(len(ids)), torch.zeros(1, dtype=torch.long))


def full_forward(recipe: Any, ids: list[int]) -> torch.Tensor:
    """Eager logits [T, vocab] in one forward over the whole sequence (no chunks)."""
    from artifactcache.models import build_model

    model = build_model(recipe)
    with torch.no_grad():
        return masked_forward(model, ids)[0].float()


def naive_greedy(recipe: Any, ids: list[int], n: int) -> list[int]:
    """Greedy tokens by one full forward per token: no cache, no chunks."""
    from artifactcache.models import build_model

    model = build_model(recipe)
    seq = list(ids)
    with torch.no_grad():
        for _ in range(n):
            out = masked_forward(model, seq)[0, -1]
            seq.append(int(out.argmax()))
    return seq[len(ids) :]


def make_tokenizer(path: Path) -> Any:
    """A WordLevel tokenizer trained on WORDS with <s>/</s>, saved as tokenizer.json."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.WordLevelTrainer(special_tokens=["[UNK]", "<s>", "</s>"])
    tok.train_from_iterator([WORDS], trainer)
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", tok.token_to_id("<s>"))]
    )
    tok.save(str(path / "tokenizer.json"))
    return tok


def make_checkpoint(tmp: Path, *, tokenizer: bool = True, eos: Any = None) -> tuple[Path, Path]:
    """(recipe TOML, checkpoint folder): random weights saved as safetensors, with a
    tokenizer.json whose vocabulary is the model's, and generation_config.json's EOS."""
    from safetensors.torch import save_file

    from artifactcache.models import build_model
    from artifactcache.recipes import load_recipe

    folder = tmp / "ckpt"
    folder.mkdir()
    vocab = make_tokenizer(folder).get_vocab_size()
    if not tokenizer:
        (folder / "tokenizer.json").unlink()
    recipe_path = write_recipe(
        tmp, name="tok", vocab=vocab, max_seq_len=64, prefill_len=8, bench_ids="[]"
    )
    model = build_model(load_recipe(recipe_path), weights=None)
    save_file(dict(model.state_dict()), str(folder / "model.safetensors"))
    if eos is not None:
        (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": eos}))
    return recipe_path, folder


def write_config(folder: Path, vocab: int, eos: Any) -> None:
    """A Llama config.json with the recipe's architecture, so the folder is a recipe."""
    config = {
        "model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": vocab,
        "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "intermediate_size": 172, "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0, "max_position_embeddings": 512, "tie_word_embeddings": False,
        "hidden_act": "silu", "eos_token_id": eos,
    }  # fmt: skip
    (folder / "config.json").write_text(json.dumps(config))


def assert_prompt_gives_the_full_forward(
    runner: Any, recipe: Any, prompt: list[int], new_tokens: int
) -> None:
    """``runner``'s logits of ``prompt``, over however many passes it takes, within 1e-4 of
    one full forward; then its greedy tokens are the naive loop's."""
    want = full_forward(recipe, prompt)
    got = runner.logits(prompt)
    assert got.shape == want.shape == (len(prompt), recipe.model.vocab_size)
    assert rel_err(got, want) <= 1e-4
    assert runner.generate(prompt, new_tokens) == naive_greedy(recipe, prompt, new_tokens)


# generate()'s sampling/EOS checks: 40 new tokens cross the EOS check interval (16) twice.
SAMPLING_NEW_TOKENS = 40


def _first_new(tokens: list[int], at_least: int) -> int:
    """The first index >= at_least whose token appears nowhere before it."""
    return next(i for i in range(at_least, len(tokens)) if tokens[i] not in tokens[:i])


def assert_sampling_and_eos(runner: Any, prompt: list[int]) -> None:
    """Greedy is temperature 0 / top_k 1 / a tiny top_p; a seed fixes a sample and another
    changes it; stream() yields generate()'s tokens; an EOS id before and after an EOS
    check cuts the output right after it (greedy and sampled); no EOS ids: no cut."""
    n = SAMPLING_NEW_TOKENS
    greedy = runner.generate(prompt, n)
    assert len(greedy) == n
    assert runner.generate(prompt, n, temperature=0.0, seed=3) == greedy
    assert runner.generate(prompt, n, temperature=1.0, top_k=1, seed=3) == greedy
    assert runner.generate(prompt, n, temperature=1.0, top_p=1e-6, seed=3) == greedy

    a = runner.generate(prompt, n, temperature=1.0, seed=1)
    assert len(a) == n and all(0 <= t < runner.recipe.model.vocab_size for t in a)
    assert runner.generate(prompt, n, temperature=1.0, seed=1) == a
    assert runner.generate(prompt, n, temperature=1.0, seed=2) != a
    assert list(runner.stream(prompt, n, temperature=1.0, seed=1)) == a
    filtered = runner.generate(prompt, n, temperature=0.8, top_k=50, top_p=0.9, seed=1)
    assert len(filtered) == n

    for k in (_first_new(greedy, 3), _first_new(greedy, 17)):  # before and after a check
        eos = [greedy[k]]
        assert runner.generate(prompt, n, eos_token_ids=eos) == greedy[: k + 1]
        assert list(runner.stream(prompt, n, eos_token_ids=eos)) == greedy[: k + 1]
    assert runner.generate(prompt, n, eos_token_ids=()) == greedy
    sampled_eos = [a[_first_new(a, 5)]]
    assert (
        runner.generate(prompt, n, temperature=1.0, seed=1, eos_token_ids=sampled_eos)
        == (a[: _first_new(a, 5) + 1])
    )


def byte_level_tokenizer():
    """A byte-level BPE that knows no merge for 'é', so 'é' is two ids (0xC3, 0xA9)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    trainer = trainers.BpeTrainer(
        vocab_size=len(alphabet) + 8, initial_alphabet=alphabet, show_progress=False
    )
    tok.train_from_iterator(["Hello world", "Hello there"], trainer)
    return tok
