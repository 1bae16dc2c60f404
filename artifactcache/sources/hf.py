"""A Hugging Face checkpoint folder as a recipe: config.json -> architecture.

``recipe_from_folder(DIR)`` reads ``DIR/config.json`` the way transformers reads it
(its old ``rope_theta``/``rope_scaling`` spelling and its newer ``rope_parameters``
both), turns it into a recipe table and validates that with ``parse_recipe``, so a
folder and the TOML that ``acache recipe DIR`` prints are one recipe with one key.
A field transformers would fill with a default gets that family's default here too.
A field acache cannot honour (an activation, a rope type, quantization) is refused
with one line naming it.

``check_weights_agree(recipe, DIR)`` is the rule for a recipe plus ``--weights DIR``:
every architecture field config.json states must equal the recipe's, else a
one-line refusal naming the field and both values. Never adopted silently: the way
to use a folder's own config is to pass the folder as RECIPE.

Torch-free: the CLI prints derived recipes without importing torch.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..config import Bench, Recipe, Shapes, default_prefill_len, parse_recipe
from ..dtypes import TORCH_DTYPE_NAMES
from ..errors import RecipeError, WeightsError
from ..limits import int_to_float
from .checkpoint import CONFIG_NAME, has_config, read_config

# model_type -> our family. `architectures` is read only when model_type is absent.
# Qwen2.5 checkpoints say model_type "qwen2": one architecture.
FAMILY_OF_MODEL_TYPE = {
    "llama": "llama",
    "mistral": "mistral",
    "phi": "phi-2",
    "phi3": "phi-3",
    "qwen2": "qwen2",
    "qwen3": "qwen3",
}
FAMILY_OF_ARCHITECTURE = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "PhiForCausalLM": "phi-2",
    "Phi3ForCausalLM": "phi-3",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
}


@dataclass(frozen=True)
class FamilyDefaults:
    """What transformers' config class of the family uses when config.json omits a field."""

    norm_field: str
    norm_eps: float
    max_position_embeddings: int
    activations: tuple[str, ...]
    partial_rotary_factor: float = 1.0
    sliding_window: int | None = None
    reads_sliding_window: bool = False
    # Qwen's spelling: use_sliding_window, then a window on layers >= max_window_layers
    # (or on the layers that layer_types names).
    reads_layer_windows: bool = False
    # The bias flags config.json may set; other families' biases are fixed (phi-2: all,
    # qwen2: q/k/v; see config._parse_model).
    bias_fields: tuple[str, ...] = ()
    head_dim: int | None = None  # None: dim // n_heads
    rope_types: tuple[str, ...] = ("llama3", "linear", "dynamic")


DEFAULTS = {
    "llama": FamilyDefaults(
        "rms_norm_eps", 1e-6, 2048, ("silu",), bias_fields=("attention_bias", "mlp_bias")
    ),
    "mistral": FamilyDefaults(
        "rms_norm_eps", 1e-6, 131072, ("silu",), sliding_window=4096, reads_sliding_window=True
    ),
    # gelu_new and gelu_pytorch_tanh are the same tanh approximation.
    "phi-2": FamilyDefaults(
        "layer_norm_eps", 1e-5, 2048, ("gelu_new", "gelu_pytorch_tanh"), partial_rotary_factor=0.5
    ),
    "phi-3": FamilyDefaults(
        "rms_norm_eps", 1e-5, 4096, ("silu",), reads_sliding_window=True, rope_types=("longrope",)
    ),
    "qwen2": FamilyDefaults("rms_norm_eps", 1e-6, 32768, ("silu",), reads_layer_windows=True),
    "qwen3": FamilyDefaults(
        "rms_norm_eps",
        1e-6,
        32768,
        ("silu",),
        reads_layer_windows=True,
        bias_fields=("attention_bias",),
        head_dim=128,
    ),  # fmt: skip
}
# A folder recipe's context: its max_position_embeddings, but at most this. Checkpoints
# state 32k-128k, whose static KV cache would dwarf a 7-8B model's weights (Mistral-7B
# at 32k: 4 GiB in bf16; Llama-2-7B's 32 full heads at 4096 already 2 GiB), and every
# decode step of a static cache reads all of it. 4096 is Llama-2's and Phi-3-mini's
# whole context and fits beside a 7-8B bf16 model on a 24 GB GPU; --max-seq-len asks
# for more (or less), and a size that does not fit is refused before the build.
DEFAULT_MAX_SEQ_LEN = 4096

_MISSING = object()


class _Config:
    """Typed reads of config.json fields; every error names the file and the field."""

    def __init__(self, data: dict[str, Any], src: str):
        self.data, self.src = data, src

    def fail(self, field: str, what: str) -> RecipeError:
        return RecipeError(f"{self.src}: field '{field}' {what}")

    def get(self, name: str, typ: type, default: Any = _MISSING, table: dict | None = None,
            prefix: str = "") -> Any:  # fmt: skip
        table = self.data if table is None else table
        val = table.get(name)
        if val is None:  # transformers treats null as "use the default"
            if default is _MISSING:
                raise self.fail(prefix + name, "is missing")
            return default
        if typ is float and isinstance(val, int) and not isinstance(val, bool):
            val = int_to_float(val, lambda what: self.fail(prefix + name, what))
        if not isinstance(val, typ) or (typ in (int, float) and isinstance(val, bool)):
            raise self.fail(prefix + name, f"must be {typ.__name__}, got {val!r}")
        if typ is float and not math.isfinite(val):  # 1e400 reads as inf
            raise self.fail(prefix + name, f"must be a finite number, got {val}")
        if typ in (int, float) and val <= 0:
            raise self.fail(prefix + name, f"must be positive, got {val!r}")
        return val


def family_of(c: _Config) -> str:
    model_type = c.data.get("model_type")
    if model_type is None:
        archs = c.get("architectures", list, [])
        known = [FAMILY_OF_ARCHITECTURE[a] for a in archs if a in FAMILY_OF_ARCHITECTURE]
        if not known:
            raise c.fail("model_type", f"is missing and architectures {archs!r} names no "
                         f"family acache runs ({', '.join(FAMILY_OF_ARCHITECTURE)})")  # fmt: skip
        return known[0]
    if not isinstance(model_type, str):
        raise c.fail("model_type", f"must be str, got {model_type!r}")
    if model_type not in FAMILY_OF_MODEL_TYPE:
        raise c.fail(
            "model_type",
            f"is {model_type!r}, which acache does not run "
            f"(supported: {', '.join(FAMILY_OF_MODEL_TYPE)})",
        )
    return FAMILY_OF_MODEL_TYPE[model_type]


def _rope_table(c: _Config) -> tuple[dict[str, Any], str]:
    """transformers' rope dict, whichever spelling the file uses, and its field name."""
    for name in ("rope_scaling", "rope_parameters"):  # the loader prefers rope_scaling
        val = c.data.get(name)
        if val:
            if not isinstance(val, dict):
                raise c.fail(name, f"must be an object, got {val!r}")
            return val, name
    return {}, "rope_parameters"


def _rope_scaling(c: _Config, family: str, rope: dict[str, Any], name: str,
                  max_pos: int) -> dict[str, Any] | None:  # fmt: skip
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind == "su" or (family == "phi-3" and kind == "yarn"):  # transformers' old names
        kind = "longrope"
    if kind == "default":
        return None
    field = f"{name}.rope_type"
    allowed = DEFAULTS[family].rope_types
    if kind not in allowed:
        raise c.fail(field, f"is {kind!r}, which acache cannot honour for {family} "
                     f"(supported: {', '.join(allowed)})")  # fmt: skip
    p = f"{name}."
    if kind in ("linear", "dynamic"):
        return {"type": kind, "factor": c.get("factor", float, table=rope, prefix=p)}
    # The pretraining length: a top-level original_max_position_embeddings wins over the
    # rope table's, as in transformers (Phi-3's config class always has one: 4096).
    orig = c.get("original_max_position_embeddings", int, 4096 if family == "phi-3" else None)
    if orig is None:
        orig = c.get("original_max_position_embeddings", int, max_pos, table=rope, prefix=p)
    out: dict[str, Any] = {"type": kind, "original_max_position_embeddings": orig}
    if kind == "llama3":
        for k in ("factor", "low_freq_factor", "high_freq_factor"):
            out[k] = c.get(k, float, table=rope, prefix=p)
        return out
    for k in ("short_factor", "long_factor"):
        out[k] = c.get(k, list, table=rope, prefix=p)
    for k in ("factor", "attention_factor"):
        if rope.get(k) is not None:
            out[k] = c.get(k, float, table=rope, prefix=p)
    return out


def model_table(data: dict[str, Any], src: str) -> tuple[str, dict[str, Any]]:
    """(family, the recipe's [model] table) from a config.json object."""
    c = _Config(data, src)
    family = family_of(c)
    d = DEFAULTS[family]
    if data.get("quantization_config") is not None:
        method = data["quantization_config"]
        method = method.get("quant_method", method) if isinstance(method, dict) else method
        raise c.fail("quantization_config", f"is set ({method!r}): quantized checkpoints are "
                     "not supported; use the unquantized weights")  # fmt: skip
    act = c.get("hidden_act", str, d.activations[0])
    if act not in d.activations:
        raise c.fail("hidden_act", f"is {act!r}; acache's {family} runs "
                     f"{' or '.join(repr(a) for a in d.activations)} only")  # fmt: skip
    if family == "phi-2" and c.get("qk_layernorm", bool, False):
        raise c.fail("qk_layernorm", "is true, which acache's phi-2 does not implement")
    for name in ("dtype", "torch_dtype"):  # transformers 5 and 4 spell it differently
        dtype = c.data.get(name)
        if dtype is not None and dtype not in TORCH_DTYPE_NAMES:
            raise c.fail(name, f"is {dtype!r}; acache loads {', '.join(TORCH_DTYPE_NAMES)} weights")
    n_heads = c.get("num_attention_heads", int)
    max_pos = c.get("max_position_embeddings", int, d.max_position_embeddings)
    rope, rope_name = _rope_table(c)
    theta = rope.get("rope_theta", data.get("rope_theta"))
    theta = 10000.0 if theta is None else c.get("rope_theta", float, table={"rope_theta": theta})
    prf_raw = rope.get("partial_rotary_factor", data.get("partial_rotary_factor"))
    prf = (
        d.partial_rotary_factor
        if prf_raw is None
        else c.get("partial_rotary_factor", float, table={"partial_rotary_factor": prf_raw})
    )
    if family in ("llama", "mistral", "qwen2", "qwen3") and prf != 1.0:
        raise c.fail("partial_rotary_factor", f"is {prf}; acache's {family} rotates all dims")
    m: dict[str, Any] = {
        "vocab_size": c.get("vocab_size", int),
        "dim": c.get("hidden_size", int),
        "n_layers": c.get("num_hidden_layers", int),
        "n_heads": n_heads,
        "n_kv_heads": c.get("num_key_value_heads", int, n_heads),
        "intermediate_size": c.get("intermediate_size", int),
        "norm_eps": c.get(d.norm_field, float, d.norm_eps),
        "rope_theta": theta,
        "max_position_embeddings": max_pos,
        "partial_rotary_factor": prf,
        "tie_embeddings": c.get("tie_word_embeddings", bool, False),
    }
    head_dim = c.get("head_dim", int, d.head_dim)
    if head_dim is not None:
        m["head_dim"] = head_dim
    for name in d.bias_fields:
        m[name] = c.get(name, bool, False)
    if d.reads_layer_windows:
        window = _layer_window(c, m["n_layers"])
        if window is not None:
            m["sliding_window"] = window
    if d.reads_sliding_window:
        if "sliding_window" in data:
            window = c.get("sliding_window", int, None)
        else:
            window = d.sliding_window
        if window is not None:
            m["sliding_window"] = window
    scaling = _rope_scaling(c, family, rope, rope_name, max_pos)
    if scaling is not None:
        m["rope_scaling"] = scaling
    return family, m


def _layer_window(c: _Config, n_layers: int) -> int | None:
    """Qwen's window, as transformers sets it: the window when every layer slides, None
    when none does; a window on some layers only is refused."""
    if not c.get("use_sliding_window", bool, False):
        return None  # transformers then drops sliding_window, whatever layer_types says
    # Absent, the config class's 4096; null, no window (transformers passes None on).
    window = c.get("sliding_window", int, None) if "sliding_window" in c.data else 4096
    if window is None:
        return None
    kinds = ("full_attention", "sliding_attention")
    layer_types = c.get("layer_types", list, None)
    if layer_types is not None:
        if len(layer_types) != n_layers or any(t not in kinds for t in layer_types):
            raise c.fail("layer_types", f"must list {n_layers} of {' or '.join(kinds)}, "
                         f"got {layer_types!r}")  # fmt: skip
        sliding = [t == "sliding_attention" for t in layer_types]
        field = "layer_types"
    else:
        first = c.data.get("max_window_layers")
        if first is None:
            first = 28
        elif not isinstance(first, int) or isinstance(first, bool) or first < 0:
            raise c.fail("max_window_layers", f"must be an int >= 0, got {first!r}")
        sliding = [i >= first for i in range(n_layers)]
        field = "max_window_layers"
    if all(sliding):
        return window
    if not any(sliding):
        return None
    raise c.fail(field, f"puts a sliding window on {sum(sliding)} of {n_layers} layers; "
                 "acache's windows cover all layers or none")  # fmt: skip


def recipe_from_folder(folder: Path) -> Recipe:
    """The recipe a checkpoint folder's config.json describes, with the folder as weights."""
    recipe = recipe_from_config(read_config(folder), str(folder / CONFIG_NAME), folder.resolve())
    return dataclasses.replace(recipe, source=str(folder), weights=folder)


def recipe_from_config(data: dict[str, Any], src: str, folder: Path) -> Recipe:
    """The recipe of a config.json object, named after its folder.

    Shapes get the recipe defaults, but max_seq_len is the checkpoint's
    max_position_embeddings capped at DEFAULT_MAX_SEQ_LEN (and longrope's original
    length); the bench prompt has no ids (no tokenizer here).
    """
    family, model = model_table(data, src)
    default = Shapes()
    max_seq_len = min(DEFAULT_MAX_SEQ_LEN, model["max_position_embeddings"])
    scaling = model.get("rope_scaling") or {}
    if scaling.get("type") == "longrope":
        max_seq_len = min(max_seq_len, scaling["original_max_position_embeddings"])
    shapes = {
        "max_seq_len": max_seq_len,
        "max_batch": default.max_batch,
        "prefill_len": default_prefill_len(max_seq_len, default.max_batch),
    }
    archs = data.get("architectures")
    arch = archs[0] if isinstance(archs, list) and archs and isinstance(archs[0], str) else family
    table = {
        "name": folder.name,
        "family": family,
        "description": f"{arch} from {folder / CONFIG_NAME}",
        "model": model,
        "shapes": shapes,
        "bench": {"prompt": Bench().prompt, "prompt_ids": []},
    }
    return parse_recipe(table, src)


# config.json's name for each recipe field, for messages a user can grep for.
_HF_NAMES = {
    "vocab_size": "vocab_size",
    "dim": "hidden_size",
    "n_layers": "num_hidden_layers",
    "n_heads": "num_attention_heads",
    "n_kv_heads": "num_key_value_heads",
    "intermediate_size": "intermediate_size",
    "head_dim": "head_dim",
    "norm_eps": "rms_norm_eps",
    "rope_theta": "rope_theta",
    "rope_scaling": "rope_scaling",
    "partial_rotary_factor": "partial_rotary_factor",
    "sliding_window": "sliding_window",
    "tie_embeddings": "tie_word_embeddings",
    "attention_bias": "attention_bias",
    "mlp_bias": "mlp_bias",
    "qkv_bias": "qkv_bias (implied by model_type)",
    "qk_norm": "qk_norm (implied by model_type)",
}
# Not compared: it changes nothing a recipe's shapes can reach (max_seq_len is capped
# by it, dynamic rope only acts beyond it, and longrope's scale is in rope_scaling).
_UNCHECKED = {"max_position_embeddings"}


def check_weights_agree(recipe: Recipe, weights: Path) -> None:
    """Refuse, in one line, a checkpoint folder whose config.json disagrees with the recipe.

    A folder without config.json (or a single .safetensors file) has no config to
    disagree with: the loader still checks every tensor's name and shape.
    """
    if not has_config(weights):
        return
    theirs = recipe_from_folder(weights)
    where = f"--weights {weights / CONFIG_NAME}"
    advice = "pass the folder itself as RECIPE to use its config"
    if theirs.family != recipe.family:
        raise WeightsError(
            f"{where} is a {theirs.family} model (model_type) but recipe {recipe.name} is "
            f"{recipe.family}; {advice}"
        )
    ours_m, theirs_m = dataclasses.asdict(recipe.model), dataclasses.asdict(theirs.model)
    for field, ours in ours_m.items():
        if field in _UNCHECKED or theirs_m[field] == ours:
            continue
        hf = "layer_norm_eps" if field == "norm_eps" and recipe.family == "phi-2" else None
        raise WeightsError(
            f"{where} has {hf or _HF_NAMES[field]}={_show(theirs_m[field])} but recipe "
            f"{recipe.name} has model.{field}={_show(ours)}; {advice}"
        )


def _show(value: Any) -> str:
    if isinstance(value, dict):
        return json.dumps(value, separators=(",", ":"))
    return "none" if value is None else str(value)
