"""The qwen families' built-in tiny recipes, their refusals, and every backend on
transformers-saved checkpoints of every family.

The per-variant parity with transformers (eager, 48 tokens) is tests/test_sources_hf.py;
here each compiling backend (inductor, aoti, ort) is held to eager on one checkpoint
per family (aoti on four of the six: AOTI_FAMILIES says why): fp32, max relative error
<= 1e-4 on ``runner.logits`` of a 16-token prompt (a whole pass), of a 5-token one
(padded in its pass) and of one a token longer than a pass (a first pass, then an
extend pass over its cache), and the same greedy tokens after the first two (8 through
the causal first pass, 24 through the masked prefill step). This is the only
per-family parity of the compiling backends: test_backends_{inductor,aoti}
hold tiny-llama's built-in recipe to eager.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from _backend_util import private_dir, rel_err, runner_cache
from typer.testing import CliRunner

from artifactcache import api
from artifactcache.cli.app import app
from artifactcache.config import parse_recipe
from artifactcache.errors import RecipeError, WeightsError
from artifactcache.recipes import load_recipe

transformers = pytest.importorskip("transformers")
T = transformers

from _hf_checkpoints import CASES, save_hf  # noqa: E402  (needs transformers)

SEQ = 48


def _hf_config_of(recipe_name: str, **over: Any) -> Any:
    """transformers' config of a tiny qwen recipe, field by field."""
    r = load_recipe(recipe_name)
    m = r.model
    kw: dict[str, Any] = dict(
        vocab_size=m.vocab_size, hidden_size=m.dim, num_hidden_layers=m.n_layers,
        num_attention_heads=m.n_heads, num_key_value_heads=m.n_kv_heads,
        intermediate_size=m.intermediate_size, rms_norm_eps=m.norm_eps,
        rope_theta=m.rope_theta, max_position_embeddings=m.max_position_embeddings,
        tie_word_embeddings=m.tie_embeddings,
    )  # fmt: skip
    if r.family == "qwen3":
        return T.Qwen3Config(**{**kw, "head_dim": m.head_dim, **over}), T.Qwen3ForCausalLM
    return T.Qwen2Config(**{**kw, **over}), T.Qwen2ForCausalLM


@pytest.mark.parametrize("name", ["tiny-qwen2", "tiny-qwen3"])
def test_tiny_recipe_is_the_transformers_architecture(name: str, tmp_path: Path, cache_dir):
    """A transformers checkpoint of the recipe's config loads into the built-in recipe
    (--weights: every config field agrees) and gives transformers' logits."""
    cfg, cls = _hf_config_of(name)
    torch.manual_seed(1)
    hf = cls(cfg).eval()
    with torch.no_grad():
        for pname, p in hf.named_parameters():
            if p.ndim == 1:
                p.normal_(1.0 if "norm" in pname else 0.0, 0.1)
    hf.save_pretrained(tmp_path / "ckpt")
    runner = api.load(name, "eager", weights=tmp_path / "ckpt", cache_dir=cache_dir)
    ids = [(97 * i + 5) % cfg.vocab_size for i in range(SEQ)]
    with torch.no_grad():
        want = hf(torch.tensor([ids])).logits[0]
        got = runner.logits(ids)  # every position
        last = runner.keepalive(torch.tensor([ids]), torch.arange(SEQ))[0]  # as served
    assert rel_err(got, want) <= 1e-4
    assert last.shape[0] == 1 and rel_err(last[-1], want[-1]) <= 1e-4


@pytest.mark.parametrize("name", ["tiny-qwen2", "tiny-qwen3"])
def test_tiny_recipe_runs_on_random_weights(name: str, cache_dir):
    r = load_recipe(name)
    runner = api.load(name, "eager", cache_dir=cache_dir)
    out = runner.generate(list(r.bench.prompt_ids), 8)
    assert len(out) == 8 and all(0 <= t < r.model.vocab_size for t in out)


def test_tiny_recipes_carry_the_family_flags():
    q2, q3 = load_recipe("tiny-qwen2").model, load_recipe("tiny-qwen3").model
    assert (q2.qkv_bias, q2.attention_bias, q2.qk_norm, q2.tie_embeddings) == (
        True, False, False, True)  # fmt: skip
    assert (q3.qk_norm, q3.qkv_bias, q3.head_dim, q3.dim // q3.n_heads) == (True, False, 32, 16)


def test_a_qwen_checkpoint_under_another_recipe_is_refused(tmp_path: Path):
    """tiny-qwen3 + --weights of a qwen3 folder with other dims: refused, never adopted."""
    cfg, cls = _hf_config_of("tiny-qwen3", head_dim=16)
    cls(cfg).save_pretrained(tmp_path / "other")
    with pytest.raises(WeightsError, match="has head_dim=16 but recipe tiny-qwen3 has "):
        api.make_context("tiny-qwen3", "eager", weights=tmp_path / "other")


_PHI2 = {
    "name": "mine",
    "family": "phi-2",
    "model": dict(vocab_size=100, dim=32, n_layers=1, n_heads=2, n_kv_heads=2,
                  intermediate_size=64),
}  # fmt: skip


@pytest.mark.parametrize("flag", ["qk_norm", "qkv_bias"])
def test_phi2_refuses_the_qwen_flags(flag: str, tmp_path: Path):
    with pytest.raises(RecipeError, match=f"field 'model.{flag}' is true, which acache's phi-2"):
        parse_recipe({**_PHI2, "model": {**_PHI2["model"], flag: True}}, "mine.toml")
    toml = tmp_path / "mine.toml"
    toml.write_text(
        'name = "mine"\nfamily = "phi-2"\n[model]\nvocab_size = 100\ndim = 32\nn_layers = 1\n'
        f"n_heads = 2\nn_kv_heads = 2\nintermediate_size = 64\n{flag} = true\n"
    )
    r = CliRunner().invoke(app, ["key", str(toml), "-b", "eager"])
    assert r.exit_code == 1 and r.stderr.strip().splitlines() == [
        f"error: {toml}: field 'model.{flag}' is true, which acache's phi-2 does not implement"
    ]


def test_qk_norm_and_qkv_bias_are_recipe_fields():
    """A llama-family recipe may switch either on; qwen's defaults may be switched off."""
    llama = parse_recipe({**_PHI2, "family": "llama", "model": {**_PHI2["model"],
                          "qk_norm": True, "qkv_bias": True}}, "x.toml")  # fmt: skip
    assert llama.model.qk_norm and llama.model.qkv_bias
    plain = parse_recipe({**_PHI2, "family": "qwen3", "model": {**_PHI2["model"],
                          "qk_norm": False}}, "x.toml")  # fmt: skip
    assert not plain.model.qk_norm


# ------------------------------------------------ backends against eager (slow) --

# One checkpoint per family, the one with the most features of its family.
PER_FAMILY = ["llama-3.2-tied", "mistral", "phi-2", "phi-3-longrope", "qwen2", "qwen3"]
PROMPT_LEN, NEW_TOKENS = 16, 8
# A prompt that does not fill its pass (padded to generate/prefill.py's CHUNK_ALIGN), and
# a longer generation after it: past mistral's 12-token window in decode.
SHORT_LEN, SHORT_NEW_TOKENS = 5, 24


@pytest.fixture(scope="module")
def family_checkpoints(tmp_path_factory) -> dict[str, Path]:
    out = {}
    for name in PER_FAMILY:
        cfg, cls, kw = CASES[name]
        out[name] = tmp_path_factory.mktemp(name)
        save_hf(cfg, cls, kw, out[name])
    return out


@pytest.fixture(scope="module")
def runners(tmp_path_factory):
    return runner_cache(private_dir(tmp_path_factory, "families-cache"))


# aoti differs from inductor in its C++ wrapper and its package (constants, the tied
# embedding, rope tables, the window's masks), not in how a block's ops lower; so aoti
# takes the families whose checkpoints give it something of its own to hold, and qwen2's
# q/k/v biases (phi-2 has biases) and qwen3's q/k norms (weights like any other) are
# inductor's and ort's: each aoti case costs CI ~45 s of compiling.
AOTI_FAMILIES = ["llama-3.2-tied", "mistral", "phi-2", "phi-3-longrope"]
assert set(AOTI_FAMILIES) <= set(PER_FAMILY), AOTI_FAMILIES
FAMILY_BACKENDS = [
    pytest.param(name, backend, id=f"{name}-{backend}")
    for name in PER_FAMILY
    for backend in ("inductor", "aoti", "ort")
    if backend != "aoti" or name in AOTI_FAMILIES
]


@pytest.mark.slow
@pytest.mark.parametrize(("name", "backend"), FAMILY_BACKENDS)
def test_backend_matches_eager_on_a_transformers_checkpoint(
    name: str, backend: str, family_checkpoints, runners
):
    folder = family_checkpoints[name]
    eager, compiled = runners(str(folder), "eager"), runners(str(folder), backend)
    vocab = eager.recipe.model.vocab_size
    assert eager.recipe.shapes.prefill_len >= PROMPT_LEN
    prompt = [(13 * i + 7) % vocab for i in range(PROMPT_LEN)]
    got, want = compiled.logits(prompt), eager.logits(prompt)
    assert got.dtype == torch.float32 and got.shape == want.shape == (PROMPT_LEN, vocab)
    assert rel_err(got, want) <= 1e-4, f"{name} {backend}: {rel_err(got, want):.2e}"
    assert compiled.generate(prompt, NEW_TOKENS) == eager.generate(prompt, NEW_TOKENS)
    short = prompt[:SHORT_LEN]
    assert rel_err(compiled.logits(short), eager.logits(short)) <= 1e-4, f"{name} {backend}"
    assert compiled.generate(short, SHORT_NEW_TOKENS) == eager.generate(short, SHORT_NEW_TOKENS)
    # One token past a whole pass: a first pass, then a pass that reads its cache (extend).
    shapes = eager.recipe.shapes
    assert shapes.prefill_len + 1 <= shapes.max_seq_len
    past = [(7 * i + 3) % vocab for i in range(shapes.prefill_len + 1)]
    assert rel_err(compiled.logits(past), eager.logits(past)) <= 1e-4, f"{name} {backend} extend"
