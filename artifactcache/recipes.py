"""Recipes by name, file or folder: what to build, as a small TOML file.

A recipe names a model family and its architecture, the shapes compiled
artifacts are built for, and the benchmark input. The built-in ones live in
the repository's ``recipes/*.toml`` (shipped in the wheel as package data); a user
passes a path to their own file, or a Hugging Face checkpoint folder, whose
config.json becomes the recipe (artifactcache/sources/hf.py).

Example (``llama-7b.toml``)::

    name = "llama-7b"
    family = "llama"                 # llama | mistral | phi-2 | phi-3 | qwen2 | qwen3
    description = "Llama-2-7B"
    # weights = "/models/Llama-2-7b-hf"  # optional: the checkpoint (relative to this file)

    [model]                          # the architecture (HF config names in comments)
    vocab_size = 32000
    dim = 4096                       # hidden_size
    n_layers = 32
    n_heads = 32
    n_kv_heads = 32                  # num_key_value_heads (GQA when < n_heads)
    intermediate_size = 11008
    norm_eps = 1e-5
    rope_theta = 10000.0
    max_position_embeddings = 4096
    # Optional: head_dim (default dim / n_heads), attention_bias, mlp_bias (default
    # false; true for phi-2), qkv_bias (default true for qwen2), qk_norm (default
    # true for qwen3), partial_rotary_factor, tie_embeddings, sliding_window,
    # and a [model.rope_scaling] table of type llama3, linear, dynamic or longrope.

    [shapes]                         # what compiled artifacts are specialised to
    max_seq_len = 256                # static KV-cache length: prompt + new tokens must fit
    max_batch = 1                    # rows of the static KV cache: every step runs this many
    # prefill_len = 255              # longest prefill pass (< max_seq_len); unwritten:
                                     # config.default_prefill_len of the other two

    [bench]                          # the seed's benchmark input
    prompt = "Hello, my name is"
    prompt_ids = [1, 15043, 29892, 590, 1024, 338]
    tokenizer = "meta-llama/Llama-2-7b-hf"
    max_new_tokens = 200
    batch_size = 1

This module finds and reads them (``load_recipe``) and writes them back
(``recipe_to_toml``); what a recipe holds, and the rules that check it, are
artifactcache/config.py. Every error names the file and the field, in one line.
"""

from __future__ import annotations

import sys
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from .config import Recipe, default_prefill_len, parse_recipe
from .errors import RecipeError
from .limits import read_small_file
from .sources.hf import recipe_from_folder

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - python 3.10
    import tomli as tomllib

# The built-in recipes are the repository's top-level recipes/; a wheel carries them
# inside the package (setup.py copies them to artifactcache/recipes/).
_PACKAGED_RECIPES = Path(__file__).parent / "recipes"
BUILTIN_DIR = (
    _PACKAGED_RECIPES
    if any(_PACKAGED_RECIPES.glob("*.toml"))
    else Path(__file__).resolve().parent.parent / "recipes"
)


def builtin_names() -> list[str]:
    return sorted(p.stem for p in BUILTIN_DIR.glob("*.toml"))


# Files a user may hand over for a checkpoint folder's contents.
CHECKPOINT_FILE_SUFFIXES = (".safetensors", ".json", ".bin", ".pt", ".pth", ".gguf")


def _looks_like_path(text: str) -> bool:
    """A path a user typed, never a built-in name: an explicit path always means a path
    (``./tiny-llama`` is that folder, or nothing, not the built-in recipe)."""
    return (
        any(sep in text for sep in ("/", "\\"))
        or text.startswith((".", "~"))
        or Path(text).suffix.lower() in (".toml", *CHECKPOINT_FILE_SUFFIXES)
    )


def _not_found(text: str) -> str:
    parts = text.split("/")
    if len(parts) == 2 and all(parts) and not text.startswith((".", "~")):
        return (
            f"{text!r} is not a file or folder here, and Hugging Face hub ids are not "
            f"supported yet: download it (`hf download {text} --local-dir DIR`) and pass DIR"
        )
    return (
        f"{text} not found: pass an existing recipe .toml, a checkpoint folder, or a "
        f"built-in recipe name ({', '.join(builtin_names())})"
    )


def load_recipe(name_or_path: str | Path) -> Recipe:
    """A built-in recipe by name, a recipe file by path, or a checkpoint folder.

    A folder is a Hugging Face checkpoint: its config.json gives the architecture
    and its safetensors the weights (artifactcache/sources/hf.py). Text that looks like a
    path (a separator, a leading "." or "~", a .toml suffix) is only ever a path.
    """
    text = str(name_or_path)
    path = Path(text).expanduser()
    if path.is_dir():
        return recipe_from_folder(path)
    if path.exists() or _looks_like_path(text):
        if not path.exists():
            raise RecipeError(_not_found(text))
        if path.suffix.lower() in CHECKPOINT_FILE_SUFFIXES:
            raise RecipeError(
                f"{text} is a {path.suffix} file, not a recipe: pass the checkpoint folder "
                "that holds it (config.json and *.safetensors), or a recipe .toml"
            )
    else:
        path = BUILTIN_DIR / f"{text}.toml"
        if not path.is_file():
            raise RecipeError(
                f"unknown recipe {text!r}: choose one of {', '.join(builtin_names())}, "
                "or pass a .toml file or a checkpoint folder (see `acache recipes`)"
            )
    src = str(path)
    raw = read_small_file(path, "recipe", RecipeError)  # a FIFO or a huge file: one line
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise RecipeError(f"{src}: not valid TOML ({e})") from None
    recipe = parse_recipe(data, src)
    return replace(recipe, builtin=True) if path.parent == BUILTIN_DIR else recipe


def recipe_to_dict(recipe: Recipe) -> dict[str, Any]:
    """The recipe as the TOML table parse_recipe reads back into an equal recipe.

    Fields whose value is None are left out (TOML has no null; absent means None), and
    so is a ``prefill_len`` that is the default for the other shapes: unwritten, it
    follows an edited ``max_seq_len`` or ``max_batch``.
    """

    def without_none(d: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in d.items() if v is not None}

    bench = without_none(asdict(recipe.bench))
    bench["prompt_ids"] = list(recipe.bench.prompt_ids)
    out: dict[str, Any] = {"name": recipe.name, "family": recipe.family}
    if recipe.description:
        out["description"] = recipe.description
    if recipe.weights is not None:
        out["weights"] = str(recipe.weights.resolve())
    out["model"] = without_none(asdict(recipe.model))
    shapes = asdict(recipe.shapes)
    if recipe.shapes.prefill_len == default_prefill_len(shapes["max_seq_len"], shapes["max_batch"]):
        del shapes["prefill_len"]
    out["shapes"] = shapes
    out["bench"] = bench
    return out


def recipe_to_toml(recipe: Recipe) -> str:
    import tomli_w

    return tomli_w.dumps(recipe_to_dict(recipe))


def list_recipes() -> list[Recipe]:
    return [load_recipe(n) for n in builtin_names()]
