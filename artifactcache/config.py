"""A recipe as data: the model's architecture, the shapes it is built for, its benchmark
input, and the rules that check them.

``parse_recipe`` turns a recipe's table (a TOML file's, or one derived from a
checkpoint's config.json by sources/hf.py) into a ``Recipe``; every error names the
file and the field, in one line. ``shape_problem`` is the one rule for a recipe's
[shapes] and for a ``max_seq_len``/``max_batch`` chosen at build (``Recipe.with_shapes``).

The bottom of the recipe layers: models, sizing, sources and the recipe registry
(recipes.py: built-in names, TOML files, folders) import this module; it imports none
of them. Torch-free.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from .errors import RecipeError, ShapeError
from .limits import RECIPE_INT_MAX, int_to_float

FAMILIES = ("llama", "mistral", "phi-2", "phi-3", "qwen2", "qwen3")


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    intermediate_size: int
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    max_position_embeddings: int = 4096
    # None = plain RoPE. Otherwise {"type": ..., ...}, validated by _rope_scaling():
    # llama3 (Llama-3.1/3.2), linear, dynamic (NTK; plain RoPE up to
    # max_position_embeddings, which max_seq_len never exceeds), longrope (Phi-3).
    rope_scaling: dict[str, Any] | None = None
    # Mistral: attend to at most this many previous positions. None = full causal.
    sliding_window: int | None = None
    # Phi-2: rotary on the first partial_rotary_factor * head_dim dims only.
    partial_rotary_factor: float = 1.0
    tie_embeddings: bool = False
    # 0 = dim // n_heads; set explicitly when a checkpoint's heads are wider or narrower.
    head_dim: int = 0
    # Biases on q/k/v/o and on the MLP's projections (Llama's attention_bias/mlp_bias;
    # phi-2 always has both).
    attention_bias: bool = False
    mlp_bias: bool = False
    # Biases on q/k/v only, none on o (Qwen2's attention).
    qkv_bias: bool = False
    # RMSNorm over each head's dims of q and k, before RoPE (Qwen3's attention).
    qk_norm: bool = False

    def __post_init__(self) -> None:
        if not self.head_dim:
            object.__setattr__(self, "head_dim", self.dim // self.n_heads)

    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.partial_rotary_factor)


@dataclass(frozen=True)
class Shapes:
    """The shapes an artifact is built for. ``prefill_len`` is the longest prefill pass
    per row (generate/prefill.py); unwritten, it is ``default_prefill_len`` of the
    other two (255 for these defaults)."""

    max_seq_len: int = 256
    max_batch: int = 1
    prefill_len: int = 255


@dataclass(frozen=True)
class Bench:
    prompt: str = "Hello, my name is"
    prompt_ids: tuple[int, ...] = ()
    tokenizer: str | None = None
    max_new_tokens: int = 200
    batch_size: int = 1


@dataclass(frozen=True)
class Recipe:
    name: str
    family: str
    model: ModelConfig
    shapes: Shapes
    bench: Bench
    description: str = ""
    source: str = field(default="", compare=False)  # the file or folder it came from
    builtin: bool = field(default=False, compare=False)  # shipped with acache: not to edit
    # The checkpoint the recipe names (a folder recipe's own folder, or a TOML's
    # `weights`); api uses it when no weights are passed. Not a key factor itself:
    # the weights digest is.
    weights: Path | None = field(default=None, compare=False)

    def normalized(self) -> dict[str, Any]:
        """What of the recipe shapes an artifact (a key factor).

        The name, description and benchmark input are left out on purpose: two
        recipes with the same architecture and shapes share artifacts.
        """
        return {"family": self.family, "model": asdict(self.model), "shapes": asdict(self.shapes)}

    def check_fits(self, n_prompt: int, max_new_tokens: int, batch: int = 1) -> None:
        """Raise ShapeError when a request does not fit the built shapes."""
        src = self.source or self.name
        if Path(src).is_dir():  # a checkpoint folder: its shapes live in a saved TOML
            src = f"a TOML saved from `acache recipe {src}` (then pass that file)"
        elif self.builtin:  # the installed package's own file
            src = f"a copy saved from `acache recipe {self.name}` (then pass that file)"
        if n_prompt < 1:
            raise ShapeError("the prompt is empty: give at least one token id")
        if batch > self.shapes.max_batch:
            raise ShapeError(
                f"a batch of {batch} exceeds the artifact's max_batch {self.shapes.max_batch}; "
                f"build with --max-batch {batch} (max_batch=) or raise [shapes].max_batch in {src}"
            )
        total = n_prompt + max_new_tokens
        if total > self.shapes.max_seq_len:
            said = f"{n_prompt} prompt + {max_new_tokens} new tokens = {total} exceeds max_seq_len "
            ceiling, why = self.longest_context()
            if total > ceiling:  # no build holds it: say so, rather than a larger build
                raise ShapeError(
                    f"{said}{self.shapes.max_seq_len}, and the model takes at most {ceiling} "
                    f"positions ({why}): shorten the prompt or ask fewer new tokens"
                )
            raise ShapeError(
                f"{said}{self.shapes.max_seq_len}; build with --max-seq-len {total} or more "
                f"(up to {ceiling}; max_seq_len=) or raise [shapes].max_seq_len in {src}"
            )

    def longest_context(self) -> tuple[int, str]:
        """(the largest max_seq_len this model takes, the field that sets it)."""
        rs, max_pos = self.model.rope_scaling, self.model.max_position_embeddings
        if rs and rs["type"] == "longrope" and rs["original_max_position_embeddings"] < max_pos:
            return rs["original_max_position_embeddings"], (
                "model.rope_scaling.original_max_position_embeddings"
            )
        return max_pos, "model.max_position_embeddings"

    def with_shapes(
        self, *, max_seq_len: int | None = None, max_batch: int | None = None
    ) -> Recipe:
        """This recipe with the context length and batch chosen at build
        (``--max-seq-len``, ``--max-batch``).

        None keeps the recipe's own. The result is checked by the same rule as a
        recipe file's [shapes] (``shape_problem``). ``prefill_len`` is only the longest
        pass of a prompt: a recipe that takes the default for its shapes gets the
        default for the new ones (``default_prefill_len``); a written one is kept, but
        a context no longer than it takes shorter passes (``prefill_len_within``).
        """
        for name, value in (("max_seq_len", max_seq_len), ("max_batch", max_batch)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise ShapeError(f"{name} must be an integer, got {value!r}")
        shapes = self.shapes
        seq = shapes.max_seq_len if max_seq_len is None else max_seq_len
        batch = shapes.max_batch if max_batch is None else max_batch
        prefill = shapes.prefill_len
        if prefill == default_prefill_len(shapes.max_seq_len, shapes.max_batch):
            prefill = default_prefill_len(seq, batch)
        if min(seq, batch) > 0:  # else shape_problem says what is wrong, below
            prefill = prefill_len_within(prefill, seq)
        shapes = replace(shapes, max_seq_len=seq, max_batch=batch, prefill_len=prefill)
        if shapes == self.shapes:
            return self
        problem = shape_problem(self.model, shapes)
        if problem is not None:
            raise ShapeError(f"{problem[0]} {problem[1]} (recipe {self.name})")
        return replace(self, shapes=shapes)


# ----------------------------------------------------------------- shapes --


# A one-token prompt plus one new token: the shortest context that decodes at all.
MIN_MAX_SEQ_LEN = 2


# The tokens one prefill pass takes across the batch by default. A prompt that fits one
# pass attends causally through the flash kernel; a later pass reads the cache through
# a masked kernel that does every (query, key) product, so the whole context of the
# seeds' 4k models is one pass. The cost is the pass's fp32 logits (rows x tokens x
# vocab): 2 GiB at 4096 tokens of a 128k vocabulary.
PASS_TOKENS = 4096
# The shortest default pass per row: generate/prefill.py's CHUNK_ALIGN.
MIN_DEFAULT_PASS = 16


def default_prefill_len(max_seq_len: int, max_batch: int) -> int:
    """The longest prefill pass per row when a recipe does not say: PASS_TOKENS over the
    batch's rows, at least MIN_DEFAULT_PASS, within the context."""
    per_row = max(MIN_DEFAULT_PASS, PASS_TOKENS // max(max_batch, 1))
    return prefill_len_within(per_row, max(max_seq_len, 2))


def prefill_len_within(prefill_len: int, max_seq_len: int) -> int:
    """``prefill_len`` shrunk to fit a context of ``max_seq_len`` (>= MIN_MAX_SEQ_LEN).

    A full chunk must leave a position for decode: the steps are compiled with decode's
    example at position ``prefill_len``, which has to be a slot of the cache.
    """
    return max(1, min(prefill_len, max_seq_len - 1))


def shape_problem(model: ModelConfig, shapes: Shapes) -> tuple[str, str] | None:
    """(field, what is wrong) for shapes the model cannot be built for, else None.

    One rule for a recipe file and for a ``max_seq_len``/``max_batch`` override, so
    shapes that a TOML may not ask for cannot be reached from the command line either.
    """
    for k, v in asdict(shapes).items():
        if v <= 0:
            return k, f"must be positive, got {v}"
    if shapes.max_seq_len < MIN_MAX_SEQ_LEN:
        return "max_seq_len", (
            f"must be at least {MIN_MAX_SEQ_LEN} (a one-token prompt and one new token), "
            f"got {shapes.max_seq_len}"
        )
    if shapes.prefill_len >= shapes.max_seq_len:
        # Decode's first position follows a full chunk; it must be inside the cache.
        return "prefill_len", (
            f"({shapes.prefill_len}) must be below shapes.max_seq_len ({shapes.max_seq_len})"
        )
    max_pos = model.max_position_embeddings
    if shapes.max_seq_len > max_pos:
        # Plain RoPE was trained up to max_pos, and the scaled types (llama3, linear,
        # dynamic) already state their extended length there: nothing extrapolates past it.
        return (
            "max_seq_len",
            f"({shapes.max_seq_len}) exceeds model.max_position_embeddings ({max_pos})",
        )
    rs = model.rope_scaling
    if (
        rs
        and rs["type"] == "longrope"
        and shapes.max_seq_len > rs["original_max_position_embeddings"]
    ):
        # transformers switches every position to long_factor once a sequence passes
        # it: frequencies that change with the length, which a static KV cache cannot hold.
        return "max_seq_len", (
            f"({shapes.max_seq_len}) exceeds model.rope_scaling.original_max_position_embeddings "
            f"({rs['original_max_position_embeddings']}): longrope's long factors are not supported"
        )
    return None


# ------------------------------------------------------------- validation --


def _fail(src: str, fld: str, what: str) -> RecipeError:
    return RecipeError(f"{src}: field '{fld}' {what}")


_MODEL_INT_FIELDS = ("vocab_size", "dim", "n_layers", "n_heads", "n_kv_heads", "intermediate_size")


def _get(
    table: dict[str, Any], src: str, prefix: str, name: str, typ: Any, default: Any = ...
) -> Any:
    fld = f"{prefix}{name}"
    if name not in table:
        if default is ...:
            raise _fail(src, fld, "is missing")
        return default
    val = table[name]
    if typ is float and isinstance(val, int) and not isinstance(val, bool):
        val = int_to_float(val, lambda what: _fail(src, fld, what))
    ok = isinstance(val, typ) and not (typ in (int, float) and isinstance(val, bool))
    if not ok:
        tname = typ.__name__ if isinstance(typ, type) else "/".join(t.__name__ for t in typ)
        raise _fail(src, fld, f"must be {tname}, got {type(val).__name__} {val!r}")
    if typ is float and not math.isfinite(val):  # TOML (and json.loads) accept nan and inf
        raise _fail(src, fld, f"must be a finite number, got {val}")
    if typ is int and abs(val) > RECIPE_INT_MAX:  # a dim of 10**30 is a typo, not a model
        raise _fail(src, fld, f"must be at most {RECIPE_INT_MAX}, got {len(str(val))} digits")
    return val


def _positive(src: str, fld: str, val: int | float) -> None:
    if val <= 0:
        raise _fail(src, fld, f"must be positive, got {val}")


ROPE_SCALING_TYPES = ("llama3", "linear", "dynamic", "longrope")


def _factor_list(rs: dict[str, Any], src: str, name: str, n: int) -> list[float]:
    fld = f"model.rope_scaling.{name}"
    vals = _get(rs, src, "model.rope_scaling.", name, list)
    if len(vals) != n or not all(
        isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v <= RECIPE_INT_MAX
        for v in vals
    ):
        raise _fail(src, fld, f"must be {n} positive numbers (rotary_dim / 2), got {vals!r}")
    return [float(v) for v in vals]


def _rope_scaling(rs: dict[str, Any], src: str, max_pos: int, rotary_dim: int) -> dict[str, Any]:
    """The rope_scaling table, complete and in one spelling (so equal configs key equal)."""
    pre = "model.rope_scaling."
    kind = _get(rs, src, pre, "type", str)
    if kind not in ROPE_SCALING_TYPES:
        raise _fail(
            src, f"{pre}type", f"must be one of {', '.join(ROPE_SCALING_TYPES)}, got {kind!r}"
        )
    allowed = {
        "llama3": {"factor", "low_freq_factor", "high_freq_factor",
                   "original_max_position_embeddings"},
        "linear": {"factor"},
        "dynamic": {"factor"},
        "longrope": {"short_factor", "long_factor", "original_max_position_embeddings",
                     "attention_factor", "factor"},
    }[kind]  # fmt: skip
    for k in rs:
        if k != "type" and k not in allowed:
            raise _fail(src, f"{pre}{k}", f"is not a field of rope_scaling type {kind!r}")
    out: dict[str, Any] = {"type": kind}
    if kind in ("llama3", "linear", "dynamic"):
        out["factor"] = _get(rs, src, pre, "factor", float)
        _positive(src, f"{pre}factor", out["factor"])
    if kind in ("llama3", "longrope"):
        orig = _get(rs, src, pre, "original_max_position_embeddings", int, max_pos)
        _positive(src, f"{pre}original_max_position_embeddings", orig)
        out["original_max_position_embeddings"] = orig
    if kind == "llama3":
        for k in ("low_freq_factor", "high_freq_factor"):
            out[k] = _get(rs, src, pre, k, float)
            _positive(src, f"{pre}{k}", out[k])
        if out["high_freq_factor"] <= out["low_freq_factor"]:
            raise _fail(src, f"{pre}high_freq_factor", "must exceed low_freq_factor")
    if kind == "longrope":
        out["short_factor"] = _factor_list(rs, src, "short_factor", rotary_dim // 2)
        out["long_factor"] = _factor_list(rs, src, "long_factor", rotary_dim // 2)
        # transformers' default: the context extension's sqrt(1 + ln s / ln L) scale.
        factor = _get(rs, src, pre, "factor", float, max_pos / orig)
        _positive(src, f"{pre}factor", factor)
        default_att = 1.0 if factor <= 1 else math.sqrt(1 + math.log(factor) / math.log(orig))
        out["attention_factor"] = _get(rs, src, pre, "attention_factor", float, default_att)
        _positive(src, f"{pre}attention_factor", out["attention_factor"])
    return out


def _parse_model(m: dict[str, Any], src: str, family: str) -> ModelConfig:
    known_model = set(ModelConfig.__dataclass_fields__)
    for k in m:
        if k not in known_model:
            raise _fail(src, f"model.{k}", "is not a model field")
    ints = {k: _get(m, src, "model.", k, int) for k in _MODEL_INT_FIELDS}
    for k, v in ints.items():
        _positive(src, f"model.{k}", v)
    head_dim = _get(m, src, "model.", "head_dim", int, 0)
    if "head_dim" in m:
        _positive(src, "model.head_dim", head_dim)
    elif ints["dim"] % ints["n_heads"]:
        raise _fail(
            src, "model.n_heads", f"({ints['n_heads']}) must divide model.dim ({ints['dim']})"
        )
    head_dim = head_dim or ints["dim"] // ints["n_heads"]
    if ints["n_heads"] % ints["n_kv_heads"]:
        raise _fail(
            src,
            "model.n_kv_heads",
            f"({ints['n_kv_heads']}) must divide model.n_heads ({ints['n_heads']})",
        )
    norm_eps = _get(m, src, "model.", "norm_eps", float, 1e-5)
    _positive(src, "model.norm_eps", norm_eps)
    rope_theta = _get(m, src, "model.", "rope_theta", float, 10000.0)
    _positive(src, "model.rope_theta", rope_theta)
    max_pos = _get(m, src, "model.", "max_position_embeddings", int, 4096)
    _positive(src, "model.max_position_embeddings", max_pos)
    sliding = _get(m, src, "model.", "sliding_window", int, None)
    if sliding is not None:
        _positive(src, "model.sliding_window", sliding)
    prf = _get(m, src, "model.", "partial_rotary_factor", float, 1.0)
    if not 0 < prf <= 1:
        raise _fail(src, "model.partial_rotary_factor", f"must be in (0, 1], got {prf}")
    rotary_dim = int(head_dim * prf)
    if rotary_dim % 2 or rotary_dim == 0:
        raise _fail(
            src,
            "model.partial_rotary_factor",
            f"gives rotary dim {rotary_dim} for head_dim {head_dim}: it must be even and positive",
        )
    rope_scaling = _get(m, src, "model.", "rope_scaling", dict, None)
    if rope_scaling is not None:
        rope_scaling = _rope_scaling(rope_scaling, src, max_pos, rotary_dim)
    biased = family == "phi-2"  # phi-2 has biases everywhere
    # What the family's transformers model hard-codes is the default here.
    qkv_bias = _get(m, src, "model.", "qkv_bias", bool, family == "qwen2")
    qk_norm = _get(m, src, "model.", "qk_norm", bool, family == "qwen3")
    for name, on in (("qkv_bias", qkv_bias), ("qk_norm", qk_norm)):
        if on and family == "phi-2":
            raise _fail(src, f"model.{name}", "is true, which acache's phi-2 does not implement")
    return ModelConfig(
        **ints,
        norm_eps=norm_eps,
        rope_theta=rope_theta,
        max_position_embeddings=max_pos,
        rope_scaling=rope_scaling,
        sliding_window=sliding,
        partial_rotary_factor=prf,
        tie_embeddings=_get(m, src, "model.", "tie_embeddings", bool, False),
        head_dim=head_dim,
        attention_bias=_get(m, src, "model.", "attention_bias", bool, biased),
        mlp_bias=_get(m, src, "model.", "mlp_bias", bool, biased),
        qkv_bias=qkv_bias,
        qk_norm=qk_norm,
    )


def parse_recipe(data: dict[str, Any], src: str) -> Recipe:
    """Validate a recipe's TOML table; every error names the file and field."""
    known_top = {"name", "family", "description", "weights", "model", "shapes", "bench"}
    for k in data:
        if k not in known_top:
            raise _fail(src, k, f"is not a recipe field (expected one of {sorted(known_top)})")
    name = _get(data, src, "", "name", str)
    family = _get(data, src, "", "family", str)
    if family not in FAMILIES:
        raise _fail(src, "family", f"must be one of {', '.join(FAMILIES)}, got {family!r}")
    description = _get(data, src, "", "description", str, "")
    weights = _get(data, src, "", "weights", str, None)
    weights_path = None
    if weights is not None:
        weights_path = Path(weights).expanduser()
        if not weights_path.is_absolute():  # relative to the recipe file, not the cwd
            weights_path = Path(src).parent / weights_path
        if not weights_path.exists():
            raise _fail(src, "weights", f"names {weights_path}, which does not exist")
    model = _parse_model(_get(data, src, "", "model", dict), src, family)

    s = _get(data, src, "", "shapes", dict, {})
    for k in s:
        if k not in Shapes.__dataclass_fields__:
            raise _fail(src, f"shapes.{k}", "is not a shapes field")
    default = Shapes()
    max_seq_len = _get(s, src, "shapes.", "max_seq_len", int, default.max_seq_len)
    max_batch = _get(s, src, "shapes.", "max_batch", int, default.max_batch)
    # Unwritten, the default pass fits the context; written, it must.
    default_prefill = default_prefill_len(max_seq_len, max_batch)
    shapes = Shapes(
        max_seq_len=max_seq_len,
        max_batch=max_batch,
        prefill_len=_get(s, src, "shapes.", "prefill_len", int, default_prefill),
    )
    problem = shape_problem(model, shapes)
    if problem is not None:
        raise _fail(src, f"shapes.{problem[0]}", problem[1])

    b = _get(data, src, "", "bench", dict, {})
    for k in b:
        if k not in Bench.__dataclass_fields__:
            raise _fail(src, f"bench.{k}", "is not a bench field")
    ids = _get(b, src, "bench.", "prompt_ids", list, [])
    for i, t in enumerate(ids):
        if not isinstance(t, int) or isinstance(t, bool) or not 0 <= t < model.vocab_size:
            raise _fail(
                src,
                f"bench.prompt_ids[{i}]",
                f"must be a token id in [0, {model.vocab_size}), got {t!r}",
            )
    bench = Bench(
        prompt=_get(b, src, "bench.", "prompt", str, "Hello, my name is"),
        prompt_ids=tuple(ids),
        tokenizer=_get(b, src, "bench.", "tokenizer", str, None),
        max_new_tokens=_get(b, src, "bench.", "max_new_tokens", int, 200),
        batch_size=_get(b, src, "bench.", "batch_size", int, 1),
    )
    _positive(src, "bench.max_new_tokens", bench.max_new_tokens)
    _positive(src, "bench.batch_size", bench.batch_size)
    return Recipe(
        name=name,
        family=family,
        model=model,
        shapes=shapes,
        bench=bench,
        description=description,
        source=src,
        weights=weights_path,
    )
