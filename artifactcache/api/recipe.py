"""The recipe path: recipe + backend + choices -> key -> cached artifact -> Runner.

With module.py (the same for any nn.Module) this is the only code that joins the
store, the keys and the backends. The store never sees torch; backends never see the
store: a backend that reads another entry (the ONNX export, the TensorRT timing
cache) declares it as a ``Dependency`` and this module keys it, opens or builds it,
and hands it over in ``ctx.deps`` (see ``_open_dependencies``, the one place
dependencies are known).
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import settings
from ..backends.base import (
    Backend,
    BuildContext,
    Dependency,
    Runner,
    get_backend,
    require_available,
)
from ..backends.shared.build_plan import check_build_settings
from ..choices import BuildChoices
from ..config import Recipe
from ..devices import check_device
from ..errors import ArgumentError, ShapeError, StaleArtifact, WeightsError
from ..keys import (
    architecture_factors,
    hardware_fingerprint,
    make_factors,
    weights_digest,
)
from ..recipes import load_recipe
from ..store.keyformat import compute_key
from .results import BuildResult, KeyInfo, resolve_store

if TYPE_CHECKING:
    from ..store.entry import Entry
    from ..store.protocol import Store


def _weights_spec(weights: str | Path | None, seed: int):
    from ..limits import check_seed
    from ..models import WeightsSpec

    check_seed(seed, "seed")
    return WeightsSpec(Path(weights) if weights is not None else None, seed)


def choices_of(choices: BuildChoices | None, given: dict[str, Any]) -> BuildChoices:
    """``choices`` with the keyword choices ``given`` on top (unknown names: one line)."""
    if choices is not None and not isinstance(choices, BuildChoices):
        # load("tiny-llama", "eager", "cpu"): the third place is choices, not device.
        raise ArgumentError(
            f"choices must be a BuildChoices, got {type(choices).__name__} {choices!r}: "
            "pass the build choices by name, e.g. device='cpu'"
        )
    base = choices if choices is not None else BuildChoices()
    if given:
        BuildChoices.of(**given)  # unknown names: one line
    return base.replace(**given) if given else base


def make_context(
    recipe: str | Path | Recipe,
    backend: str,
    choices: BuildChoices | None = None,
    *,
    check_memory: bool = True,
    check_checkpoint: bool = False,
    **given: Any,
) -> tuple[Backend, BuildContext]:
    """Validate everything the user chose, before anything is written.

    Touches no store: a caller that opens one (the CLI) calls this first, so a bad
    argument leaves the cache as it was. ``recipe`` may be a checkpoint folder; its
    weights are then the default. Weights whose config.json disagrees with the recipe
    are refused (sources/hf.py). ``max_seq_len`` and ``max_batch`` replace the recipe's
    context length and batch rows (key factors, as every shape is); so is ``quant``,
    weight-only quantization (backends/shared/model_options.py). With ``check_memory``, weights
    plus the KV cache must fit the device's free memory (sizing.py); computing a key
    skips that. With ``check_checkpoint``, a checkpoint's tensors are checked against the
    model from their headers (models.check_weights), as the load checks them again: the
    CLI asks for it, so that a mismatched checkpoint is refused before the cache is
    opened; a deployment's load skips the duplicate. Choices are a BuildChoices, or
    keywords of its fields.
    """
    settings.check_load_settings()  # read only at load, maybe after a long build
    check_build_settings()  # read inside a build, once it holds the key's lock
    opts = choices_of(choices, given)
    opts.check_scope("recipe")
    rec = recipe if isinstance(recipe, Recipe) else load_recipe(recipe)
    rec = rec.with_shapes(max_seq_len=opts.max_seq_len, max_batch=opts.max_batch)
    weights = opts.weights if opts.weights is not None else rec.weights
    b = get_backend(backend)
    if weights is not None and not Path(weights).exists():
        raise WeightsError(f"weights not found: {weights} (pass a safetensors file or HF folder)")
    if weights is not None:
        from ..sources.hf import check_weights_agree

        check_weights_agree(rec, Path(weights))
    check_device(opts.device, present=False)  # a typo is reported as a typo
    b.check_options(opts)
    b.check_recipe(rec, opts)
    if check_checkpoint and weights is not None:  # the dtype is known good by now
        from ..models import check_weights

        check_weights(rec, Path(weights), opts.dtype)
    require_available(b, opts)  # "not installed" is more useful than "no GPU": say it first
    check_device(opts.device)
    if check_memory:
        from ..sizing import check_fits_memory

        check_fits_memory(rec, opts.dtype, opts.device)
    return b, BuildContext(recipe=rec, opts=opts, weights=_weights_spec(weights, opts.seed))


def check_generation(recipe: Recipe, prompt_ids: Sequence[int], max_new_tokens: int) -> None:
    """What Runner.generate() would refuse, checked before an entry is built or loaded."""
    if max_new_tokens < 1:
        raise ShapeError(f"max_new_tokens (--new-tokens) must be at least 1, got {max_new_tokens}")
    vocab = recipe.model.vocab_size
    for t in prompt_ids:
        if not 0 <= t < vocab:
            raise ShapeError(f"token id {t} is outside the vocabulary [0, {vocab})")
    recipe.check_fits(len(prompt_ids), max_new_tokens)


def weights_factor(ctx: BuildContext, memo_dir: Path | None = None) -> str:
    """The key's weights factor: the checkpoint's digest (memoized), or random:<seed>."""
    w = ctx.weights
    return weights_digest(w.path, memo_dir=memo_dir) if w.path is not None else f"random:{w.seed}"


def key_for(b: Backend, ctx: BuildContext, memo_dir: Path | None = None) -> KeyInfo:
    wfactor = weights_factor(ctx, memo_dir)
    factors = make_factors(
        recipe=ctx.recipe.normalized(),
        weights=wfactor,
        backend=b.name,
        options=b.factors(ctx.recipe, ctx.opts),
        toolchain=b.toolchain(ctx.opts),
        hardware=hardware_fingerprint(ctx.opts.device, with_driver=b.name == "trt"),
    )
    if ctx.opts.tag is not None:  # absent unless given: untagged keys stay as they were
        factors["tag"] = ctx.opts.tag
    full = compute_key(factors)
    if b.weights_external:
        arch = architecture_factors(factors)
        return KeyInfo(compute_key(arch), arch, full, compute_key(arch))
    return KeyInfo(full, factors, full, None)


def open_dependency(
    dep: Dependency, store: Store, *, build_on_miss: bool = True
) -> tuple[Entry | None, str]:
    """(Entry, source) of one dependency; (None, "absent") for an optional one not there."""
    key = compute_key(dep.factors)
    if dep.build is None:
        entry = store.get(key)
        return entry, "local" if entry is not None else "absent"
    if build_on_miss:
        return store.get_or_build(key, dep.factors, dep.build, label=dep.label)
    return store.open(key), "local"  # raises KeyLookupError / IntegrityError


def refresh_dependency(dep: Dependency, store: Store, produced: Any) -> None:
    """Rewrite an accumulating dependency from its current files and what a build produced.

    Under the entry's lock (get_or_build), so concurrent builds merge one after
    another instead of overwriting each other.
    """
    assert dep.refresh is not None
    key = compute_key(dep.factors)
    refresh = dep.refresh

    def rebuild(workdir: Path) -> dict[str, Any]:
        return refresh(store.get(key), produced, workdir)

    store.get_or_build(key, dep.factors, rebuild, force=True, label=dep.label)


def _declared(b: Backend, ctx: BuildContext, store: Store, *, for_load: bool) -> list[Dependency]:
    declare = getattr(b, "dependencies", None)  # optional: most backends read no other entry
    if declare is None:
        return []
    deps = declare(ctx, weights_factor(ctx, store.base), for_load=for_load)
    return [d for d in deps if d.at_load] if for_load else list(deps)


def _open_dependencies(
    b: Backend, ctx: BuildContext, store: Store, *, for_load: bool, build_on_miss: bool = True
) -> list[Dependency]:
    """Open (building on a miss) what the backend reads, into ctx.deps; the declared list."""
    deps = _declared(b, ctx, store, for_load=for_load)
    for dep in deps:
        entry, source = open_dependency(dep, store, build_on_miss=build_on_miss)
        ctx.deps[dep.name], ctx.dep_sources[dep.name] = entry, source
    return deps


def _build_in(
    b: Backend, ctx: BuildContext, info: KeyInfo, store: Store, force: bool
) -> tuple[Entry, str]:
    label = {
        "recipe": ctx.recipe.name,
        "backend": b.name,
        "device": ctx.opts.device,
        "dtype": ctx.opts.dtype,
        "mode": ctx.opts.mode,
        "max_seq_len": ctx.recipe.shapes.max_seq_len,
        "max_batch": ctx.recipe.shapes.max_batch,
        "weights": ctx.weights.describe(),
        "arch_key": info.arch_key,
    }

    def build(workdir: Path) -> dict[str, Any]:
        # Inside the entry's lock, so a hit never opens (or rebuilds) its dependencies.
        deps = _open_dependencies(b, ctx, store, for_load=False)
        meta = b.build(ctx, workdir)
        for dep in deps:
            if dep.refresh is not None and dep.name in ctx.produced:
                refresh_dependency(dep, store, ctx.produced.pop(dep.name))
        if deps:
            meta["built_from"] = {d.name: compute_key(d.factors) for d in deps}
        for d in deps:
            if d.at_load:  # the manifest's depends_on: gc and rm keep the pair together
                store.record_dependency(compute_key(d.factors))
        return meta

    return store.get_or_build(info.key, info.factors, build, force=force, label=label)


def _lookup(
    recipe: str | Path | Recipe,
    backend: str,
    *,
    build_on_miss: bool,
    force: bool = False,
    store: Store | None = None,
    cache_dir: str | Path | None = None,
    allow_shared_root: bool = False,
    context: BuildContext | None = None,
    guard: contextlib.ExitStack | None = None,
    choices: BuildChoices,
) -> tuple[Backend, BuildContext, BuildResult, Store]:
    """The one path build() and load() share: validate, key, then hit or build once.

    Returns the backend, the context, the result and the store it used. With ``guard``,
    the key's shared reader lock is taken before verification and stays held until the
    caller closes the guard (after its load): gc and rm never delete an entry between
    its verification and its load.
    """
    t0 = time.perf_counter()
    b, ctx = make_context(recipe, backend, choices)
    if context is not None:  # the caller wants the phase stamps in its own object
        context.recipe, context.opts, context.weights = ctx.recipe, ctx.opts, ctx.weights
        ctx = context
    st = resolve_store(store, cache_dir, allow_shared_root)
    ctx.memo_dir = st.base
    info = key_for(b, ctx, memo_dir=ctx.memo_dir)
    if guard is not None:
        guard.enter_context(st.reading(info.key))
    if build_on_miss:
        entry, source = _build_in(b, ctx, info, st, force)
    else:
        entry, source = st.open(info.key), "local"  # raises KeyLookupError / IntegrityError
    result = BuildResult(
        key=info.key,
        built=source == "built",
        seconds=time.perf_counter() - t0,
        bytes=entry.size,
        entry=entry,
        source=source,
    )
    return b, ctx, result, st


def build(
    recipe: str | Path | Recipe,
    backend: str = "eager",
    choices: BuildChoices | None = None,
    *,
    force: bool = False,
    cache_dir: str | Path | None = None,
    allow_shared_root: bool = False,
    store: Store | None = None,
    **given: Any,
) -> BuildResult:
    """Build the artifact unless the cache has it; return where it is."""
    _, _, result, _ = _lookup(
        recipe, backend, build_on_miss=True, force=force, store=store, cache_dir=cache_dir,
        allow_shared_root=allow_shared_root, choices=choices_of(choices, given),
    )  # fmt: skip
    return result


def load_with_result(
    recipe: str | Path | Recipe,
    backend: str = "eager",
    choices: BuildChoices | None = None,
    *,
    build_on_miss: bool = True,
    cache_dir: str | Path | None = None,
    allow_shared_root: bool = False,
    store: Store | None = None,
    context: BuildContext | None = None,
    **given: Any,
) -> tuple[BuildResult, Runner]:
    """A Runner, plus how the entry was found (hit / built / pulled): one lookup, not two."""
    lookup = functools.partial(
        _lookup, recipe, backend, store=store, cache_dir=cache_dir,
        allow_shared_root=allow_shared_root, context=context,
        choices=choices_of(choices, given),
    )  # fmt: skip
    with contextlib.ExitStack() as guard:
        b, ctx, result, st = lookup(build_on_miss=build_on_miss, guard=guard)
        _open_dependencies(b, ctx, st, for_load=True, build_on_miss=build_on_miss)
        ctx.phases["entry_ready"] = time.perf_counter()
        try:
            runner = b.load(ctx, result.entry.path, result.entry.meta)
        except StaleArtifact as e:
            if not build_on_miss:
                raise
            # The entry is intact but cannot run here: a miss. Rebuild it once, in place.
            if ctx.progress:
                ctx.progress(f"rebuilding: {e}")
            b, ctx, result, st = lookup(build_on_miss=True, force=True, guard=guard)
            _open_dependencies(b, ctx, st, for_load=True)
            runner = b.load(ctx, result.entry.path, result.entry.meta)
    _attach_checkpoint(runner, ctx)
    return result, runner


def _attach_checkpoint(runner: Runner, ctx: BuildContext) -> None:
    """Give the runner its checkpoint folder: EOS ids and tokenizer, read when first used."""
    from ..generate import Checkpoint
    from ..sources.checkpoint import checkpoint_folder

    folder = checkpoint_folder(ctx.weights.path)
    if folder is not None:
        runner.checkpoint = Checkpoint(folder)  # type: ignore[attr-defined]
