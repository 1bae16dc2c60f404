"""Our model families against Hugging Face transformers, and bad checkpoints.

Each family: a tiny random transformers model (its own classes), saved with
save_pretrained, loaded by acache; fp32 logits must agree to 1e-4 relative.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from artifactcache import api
from artifactcache.errors import WeightsError
from artifactcache.models import WeightsSpec, build_model
from artifactcache.recipes import load_recipe

transformers = pytest.importorskip("transformers")

TINY = ["tiny-llama", "tiny-mistral", "tiny-phi-2", "tiny-phi-3"]


def hf_model(recipe):
    m = recipe.model
    common = dict(
        vocab_size=m.vocab_size,
        hidden_size=m.dim,
        num_hidden_layers=m.n_layers,
        num_attention_heads=m.n_heads,
        num_key_value_heads=m.n_kv_heads,
        intermediate_size=m.intermediate_size,
        rope_theta=m.rope_theta,
        max_position_embeddings=m.max_position_embeddings,
        tie_word_embeddings=m.tie_embeddings,
    )
    T = transformers
    if recipe.family == "llama":
        return T.LlamaForCausalLM(T.LlamaConfig(rms_norm_eps=m.norm_eps, **common))
    if recipe.family == "mistral":
        cfg = T.MistralConfig(rms_norm_eps=m.norm_eps, sliding_window=m.sliding_window, **common)
        return T.MistralForCausalLM(cfg)
    if recipe.family == "phi-3":
        return T.Phi3ForCausalLM(T.Phi3Config(rms_norm_eps=m.norm_eps, pad_token_id=0, **common))
    cfg = T.PhiConfig(
        layer_norm_eps=m.norm_eps, partial_rotary_factor=m.partial_rotary_factor, **common
    )
    return T.PhiForCausalLM(cfg)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    """One saved transformers checkpoint per tiny recipe, with non-trivial norms/biases."""
    out = {}
    torch.manual_seed(0)
    for name in TINY:
        model = hf_model(load_recipe(name)).eval()
        with torch.no_grad():
            for pname, p in model.named_parameters():
                if p.ndim == 1:  # norm scales around 1, biases around 0: both must be loaded
                    p.normal_(1.0 if "norm" in pname and "bias" not in pname else 0.0, 0.1)
        d = tmp_path_factory.mktemp(name)
        model.save_pretrained(d)
        out[name] = d
    return out


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).abs().max() / b.abs().max()).item()


@pytest.mark.parametrize("name", TINY)
def test_logits_match_transformers(name: str, checkpoints: dict[str, Path]):
    recipe = load_recipe(name)
    hf = transformers.AutoModelForCausalLM.from_pretrained(checkpoints[name]).eval()
    ours = build_model(recipe, weights=WeightsSpec(checkpoints[name]))
    # The seed prompt, extended past tiny-mistral's sliding window so the window matters.
    ids = list(recipe.bench.prompt_ids) + list(range(100, 140))
    assert len(ids) <= recipe.shapes.max_seq_len
    x = torch.tensor([ids])
    with torch.no_grad():
        want = hf(x).logits[0].float()
        got = ours(x, torch.arange(len(ids)))[0]
    assert got.dtype == torch.float32 and got.shape == want.shape
    assert rel_err(got, want) <= 1e-4


def test_sliding_window_changes_the_result(checkpoints: dict[str, Path]):
    """Guards the parity test above: without the window, tiny-mistral's logits differ."""
    import dataclasses

    recipe = load_recipe("tiny-mistral")
    full = dataclasses.replace(recipe, model=dataclasses.replace(recipe.model, sliding_window=None))
    spec = WeightsSpec(checkpoints["tiny-mistral"])
    ids = list(range(100, 140))
    with torch.no_grad():
        a = build_model(recipe, weights=spec)(torch.tensor([ids]), torch.arange(len(ids)))
        b = build_model(full, weights=spec)(torch.tensor([ids]), torch.arange(len(ids)))
    assert rel_err(a[0, -1], b[0, -1]) > 1e-3


# ------------------------------------------------------------ bad weights --


def _state(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(next(path.glob("*.safetensors"))))


def _save(tmp_path: Path, state: dict[str, torch.Tensor]) -> Path:
    from safetensors.torch import save_file

    p = tmp_path / "model.safetensors"
    save_file({k: v.contiguous() for k, v in state.items()}, str(p))
    return p


def _entries(root: Path) -> list[str]:
    d = root / "v1" / "entries"
    return [str(p) for p in d.rglob("manifest.json")] if d.exists() else []


BAD = ["missing", "shape", "int"]


@pytest.mark.parametrize("how", BAD)
def test_bad_weights_are_one_line_errors_and_nothing_is_cached(
    how: str, checkpoints: dict[str, Path], tmp_path: Path, cache_dir: Path
):
    state = _state(checkpoints["tiny-llama"])
    name = "model.layers.1.self_attn.k_proj.weight"
    if how == "missing":
        del state[name]
    elif how == "shape":
        state[name] = state[name][:-1]
    else:
        state[name] = torch.zeros(state[name].shape, dtype=torch.int32)
    path = _save(tmp_path, state)
    with pytest.raises(WeightsError) as ei:
        api.build("tiny-llama", "eager", weights=path, cache_dir=cache_dir)
    msg = str(ei.value)
    assert name in msg and "\n" not in msg
    assert _entries(cache_dir) == []
    staging = cache_dir / "v1" / "staging"
    assert not staging.exists() or os.listdir(staging) == []


def test_good_checkpoint_builds_and_is_keyed_by_its_digest(checkpoints, cache_dir: Path):
    a = api.build("tiny-llama", "eager", weights=checkpoints["tiny-llama"], cache_dir=cache_dir)
    b = api.build("tiny-llama", "eager", cache_dir=cache_dir)  # random weights: another key
    assert a.built and b.built and a.key != b.key
    assert (
        api.build(
            "tiny-llama", "eager", weights=checkpoints["tiny-llama"], cache_dir=cache_dir
        ).built
        is False
    )


@pytest.mark.parametrize(
    ("name", "from_checkpoint"),
    [("tiny-llama", False), ("tiny-phi-2", False), ("tiny-llama", True), ("tiny-phi-3", True)],
)
def test_building_a_model_does_not_import_dynamo_or_sympy(
    name: str, from_checkpoint: bool, checkpoints: dict[str, Path]
):
    """A process that only runs a model (eager, a warm aoti load) must not pay for
    importing torch._dynamo (1.5-2.5 s; nn.Embedding's init on meta did) or sympy
    (0.5-0.7 s; Module.to_empty did), with random weights or a checkpoint."""
    weights = f"WeightsSpec(path={str(checkpoints[name])!r})" if from_checkpoint else "None"
    code = (
        "import sys; from artifactcache.models import WeightsSpec, build_model; "
        "from artifactcache.recipes import load_recipe; "
        f"build_model(load_recipe({name!r}), dtype='bf16', weights={weights}); "
        "heavy = ('torch._dynamo', 'torch._inductor', 'sympy'); "
        "print(sorted(m for m in heavy if m in sys.modules))"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_materialize_keeps_tied_parameters_tied_and_leaves_nothing_on_meta():
    from torch import nn

    from artifactcache.models.weights import materialize

    with torch.device("meta"):
        m = nn.Sequential(nn.Embedding(7, 4), nn.Linear(4, 7), nn.BatchNorm1d(4))
    m[1].weight = m[0].weight  # tied, as tie_embeddings does
    materialize(m, torch.device("cpu"))
    assert m[1].weight is m[0].weight
    assert all(t.device.type == "cpu" for t in [*m.parameters(), *m.buffers()])
    assert m[2].running_mean.shape == (4,) and m[1].bias.requires_grad


def test_tied_embeddings_stay_tied_with_the_heads_init():
    import dataclasses

    recipe = load_recipe("tiny-llama")
    tied = dataclasses.replace(recipe, model=dataclasses.replace(recipe.model, tie_embeddings=True))
    model = build_model(tied)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    std = model.lm_head.weight.std().item()
    assert abs(std - tied.model.dim**-0.5) < 0.1 * tied.model.dim**-0.5, std
    logits = model(torch.tensor([[1, 2, 3]]), torch.arange(3))
    assert logits.abs().max().item() < 20  # O(1) logits, not sqrt(dim) times larger
