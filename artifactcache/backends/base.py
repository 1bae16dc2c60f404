"""The two backend protocols, the Runner interface, and the backend registry.

Each backend is a folder (see backends/__init__.py) holding both of its paths:
``backend.py`` exposes ``BACKEND`` (a :class:`Backend`: LLM recipes, step functions
over a KV cache) and ``module.py`` exposes ``MODULE_BACKEND`` (a
:class:`ModuleBackend`: one ``forward`` of any nn.Module). :func:`get_backend` and
:func:`get_module_backend` import them lazily, and heavy imports (torch._inductor,
onnxruntime, tensorrt) happen inside the methods, so a missing optional dependency
never breaks the rest of the CLI: ``available()`` reports it instead.

Flow (see ``artifactcache/api/recipe.py``)::

    opts   = BuildChoices(device="cuda", dtype="bf16", mode="reduce-overhead")
    key    = compute_key(make_factors(..., options=b.factors(recipe, opts),
                                      toolchain=b.toolchain(opts), ...))
    entry, _ = store.get_or_build(key, factors, lambda workdir: b.build(ctx, workdir))
    runner = b.load(ctx, entry.path, entry.meta)

A backend that reads other entries declares them (``dependencies()`` returning
:class:`Dependency`); api/recipe.py opens them into ``ctx.deps`` before build/load.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from ..choices import BuildChoices
from ..code_factors import BACKEND_FOLDERS
from ..errors import BackendError, BackendUnavailable

if TYPE_CHECKING:
    import torch

    from ..config import Recipe
    from ..models import WeightsSpec
    from ..sources.module import ModuleSpec
    from ..store.entry import Entry

BACKEND_NAMES = ("eager", "inductor", "aoti", "ort", "trt")


@dataclass
class BuildContext:
    """Everything a backend needs to build or load one artifact."""

    recipe: Recipe
    opts: BuildChoices
    weights: WeightsSpec
    # The entries this backend's dependencies() declared, by name, opened by api/recipe.py
    # before build()/load(): an Entry, or None for an optional one that is absent.
    deps: dict[str, Entry | None] = field(default_factory=dict)
    dep_sources: dict[str, str] = field(default_factory=dict)  # name -> "local"/"built"/"pulled"
    # What build() hands to a dependency's refresh (e.g. the timing cache this build learned).
    produced: dict[str, Any] = field(default_factory=dict)
    progress: Any = None  # optional callable(str) for status lines
    # A directory of the cache where a build may keep small per-machine memos (the
    # compiler-probe verdicts); None outside a store. Set by api/recipe.py.
    memo_dir: Path | None = None
    # Phase timestamps (time.perf_counter()) a backend's load() records, read by
    # the measurement probe: "weights_ready" and "artifact_ready", plus any
    # backend-specific sub-parts ("cache_loaded", "compiled", ...).
    phases: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Dependency:
    """Another cache entry a backend reads; api/recipe.py keys it, opens or builds it, passes it in.

    A backend declares its dependencies (optional method ``dependencies(ctx, weights,
    for_load=...)``, ``weights`` the weights factor of the key) and never touches the
    store: api/recipe.py computes the key from ``factors``, builds it on a miss with
    ``build`` (or, when ``build`` is None, passes the entry only if it is present),
    puts the Entry in ``ctx.deps[name]``, and records in the dependent's manifest
    the keys it was built from (``meta["built_from"]``) and, through the store's
    ``record_dependency``, those it needs at load (the manifest's ``depends_on``, which
    gc and rm honour).
    """

    name: str
    factors: dict[str, Any]  # from keys.make_factors
    label: dict[str, Any]
    build: Callable[[Path], dict[str, Any]] | None = None  # workdir -> meta
    at_load: bool = False  # load() reads it too, so it must outlive the dependent
    # For an entry that accumulates across builds (the TensorRT timing cache): after the
    # dependent's build, api rewrites it under its lock from (current Entry or None,
    # ctx.produced[name], workdir) -> meta.
    refresh: Callable[[Entry | None, Any, Path], dict[str, Any]] | None = None


@runtime_checkable
class Runner(Protocol):
    """A ready-to-run model loaded from a verified entry."""

    def logits(self, token_ids: list[int]) -> torch.Tensor:
        """Full forward over the sequence from an empty KV cache: [T, vocab] fp32 on CPU."""
        ...

    def generate(
        self,
        prompt_ids: list[int],
        max_new_tokens: int,
        *,
        eos_token_ids: list[int] | tuple[int, ...] | None = None,
        temperature: float = 0.0,
        top_k: int | None = None,
        top_p: float | None = None,
        seed: int | None = None,
    ) -> list[int]:
        """Up to max_new_tokens new ids, ending with the first EOS id if one is made.

        ``eos_token_ids=None``: the checkpoint's EOS ids; ``()``: no early stop.
        Greedy (temperature 0) unless asked; see artifactcache/generate/sampling.py.
        """
        ...

    def generate_batch(
        self,
        prompts: list[list[int]],
        max_new_tokens: int,
        *,
        eos_token_ids: list[int] | tuple[int, ...] | None = None,
        temperature: float = 0.0,
        top_k: int | None = None,
        top_p: float | None = None,
        seed: int | Sequence[int] | None = None,
    ) -> list[list[int]]:
        """generate() for up to the artifact's max_batch prompts of any lengths at once:
        one list of new ids per prompt, each row stopping at its own EOS. Sampling: row
        ``i`` draws as its prompt alone would with seed ``seed + i`` (``seed`` an int) or
        ``seed[i]`` (one int per prompt)."""
        ...


class Backend(Protocol):
    name: str
    # True when the artifact does not contain the weights (weight-stripped AOTI
    # packages, refittable engines): the entry is then keyed by architecture.
    weights_external: bool

    def available(self, opts: BuildChoices) -> tuple[bool, str]:
        """(ok, reason): reason says what is missing and how to install it."""
        ...

    def check_options(self, opts: BuildChoices) -> None:
        """Raise BackendError for options this backend does not support."""
        ...

    def check_recipe(self, recipe: Recipe, opts: BuildChoices) -> None:
        """Raise BackendError for options this recipe cannot take here (after
        check_options): the checks that need the model, before anything is spawned,
        built or keyed."""
        ...

    def factors(self, recipe: Recipe, opts: BuildChoices) -> dict[str, Any]:
        """Backend options that shape the artifact (goes under backend.options)."""
        ...

    def toolchain(self, opts: BuildChoices) -> dict[str, Any]:
        """Versions that shape the artifact (see keys.toolchain_fingerprint)."""
        ...

    def build(self, ctx: BuildContext, workdir: Path) -> dict[str, Any]:
        """Write the artifact's files into workdir; return metadata for the manifest."""
        ...

    def load(self, ctx: BuildContext, entry_dir: Path, meta: dict[str, Any]) -> Runner:
        """A Runner from a verified entry's files (never mutating them)."""
        ...


class ModuleBackend(Protocol):
    name: str
    # True when the artifact holds the weights: the key then covers their digest.
    weights_in_artifact: bool

    def check_options(self, opts: BuildChoices) -> None:
        """One-line BackendError for options this backend does not take for modules."""
        ...

    def factors(self, spec: ModuleSpec, opts: BuildChoices) -> dict[str, Any]:
        """What, besides the module fingerprint, shapes the artifact (backend.options)."""
        ...

    def build(
        self, spec: ModuleSpec, opts: BuildChoices, workdir: Path, memo_dir: Path | None = None
    ) -> dict[str, Any]:
        """Write the artifact into workdir; return the manifest's meta. ``memo_dir``: where
        the store keeps small per-machine memos (compiler and ISA probe verdicts)."""
        ...

    def load(
        self, spec: ModuleSpec, opts: BuildChoices, entry_dir: Path, meta: dict[str, Any],
        phases: dict[str, float],
    ) -> Callable[..., Any]:  # fmt: skip
        """A callable with the module's outputs, from a verified entry; stamps phases.

        May raise StaleArtifact (an intact entry that cannot run here): api.compile
        then rebuilds it once.
        """
        ...

    # Optional: sibling_options(opts) -> BuildChoices, the options the LLM sibling's
    # available() and toolchain() are asked with when they differ from the module's
    # (trt: its onnx mode, whatever mode the module path was given).


def _folder(name: str) -> str:
    if name not in BACKEND_NAMES:
        raise BackendError(f"unknown backend {name!r}: choose one of {', '.join(BACKEND_NAMES)}")
    return f"{__package__}.{BACKEND_FOLDERS[name]}"


def get_backend(name: str) -> Backend:
    """The LLM-recipe Backend of ``name`` (``backends/<folder>/backend.py``)."""
    try:
        module = importlib.import_module(_folder(name) + ".backend")
    except ImportError as e:  # only the backend's own module missing: a packaging bug
        raise BackendUnavailable(f"backend {name!r} could not be imported ({e})") from None
    return module.BACKEND


def get_module_backend(name: str) -> ModuleBackend:
    """The nn.Module path of ``name`` (``backends/<folder>/module.py``)."""
    return importlib.import_module(_folder(name) + ".module").MODULE_BACKEND


def require_available(backend: Backend, opts: BuildChoices) -> None:
    ok, reason = backend.available(opts)
    if not ok:
        raise BackendUnavailable(f"backend {backend.name!r} is unavailable: {reason}")
