"""BuildChoices: everything a user chooses about an artifact, besides the model and backend.

One frozen dataclass carried whole: the CLI builds it (each field declares its own flag
and help, cli/choices.py turns them into options for every command that builds or
measures), the API keys and builds from it, the backends read it as ``ctx.opts``, and
the measurement probe receives it as JSON across the process boundary. A new choice is
a field here plus the code that uses it.

Torch-free and typer-free: the store, the CLI and the probe's parent import it cheaply.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .devices import DEVICE_HELP
from .dtypes import DTYPE_HELP, canonical_dtype
from .errors import AcacheError

# Which models a choice applies to: "any", "recipe" (acache's LLM path: recipes, TOML,
# checkpoint folders) or "module" (a model spec, pkg.mod:factory).
ANY, RECIPE, MODULE = "any", "recipe", "module"


def _choice(default: Any = None, *, flag: str, help: str, scope: str = ANY,
            refusal: str = "", cli: str = "value", **kw: Any) -> Any:  # fmt: skip
    """A field with its command-line flag, help and scope.

    ``cli`` says how the flag parses: ``value`` (one typed value), ``path``,
    ``key=value`` (repeatable, into a dict) or ``list`` (repeatable, into a tuple).
    ``refusal`` is the one-line error when the choice is given for a model outside
    its scope.
    """
    meta = {"flag": flag, "help": help, "scope": scope, "refusal": refusal, "cli": cli}
    if "default_factory" in kw:
        return field(default_factory=kw["default_factory"], metadata=meta)
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class BuildChoices:
    """What the user chose, besides the model and the backend. Every field is a key factor
    where it shapes the artifact (the backend's ``factors`` say which)."""

    device: str = _choice("cpu", flag="--device", help=f"{DEVICE_HELP}.")
    dtype: str = _choice("fp32", flag="--dtype", help=f"{DTYPE_HELP}.")
    # backend-specific (inductor: default | reduce-overhead | max-autotune; trt: onnx | llm)
    mode: str | None = _choice(
        flag="--mode", help="Backend mode (inductor: default | reduce-overhead | max-autotune)."
    )
    extra: Mapping[str, Any] = _choice(
        flag="--extra", cli="key=value", default_factory=dict,
        help="Backend option KEY=VALUE, repeatable (inductor: layer_regions=0, "
        "coordinate_descent_tuning=0; aoti: wrapper_opt=O0; ort: opset=18, "
        "exporter=torchscript; trt: opt_level=3, workspace_mb=4096, typing=weak, "
        "allow_host_code=true). Key factors.",
    )  # fmt: skip
    weights: str | None = _choice(
        flag="--weights", cli="path", scope=RECIPE,
        help="HF checkpoint folder or .safetensors file (default: seeded random weights).",
        refusal="--weights is for a recipe; a model spec's factory makes its own weights",
    )  # fmt: skip
    seed: int = _choice(0, flag="--seed", help="Seed for random weights.")
    max_seq_len: int | None = _choice(
        flag="--max-seq-len", scope=RECIPE,
        help="Context length to build for: prompt + new tokens must fit; the static KV cache "
        "holds this many positions (default: the recipe's [shapes].max_seq_len). A key factor.",
        refusal="--max-seq-len is for a recipe (an LLM's context), not a model spec",
    )  # fmt: skip
    quant: str | None = _choice(
        flag="--quant", scope=RECIPE,
        help="Weight-only quantization (eager, inductor, aoti): int8wo (int8 weights, a "
        "scale per output channel) or int4wo (4-bit, a scale and zero per group of up to 128 "
        "weights; bf16 on CUDA, for batches of up to 4). A key factor.",
        refusal="--quant is for a recipe (acache's LLM), not a model spec",
    )  # fmt: skip
    max_batch: int | None = _choice(
        flag="--max-batch", scope=RECIPE,
        help="Rows the artifact's steps run: the most prompts one batch takes; a smaller "
        "batch pads rows (default: the recipe's [shapes].max_batch). A key factor.",
        refusal="--max-batch is for a recipe (an LLM's batch rows); a model spec's batch is "
        "dimension 0 of its --input shapes",
    )  # fmt: skip
    tag: str | None = _choice(
        flag="--tag", scope=RECIPE,
        help="A key factor of your own: change it when something the key cannot see changed "
        "(a patched toolchain, a variable a kernel reads); other tags' entries stay.",
        refusal="--tag is for a recipe; a model spec keys on compile(..., version=)",
    )  # fmt: skip
    inputs: tuple[str, ...] = _choice(
        flag="--input", cli="list", scope=MODULE, default_factory=tuple,
        help="For a model spec (pkg.mod:factory): an input SHAPE[:DTYPE[:HIGH]], e.g. "
        "1x3x224x224 or 1x128:int64:30522 (repeatable; default: the factory's inputs).",
        refusal="--input is for a model spec (pkg.mod:factory), not for a recipe",
    )  # fmt: skip

    def __post_init__(self) -> None:
        # Normalized once, so equal choices compare, pickle and serialize equal.
        object.__setattr__(self, "extra", dict(self.extra or {}))
        object.__setattr__(self, "inputs", tuple(self.inputs or ()))
        object.__setattr__(self, "dtype", canonical_dtype(self.dtype))
        if self.weights is not None:
            object.__setattr__(self, "weights", str(self.weights))

    @classmethod
    def of(cls, **given: Any) -> BuildChoices:
        """From keyword arguments, with a one-line error naming an unknown one."""
        unknown = sorted(set(given) - set(NAMES))
        if unknown:
            raise AcacheError(
                f"unknown build choice(s) {', '.join(unknown)}: choose from {', '.join(NAMES)}"
            )
        return cls(**given)

    def replace(self, **changes: Any) -> BuildChoices:
        return dataclasses.replace(self, **changes)

    def given(self) -> dict[str, Any]:
        """The choices that differ from their defaults."""
        default = BuildChoices()
        return {n: getattr(self, n) for n in NAMES if getattr(self, n) != getattr(default, n)}

    def check_scope(self, kind: str) -> None:
        """One-line AcacheError for a choice that means nothing for this kind of model."""
        for f in dataclasses.fields(self):
            scope = f.metadata["scope"]
            if scope in (ANY, kind) or getattr(self, f.name) == _default(f):
                continue
            raise AcacheError(f.metadata["refusal"])

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self) | {"inputs": list(self.inputs)},
                          sort_keys=True)  # fmt: skip

    @classmethod
    def from_json(cls, text: str) -> BuildChoices:
        data = json.loads(text)
        if not isinstance(data, dict):
            raise AcacheError("build choices must be a JSON object")
        return cls.of(**data)


def _default(f: dataclasses.Field) -> Any:
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return f.default


NAMES = tuple(f.name for f in dataclasses.fields(BuildChoices))
