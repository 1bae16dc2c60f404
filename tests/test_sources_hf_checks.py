"""config.json never silently disagrees with a recipe, and bad folders are one-line errors.

A built-in recipe plus ``--weights DIR`` whose config.json disagrees is refused,
naming the field and both values; a folder that acache cannot honour (bad JSON,
missing or mistyped fields, an unknown family, an unsupported rope type,
quantization, a shard missing from the index) fails with one line, exit 1, and
leaves the cache empty.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from artifactcache import api
from artifactcache.cli.app import app
from artifactcache.errors import RecipeError, WeightsError
from artifactcache.recipes import load_recipe

transformers = pytest.importorskip("transformers")
T = transformers

runner = CliRunner()


def _entries(root: Path) -> list[Path]:
    d = root / "v1" / "entries"
    return list(d.rglob("manifest.json")) if d.exists() else []


def assert_cli_error(cache_dir: Path, args: list[str], *contains: str) -> str:
    r = runner.invoke(app, [str(a) for a in args])
    assert r.exit_code == 1, (r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    assert "Traceback" not in r.stdout + r.stderr
    for c in contains:
        assert c in lines[0], lines[0]
    assert _entries(cache_dir) == []
    staging = cache_dir / "v1" / "staging"
    assert not staging.exists() or not any(staging.iterdir())
    return lines[0]


def _tiny_hf(recipe_name: str, out: Path, **over: Any) -> Path:
    """A transformers checkpoint shaped exactly like a tiny built-in recipe, plus `over`."""
    r = load_recipe(recipe_name)
    m = r.model
    kw: dict[str, Any] = dict(
        vocab_size=m.vocab_size, hidden_size=m.dim, num_hidden_layers=m.n_layers,
        num_attention_heads=m.n_heads, num_key_value_heads=m.n_kv_heads,
        intermediate_size=m.intermediate_size, rope_theta=m.rope_theta,
        max_position_embeddings=m.max_position_embeddings, tie_word_embeddings=m.tie_embeddings,
        rms_norm_eps=m.norm_eps,
    )  # fmt: skip
    if r.family == "mistral":
        kw["sliding_window"] = m.sliding_window
    kw.update(over)
    cls = {"llama": (T.LlamaConfig, T.LlamaForCausalLM),
           "mistral": (T.MistralConfig, T.MistralForCausalLM)}[r.family]  # fmt: skip
    cls[1](cls[0](**kw)).save_pretrained(out)
    return out


# A llama-3-8b-shaped tiny recipe: its rope_theta, no rope scaling.
LLAMA3_TINY = """
name = "tiny-llama-3"
family = "llama"
[model]
vocab_size = 1024
dim = 64
n_layers = 2
n_heads = 4
n_kv_heads = 1
intermediate_size = 224
rope_theta = 500000.0
max_position_embeddings = 8192
[shapes]
max_seq_len = 64
prefill_len = 8
[bench]
prompt_ids = [1, 2, 3]
"""


def test_llama31_rope_scaling_under_a_llama3_recipe_is_refused(tmp_path: Path, cache_dir: Path):
    recipe = tmp_path / "tiny-llama-3.toml"
    recipe.write_text(LLAMA3_TINY)
    ckpt = tmp_path / "llama-3.1"
    T.LlamaForCausalLM(
        T.LlamaConfig(
            vocab_size=1024, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=1, intermediate_size=224, rope_theta=5e5, rms_norm_eps=1e-5,
            max_position_embeddings=131072,
            rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                          "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
        )
    ).save_pretrained(ckpt)  # fmt: skip
    line = assert_cli_error(
        cache_dir, ["build", recipe, "--weights", ckpt], "rope_scaling=", '"type":"llama3"',
        "model.rope_scaling=none", "pass the folder itself as RECIPE",
    )  # fmt: skip
    assert str(ckpt / "config.json") in line
    # The folder itself as RECIPE adopts its config, llama3 scaling included.
    assert load_recipe(ckpt).model.rope_scaling["factor"] == 8.0


def test_mistral_rope_theta_1e6_under_its_recipe_is_refused(tmp_path: Path, cache_dir: Path):
    ckpt = _tiny_hf("tiny-mistral", tmp_path / "m", rope_theta=1e6, rms_norm_eps=1e-5)
    assert_cli_error(
        cache_dir, ["build", "tiny-mistral", "--weights", ckpt],
        "rope_theta=1000000.0 but recipe tiny-mistral has model.rope_theta=10000.0",
    )  # fmt: skip
    with pytest.raises(WeightsError, match="rope_theta"):
        api.build("tiny-mistral", "eager", weights=ckpt, cache_dir=cache_dir)
    assert _entries(cache_dir) == []


@pytest.mark.parametrize(
    ("over", "field"),
    [
        ({"tie_word_embeddings": True}, "tie_word_embeddings=True"),
        ({"rms_norm_eps": 1e-6}, "rms_norm_eps=1e-06"),
        ({"attention_bias": True}, "attention_bias=True"),
        ({"num_key_value_heads": 4}, "num_key_value_heads=4"),
    ],
)
def test_each_checked_field_is_refused_by_name(over, field, tmp_path: Path, cache_dir: Path):
    ckpt = _tiny_hf("tiny-llama", tmp_path / "c", **over)
    with pytest.raises(WeightsError) as ei:
        api.build("tiny-llama", "eager", weights=ckpt, cache_dir=cache_dir)
    assert field in str(ei.value) and "\n" not in str(ei.value)
    assert _entries(cache_dir) == []


def test_sliding_window_disagreement_is_refused(tmp_path: Path, cache_dir: Path):
    ckpt = _tiny_hf("tiny-mistral", tmp_path / "m", sliding_window=None)
    with pytest.raises(WeightsError, match="sliding_window=none but recipe tiny-mistral"):
        api.build("tiny-mistral", "eager", weights=ckpt, cache_dir=cache_dir)


def test_another_family_is_refused(tmp_path: Path, cache_dir: Path):
    ckpt = _tiny_hf("tiny-mistral", tmp_path / "m")
    with pytest.raises(WeightsError, match="is a mistral model .* recipe tiny-llama is llama"):
        api.build("tiny-llama", "eager", weights=ckpt, cache_dir=cache_dir)


def test_a_matching_config_is_accepted_and_a_folder_without_one_loads_by_shapes(
    tmp_path: Path, cache_dir: Path
):
    ckpt = _tiny_hf("tiny-mistral", tmp_path / "m")
    first = api.build("tiny-mistral", "eager", weights=ckpt, cache_dir=cache_dir)
    assert first.built
    (ckpt / "config.json").unlink()
    again = api.build("tiny-mistral", "eager", weights=ckpt, cache_dir=cache_dir)
    # config.json is not hashed raw: the same tensors are the same key.
    assert again.key == first.key and not again.built
    # Without a config only shapes are checked, and they still are.
    with pytest.raises(WeightsError, match="shape"):
        api.build("tiny-phi-3", "eager", weights=ckpt, cache_dir=cache_dir)


# ------------------------------------------------------------ bad folders --


@pytest.fixture
def good_config(tmp_path: Path) -> tuple[Path, dict[str, Any]]:
    d = _tiny_hf("tiny-llama", tmp_path / "good")
    return d, json.loads((d / "config.json").read_text())


# A value _write writes as the literal 1e400, which json.loads reads as inf.
_AS_1E400 = 9.87654321e300


def _write(d: Path, cfg: dict[str, Any]) -> None:
    (d / "config.json").write_text(json.dumps(cfg).replace(repr(_AS_1E400), "1e400"))


def _edited(cfg: dict[str, Any], **changes: Any) -> dict[str, Any]:
    out = dict(cfg)
    for k, v in changes.items():
        if v is _DROP:
            out.pop(k, None)
        else:
            out[k] = v
    return out


_DROP = object()


@pytest.mark.parametrize(
    ("changes", "contains"),
    [
        ({"hidden_size": _DROP}, "field 'hidden_size' is missing"),
        ({"num_hidden_layers": _DROP}, "field 'num_hidden_layers' is missing"),
        ({"hidden_size": "64"}, "field 'hidden_size' must be int, got '64'"),
        ({"tie_word_embeddings": "yes"}, "field 'tie_word_embeddings' must be bool"),
        ({"rms_norm_eps": -1.0}, "field 'rms_norm_eps' must be positive"),
        ({"num_key_value_heads": 3}, "must divide model.n_heads"),
        ({"model_type": "gpt2"}, "model_type' is 'gpt2', which acache does not run"),
        ({"model_type": "qwen2_moe"}, "model_type' is 'qwen2_moe', which acache does not run"),
        ({"model_type": "qwen2", "use_sliding_window": True, "sliding_window": 8,
          "max_window_layers": 1}, "field 'max_window_layers' puts a sliding window on 1 of 2"),
        ({"model_type": "qwen3", "use_sliding_window": True, "sliding_window": 8,
          "layer_types": ["sliding_attention", "full_attention"]},
         "field 'layer_types' puts a sliding window on 1 of 2"),
        ({"model_type": "qwen2", "use_sliding_window": True, "layer_types": ["full"]},
         "field 'layer_types' must list 2 of full_attention or sliding_attention"),
        ({"model_type": "qwen2", "use_sliding_window": True, "max_window_layers": -1},
         "field 'max_window_layers' must be an int >= 0"),
        ({"model_type": "qwen3", "rope_parameters": {"rope_type": "yarn", "factor": 4.0}},
         "field 'rope_parameters.rope_type' is 'yarn', which acache cannot honour for qwen3"),
        ({"model_type": 7}, "field 'model_type' must be str"),
        ({"model_type": _DROP, "architectures": ["GPT2LMHeadModel"]}, "names no family"),
        ({"hidden_act": "gelu"}, "field 'hidden_act' is 'gelu'"),
        ({"rope_parameters": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4}},
         "field 'rope_parameters.rope_type' is 'yarn', which acache cannot honour"),
        ({"rope_scaling": {"type": "llama3", "factor": 8.0}},
         "field 'rope_scaling.low_freq_factor' is missing"),
        ({"rope_scaling": {"type": "linear", "factor": "2"}},
         "field 'rope_scaling.factor' must be float"),
        ({"quantization_config": {"quant_method": "gptq"}}, "quantized checkpoints"),
        ({"torch_dtype": "int8"}, "field 'torch_dtype' is 'int8'"),
        # json.loads reads NaN and Infinity; no config field means them
        ({"rms_norm_eps": float("nan")}, "NaN is not a finite number"),
        ({"rope_theta": float("inf")}, "Infinity is not a finite number"),
        # numbers past the largest float: an integer, and a float literal json reads as inf
        ({"rms_norm_eps": 10**400}, "field 'rms_norm_eps' must be a finite number, got an int"),
        ({"rms_norm_eps": _AS_1E400}, "field 'rms_norm_eps' must be a finite number, got inf"),
    ],
)  # fmt: skip
def test_bad_config_is_one_line_and_caches_nothing(
    changes: dict[str, Any], contains: str, good_config, cache_dir: Path
):
    d, cfg = good_config
    _write(d, _edited(cfg, **changes))
    line = assert_cli_error(cache_dir, ["build", d], contains)
    assert str(d / "config.json") in line
    # The same config under --weights is refused the same way.
    assert_cli_error(cache_dir, ["build", "tiny-llama", "--weights", d], contains)
    assert_cli_error(cache_dir, ["recipe", d], contains)


@pytest.mark.parametrize("text", ["{not json", "[1, 2]", ""])
def test_config_that_is_not_a_json_object(text: str, good_config, cache_dir: Path):
    d, _ = good_config
    (d / "config.json").write_text(text)
    assert_cli_error(cache_dir, ["build", d], str(d / "config.json"))


def test_folder_without_config_is_not_a_recipe(tmp_path: Path, cache_dir: Path):
    (tmp_path / "empty").mkdir()
    assert_cli_error(cache_dir, ["key", tmp_path / "empty", "-b", "eager"], "has no config.json")
    with pytest.raises(RecipeError, match="has no config.json"):
        load_recipe(tmp_path / "empty")


def test_longrope_past_its_pretraining_length_is_refused(tmp_path: Path):
    """A saved TOML that raises max_seq_len past original_max_position_embeddings."""
    from artifactcache.recipes import recipe_to_toml

    d = tmp_path / "phi3"
    T.Phi3ForCausalLM(
        T.Phi3Config(
            vocab_size=128, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
            intermediate_size=64, pad_token_id=0, max_position_embeddings=512,
            original_max_position_embeddings=64,
            rope_scaling={"rope_type": "longrope", "short_factor": [1.0] * 8,
                          "long_factor": [2.0] * 8},
        )
    ).save_pretrained(d)  # fmt: skip
    toml = tmp_path / "phi3.toml"
    toml.write_text(recipe_to_toml(load_recipe(d)).replace("max_seq_len = 64", "max_seq_len = 65"))
    with pytest.raises(RecipeError, match="'shapes.max_seq_len' .* longrope"):
        load_recipe(toml)


def test_recipe_command_prints_toml_and_json(good_config):
    d, _ = good_config
    r = runner.invoke(app, ["recipe", str(d)])
    assert r.exit_code == 0, r.stderr
    assert 'family = "llama"' in r.stdout and f'weights = "{d.resolve()}"' in r.stdout
    data = json.loads(runner.invoke(app, ["recipe", str(d), "--json"]).stdout)
    assert data["model"]["dim"] == 64 and data["shapes"]["max_seq_len"] == 256
