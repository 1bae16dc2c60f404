"""The nn.Module path: any module through a backend, keyed, built once, loaded from the cache.

It joins sources/module.py (the module's source and fingerprint) with a module backend
(``backends/<folder>/module.py``), the keys and the store, as recipe.py does for
recipes. The LLM Backend of the same name supplies what both
share: availability and toolchain.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..backends.base import get_backend, require_available
from ..choices import BuildChoices
from ..devices import check_device
from ..errors import StaleArtifact
from ..keys import hardware_fingerprint, make_factors
from ..store.keyformat import compute_key
from .results import BuildResult, KeyInfo, resolve_store

if TYPE_CHECKING:
    from ..store.entry import Entry
    from ..store.protocol import Store


def spec_of(model: str, choices: BuildChoices, *, batch: int | None = None) -> Any:
    """The ModuleSpec a model spec (``pkg.mod:factory``) and the choices describe: its
    inputs, device, dtype and seed; a choice only a recipe takes is one line."""
    from ..sources.module import spec_from_cli

    choices.check_scope("module")
    return spec_from_cli(model, list(choices.inputs) or None, device=choices.device,
                         dtype=choices.dtype, seed=choices.seed, batch=batch)  # fmt: skip


def module_choices(backend: str, spec: Any, options: dict[str, Any] | None) -> BuildChoices:
    opts = dict(options or {})
    mode = opts.pop("mode", None)
    return BuildChoices(device=spec.device, dtype=spec.dtype, mode=mode, extra=opts)


def check_module_choices(backend: str, opts: BuildChoices) -> tuple[Any, Any, BuildChoices]:
    """(module backend, backend, the options its sibling recipe backend takes), once the
    options, the backend's availability and the device are checked: one line each."""
    from ..backends.base import get_module_backend

    mb = get_module_backend(backend)
    b = get_backend(backend)
    check_device(opts.device, present=False)
    mb.check_options(opts)
    sibling = mb.sibling_options(opts) if hasattr(mb, "sibling_options") else opts
    require_available(b, sibling)
    check_device(opts.device)
    return mb, b, sibling


def module_key_for(backend: str, spec: Any, opts: BuildChoices) -> tuple[Any, KeyInfo]:
    """(module backend, key) for a ModuleSpec; checks options and availability first."""
    from ..sources.module import state_digest

    mb, b, sibling = check_module_choices(backend, opts)
    factors = make_factors(
        recipe=spec.fingerprint(),
        weights=state_digest(spec.module) if mb.weights_in_artifact else "external",
        backend=backend,
        options={"source": "module", **mb.factors(spec, opts)},
        toolchain=b.toolchain(sibling),
        hardware=hardware_fingerprint(opts.device, with_driver=backend == "trt"),
    )
    key = compute_key(factors)
    return mb, KeyInfo(key, factors, key, None if mb.weights_in_artifact else key)


def compile_with_result(
    spec: Any,
    backend: str,
    *,
    options: dict[str, Any] | None = None,
    build_on_miss: bool = True,
    force: bool = False,
    store: Store | None = None,
    cache_dir: str | Path | None = None,
    allow_shared_root: bool = False,
    phases: dict[str, float] | None = None,
) -> tuple[BuildResult, Any]:
    """compile() from a ModuleSpec, plus how the entry was found (the CLI and probe use it)."""
    from ..backends.shared.any_module import CompiledModule

    t0 = time.perf_counter()
    phases = phases if phases is not None else {}
    opts = module_choices(backend, spec, options)
    mb, info = module_key_for(backend, spec, opts)
    st = resolve_store(store, cache_dir, allow_shared_root)
    label = {
        "recipe": spec.label(),
        "backend": backend,
        "device": opts.device,
        "dtype": opts.dtype,
        "mode": opts.mode,
        "weights": "inside" if mb.weights_in_artifact else "external",
        "inputs": [s.describe() for s in spec.inputs],
    }

    def get_or_build(force: bool) -> tuple[Entry, str]:
        return st.get_or_build(
            info.key, info.factors, lambda workdir: mb.build(spec, opts, workdir, st.base),
            force=force, label=label,
        )  # fmt: skip

    def found(entry: Entry, source: str) -> BuildResult:
        phases["entry_ready"] = time.perf_counter()
        return BuildResult(
            key=info.key, built=source == "built", seconds=time.perf_counter() - t0,
            bytes=entry.size, entry=entry, source=source,
        )  # fmt: skip

    result = found(*(get_or_build(force) if build_on_miss else (st.open(info.key), "local")))
    try:
        fn = mb.load(spec, opts, result.entry.path, result.entry.meta, phases)
    except StaleArtifact:
        if not build_on_miss:
            raise
        # The entry is intact but cannot run here (an engine from another TensorRT): a
        # miss, rebuilt once in place, as load() does for recipes.
        result = found(*get_or_build(True))
        fn = mb.load(spec, opts, result.entry.path, result.entry.meta, phases)
    compiled = CompiledModule(fn, spec, backend=backend, key=info.key, source=result.source)
    return result, compiled


def compile(
    model: Any,
    example_inputs: Any,
    *,
    backend: str,
    device: str | None = None,
    dtype: str | None = None,
    dynamic_shapes: Any = None,
    options: dict[str, Any] | None = None,
    name: str | None = None,
    version: str | None = None,
    build_on_miss: bool = True,
    force: bool = False,
    cache_dir: str | Path | None = None,
    allow_shared_root: bool = False,
    store: Store | None = None,
) -> Any:
    """Any nn.Module through a backend: built on a miss, loaded from the cache on a hit.

    Returns a callable with the outputs of ``model(*example_inputs)`` (within the
    backend's tolerance, docs/modules.md). ``device``/``dtype`` move and cast the
    module in place, as ``Module.to`` does; float example inputs follow. Give
    ``dynamic_shapes`` as one entry per input, None or ``{dim: (min, max)}`` (or a
    ``torch.export.Dim``). ``options`` holds ``mode`` and the backend's extra options.
    ``name``/``version`` are key factors of your own: change ``version`` when
    something the fingerprint cannot see changes (docs/modules.md lists what).
    """
    from ..sources.module import make_spec

    spec = make_spec(
        model, example_inputs, device=device, dtype=dtype, dynamic_shapes=dynamic_shapes,
        name=name, version=version,
    )  # fmt: skip
    return compile_with_result(
        spec, backend, options=options, build_on_miss=build_on_miss, force=force, store=store,
        cache_dir=cache_dir, allow_shared_root=allow_shared_root,
    )[1]  # fmt: skip
