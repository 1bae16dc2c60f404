"""build() and load(): recipe + backend + options -> key -> cached artifact -> Runner.

This is the only module that joins the store, the keys and the backends. The
store never sees torch; backends never see the store's layout.
"""

from __future__ import annotations

import contextlib
import functools
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .backends.base import (
    Backend,
    BuildContext,
    BuildOptions,
    Runner,
    get_backend,
    parse_device,
    require_available,
)
from .errors import BackendError, BackendUnavailable, StaleArtifact
from .keys import (
    architecture_factors,
    compute_key,
    hardware_fingerprint,
    make_factors,
    weights_digest,
)
from .recipes import Recipe, load_recipe


@dataclass(frozen=True)
class KeyInfo:
    key: str
    factors: dict[str, Any]
    full_key: str  # with the weights digest, even where the entry is keyed by architecture
    arch_key: str | None  # set when the backend keeps weights outside the artifact


@dataclass(frozen=True)
class BuildResult:
    key: str
    built: bool  # False: the entry was already there (a hit, or pulled from the remote)
    seconds: float  # wall time of this call
    bytes: int
    entry: Any  # store.local.Entry
    source: str = "local"  # "local" | "built" | "pulled"


def _weights_spec(weights: str | Path | None, seed: int):
    from .models import WeightsSpec

    return WeightsSpec(Path(weights) if weights is not None else None, seed)


def _resolve_store(store: Any, cache_dir: str | Path | None, allow_shared_root: bool) -> Any:
    if store is not None:
        return store
    from .store.local import LocalStore

    return LocalStore(cache_dir, allow_shared_root=allow_shared_root)


def check_device(device: str, *, present: bool = True) -> None:
    """cpu, cuda or cuda:N (and, with present=True, N a GPU torch can see)."""
    kind, index = parse_device(device)
    if present and kind == "cuda":
        import torch

        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if n == 0:
            raise BackendUnavailable(f"device {device!r}: torch sees no CUDA GPU; use --device cpu")
        if index is not None and index >= n:
            raise BackendError(f"device {device!r}: only {n} GPU(s) visible (cuda:0..cuda:{n - 1})")


def make_context(
    recipe: str | Path | Recipe,
    backend: str,
    *,
    device: str = "cpu",
    dtype: str = "fp32",
    mode: str | None = None,
    weights: str | Path | None = None,
    seed: int = 0,
    extra: dict[str, Any] | None = None,
) -> tuple[Backend, BuildContext]:
    """Validate everything the user chose, before anything is written."""
    rec = recipe if isinstance(recipe, Recipe) else load_recipe(recipe)
    b = get_backend(backend)
    opts = BuildOptions(device=device, dtype=dtype, mode=mode, extra=dict(extra or {}))
    check_device(device, present=False)  # a typo is reported as a typo
    b.check_options(opts)
    require_available(b, opts)  # "not installed" is more useful than "no GPU": say it first
    check_device(device)
    return b, BuildContext(recipe=rec, opts=opts, weights=_weights_spec(weights, seed))


def key_for(b: Backend, ctx: BuildContext, memo_dir: Path | None = None) -> KeyInfo:
    w = ctx.weights
    wfactor = (
        weights_digest(w.path, memo_dir=memo_dir) if w.path is not None else f"random:{w.seed}"
    )
    factors = make_factors(
        recipe=ctx.recipe.normalized(),
        weights=wfactor,
        backend=b.name,
        options=b.factors(ctx.recipe, ctx.opts),
        toolchain=b.toolchain(ctx.opts),
        hardware=hardware_fingerprint(ctx.opts.device, with_driver=b.name == "trt"),
    )
    full = compute_key(factors)
    if b.weights_external:
        arch = architecture_factors(factors)
        return KeyInfo(compute_key(arch), arch, full, compute_key(arch))
    return KeyInfo(full, factors, full, None)


def _build_in(b: Backend, ctx: BuildContext, info: KeyInfo, store: Any, force: bool):
    ctx.store = store
    label = {
        "recipe": ctx.recipe.name,
        "backend": b.name,
        "device": ctx.opts.device,
        "dtype": ctx.opts.dtype,
        "mode": ctx.opts.mode,
        "weights": ctx.weights.describe(),
        "arch_key": info.arch_key,
    }
    return store.get_or_build(
        info.key, info.factors, lambda workdir: b.build(ctx, workdir), force=force, label=label
    )


def _lookup(
    recipe: str | Path | Recipe,
    backend: str,
    *,
    build_on_miss: bool,
    force: bool = False,
    store: Any = None,
    cache_dir: str | Path | None = None,
    allow_shared_root: bool = False,
    context: BuildContext | None = None,
    guard: contextlib.ExitStack | None = None,
    **choices: Any,
) -> tuple[Backend, BuildContext, BuildResult]:
    """The one path build() and load() share: validate, key, then hit or build once.

    With ``guard``, the key's shared reader lock is taken before verification and
    stays held until the caller closes the guard (after its load): gc and rm
    never delete an entry between its verification and its load.
    """
    t0 = time.perf_counter()
    b, ctx = make_context(recipe, backend, **choices)
    if context is not None:  # the caller wants the phase stamps in its own object
        context.recipe, context.opts, context.weights = ctx.recipe, ctx.opts, ctx.weights
        ctx = context
    st = _resolve_store(store, cache_dir, allow_shared_root)
    ctx.store = st
    info = key_for(b, ctx, memo_dir=getattr(st, "base", None))
    if guard is not None and hasattr(st, "reading"):
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
    return b, ctx, result


def build(
    recipe: str | Path | Recipe,
    backend: str = "eager",
    *,
    device: str = "cpu",
    dtype: str = "fp32",
    mode: str | None = None,
    weights: str | Path | None = None,
    seed: int = 0,
    extra: dict[str, Any] | None = None,
    force: bool = False,
    cache_dir: str | Path | None = None,
    allow_shared_root: bool = False,
    store: Any = None,
) -> BuildResult:
    """Build the artifact unless the cache has it; return where it is."""
    _, _, result = _lookup(
        recipe, backend, build_on_miss=True, force=force, store=store, cache_dir=cache_dir,
        allow_shared_root=allow_shared_root, device=device, dtype=dtype, mode=mode,
        weights=weights, seed=seed, extra=extra,
    )  # fmt: skip
    return result


def load_with_result(
    recipe: str | Path | Recipe,
    backend: str = "eager",
    *,
    device: str = "cpu",
    dtype: str = "fp32",
    mode: str | None = None,
    weights: str | Path | None = None,
    seed: int = 0,
    extra: dict[str, Any] | None = None,
    build_on_miss: bool = True,
    cache_dir: str | Path | None = None,
    allow_shared_root: bool = False,
    store: Any = None,
    context: BuildContext | None = None,
) -> tuple[BuildResult, Runner]:
    """load(), plus how the entry was found (hit / built / pulled): one lookup, not two."""
    lookup = functools.partial(
        _lookup, recipe, backend, store=store, cache_dir=cache_dir,
        allow_shared_root=allow_shared_root, context=context, device=device, dtype=dtype,
        mode=mode, weights=weights, seed=seed, extra=extra,
    )  # fmt: skip
    with contextlib.ExitStack() as guard:
        b, ctx, result = lookup(build_on_miss=build_on_miss, guard=guard)
        ctx.phases["entry_ready"] = time.perf_counter()
        try:
            return result, b.load(ctx, result.entry.path, result.entry.meta)
        except StaleArtifact as e:
            if not build_on_miss:
                raise
            # The entry is intact but cannot run here: a miss. Rebuild it once, in place.
            if ctx.progress:
                ctx.progress(f"rebuilding: {e}")
            b, ctx, result = lookup(build_on_miss=True, force=True, guard=guard)
            return result, b.load(ctx, result.entry.path, result.entry.meta)


def load(
    recipe: str | Path | Recipe,
    backend: str = "eager",
    *,
    device: str = "cpu",
    dtype: str = "fp32",
    mode: str | None = None,
    weights: str | Path | None = None,
    seed: int = 0,
    extra: dict[str, Any] | None = None,
    build_on_miss: bool = True,
    cache_dir: str | Path | None = None,
    allow_shared_root: bool = False,
    store: Any = None,
    context: BuildContext | None = None,
) -> Runner:
    """A Runner from the cache, building on a miss (unless build_on_miss=False).

    Pass ``context`` to receive phase timestamps in ``context.phases``.
    """
    return load_with_result(
        recipe, backend, device=device, dtype=dtype, mode=mode, weights=weights, seed=seed,
        extra=extra, build_on_miss=build_on_miss, cache_dir=cache_dir,
        allow_shared_root=allow_shared_root, store=store, context=context,
    )[1]  # fmt: skip
