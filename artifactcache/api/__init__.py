"""The front door: ``build``, ``load`` and ``compile`` take any model acache knows.

A model is a built-in recipe name, a recipe TOML, a Hugging Face checkpoint folder or
a ``Recipe`` (the recipe path, recipe.py: step functions over a KV cache, a Runner
that generates), or a model spec ``pkg.mod:factory`` / ``file.py:factory`` (the
nn.Module path, module.py: one compiled ``forward``, a CompiledModule); ``compile``
also takes an ``nn.Module`` object with its example inputs. Each call dispatches once,
here; below it, neither path knows the other.

::

    api/
      __init__.py   the dispatch (this file)
      recipe.py     build/load for recipes: context, key, dependencies, store
      module.py     the same for any nn.Module
      results.py    BuildResult and KeyInfo, which both return
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..choices import BuildChoices
from ..errors import AcacheError
from .recipe import check_generation, choices_of, key_for, load_with_result, make_context
from .results import BuildResult, KeyInfo, resolve_store

if TYPE_CHECKING:
    from ..backends.base import BuildContext, Runner
    from ..config import Recipe
    from ..store.protocol import Store

__all__ = [
    "BuildChoices",
    "BuildResult",
    "KeyInfo",
    "build",
    "check_generation",
    "compile",
    "key_for",
    "load",
    "load_with_result",
    "make_context",
    "resolve_store",
]


def is_module_model(model: Any) -> bool:
    """True for a model spec (``pkg.mod:factory``); a recipe, TOML or folder is not one."""
    from ..sources.module import is_module_spec

    return isinstance(model, str) and is_module_spec(model)


def module_options(choices: BuildChoices) -> dict[str, Any]:
    """The nn.Module path's ``options``: the mode and the backend's extras."""
    return {**({"mode": choices.mode} if choices.mode else {}), **choices.extra}


def _module_result(
    model: str, backend: str, choices: BuildChoices, **where: Any
) -> tuple[BuildResult, Any]:
    from .module import compile_with_result, spec_of

    return compile_with_result(spec_of(model, choices), backend, options=module_options(choices),
                               **where)  # fmt: skip


def build(
    model: str | Path | Recipe,
    backend: str = "eager",
    choices: BuildChoices | None = None,
    *,
    force: bool = False,
    cache_dir: str | Path | None = None,
    allow_shared_root: bool = False,
    store: Store | None = None,
    **given: Any,
) -> BuildResult:
    """Build the artifact unless the cache has it; return where it is.

    Choices are a :class:`BuildChoices` or keywords of its fields (``device``,
    ``dtype``, ``mode``, ``extra``, ``weights``, ``seed``, ``max_seq_len``, ``quant``,
    ``max_batch`` for a recipe; ``inputs`` for a model spec), e.g.
    ``build("tiny-llama", "inductor", max_seq_len=256)``.
    """
    where = {"force": force, "store": store, "cache_dir": cache_dir,
             "allow_shared_root": allow_shared_root}  # fmt: skip
    chosen = choices_of(choices, given)
    if is_module_model(model):
        return _module_result(str(model), backend, chosen, **where)[0]
    from . import recipe

    return recipe.build(model, backend, chosen, **where)


def load(
    model: str | Path | Recipe,
    backend: str = "eager",
    choices: BuildChoices | None = None,
    *,
    build_on_miss: bool = True,
    cache_dir: str | Path | None = None,
    allow_shared_root: bool = False,
    store: Store | None = None,
    context: BuildContext | None = None,
    **given: Any,
) -> Runner | Any:
    """Ready to run from the cache, built on a miss (unless ``build_on_miss=False``).

    A recipe gives a Runner (``generate``, ``logits``); pass ``context`` to receive
    phase timestamps in ``context.phases``. A model spec gives a CompiledModule,
    called like the module. Choices as for :func:`build`.
    """
    where = {"store": store, "cache_dir": cache_dir, "allow_shared_root": allow_shared_root,
             "build_on_miss": build_on_miss}  # fmt: skip
    chosen = choices_of(choices, given)
    if is_module_model(model):
        return _module_result(str(model), backend, chosen, **where)[1]
    return load_with_result(model, backend, chosen, context=context, **where)[1]


def compile(
    model: Any,
    example_inputs: Any = None,
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

    ``model`` is an ``nn.Module`` with its ``example_inputs``, or a model spec
    (``pkg.mod:factory``, whose factory supplies them), or a recipe, TOML or checkpoint
    folder (then this is ``load``, and ``options`` holds ``mode`` and the extras).
    Returns a callable with the outputs of ``model(*example_inputs)`` (within the
    backend's tolerance, docs/modules.md). ``device``/``dtype`` move and cast the
    module in place, as ``Module.to`` does; float example inputs follow. Give
    ``dynamic_shapes`` as one entry per input, None or ``{dim: (min, max)}`` (or a
    ``torch.export.Dim``). ``name``/``version`` are key factors of your own: change
    ``version`` when something the fingerprint cannot see changes (docs/modules.md).
    """
    where = {"build_on_miss": build_on_miss, "cache_dir": cache_dir, "store": store,
             "allow_shared_root": allow_shared_root}  # fmt: skip
    if isinstance(model, (str, Path)) and not is_module_model(model):
        if example_inputs is not None or dynamic_shapes is not None:
            raise AcacheError("example inputs are for an nn.Module, not for a recipe")
        if name is not None or version is not None:
            raise AcacheError("name and version key an nn.Module; a recipe takes tag= (build)")
        opts = dict(options or {})
        chosen = BuildChoices(device=device or "cpu", dtype=dtype or "fp32",
                              mode=opts.pop("mode", None), extra=opts)  # fmt: skip
        if force:
            build(model, backend, chosen, force=True, store=store, cache_dir=cache_dir,
                  allow_shared_root=allow_shared_root)  # fmt: skip
        return load(model, backend, chosen, **where)
    from . import module

    if is_module_model(model):
        from ..sources.module import call_factory

        model, factory_inputs = call_factory(str(model))
        example_inputs = factory_inputs if example_inputs is None else example_inputs
    return module.compile(
        model, example_inputs, backend=backend, device=device, dtype=dtype,
        dynamic_shapes=dynamic_shapes, options=options, name=name, version=version,
        force=force, **where,
    )  # fmt: skip
