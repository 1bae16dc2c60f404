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

from ..errors import AcacheError
from .recipe import check_generation, key_for, load_with_result, make_context
from .results import BuildResult, KeyInfo, resolve_store

if TYPE_CHECKING:
    from ..backends.base import BuildContext, Runner
    from ..config import Recipe
    from ..store.protocol import Store

__all__ = [
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

# Choices that shape a recipe's artifact and mean nothing for a single forward.
_RECIPE_ONLY = ("weights", "max_seq_len", "quant", "max_batch")


def is_module_model(model: Any) -> bool:
    """True for a model spec (``pkg.mod:factory``); a recipe, TOML or folder is not one."""
    from ..module_spec import is_module_spec

    return isinstance(model, str) and is_module_spec(model)


def _module_options(mode: str | None, extra: dict[str, Any] | None) -> dict[str, Any]:
    return {**({"mode": mode} if mode else {}), **(extra or {})}


def _refuse_recipe_choices(model: str, **given: Any) -> None:
    bad = [name for name in _RECIPE_ONLY if given.get(name) is not None]
    if bad:
        raise AcacheError(f"{', '.join(bad)} shape a recipe, not a model spec like {model!r}")


def _module_result(
    model: str, backend: str, *, inputs: list[str] | None, device: str, dtype: str,
    mode: str | None, extra: dict[str, Any] | None, seed: int, **kw: Any,
) -> tuple[BuildResult, Any]:  # fmt: skip
    from ..module_spec import spec_from_cli
    from .module import compile_with_result

    spec = spec_from_cli(model, inputs, device=device, dtype=dtype, seed=seed)
    return compile_with_result(spec, backend, options=_module_options(mode, extra), **kw)


def build(
    model: str | Path | Recipe,
    backend: str = "eager",
    *,
    device: str = "cpu",
    dtype: str = "fp32",
    mode: str | None = None,
    weights: str | Path | None = None,
    seed: int = 0,
    extra: dict[str, Any] | None = None,
    max_seq_len: int | None = None,
    quant: str | None = None,
    max_batch: int | None = None,
    inputs: list[str] | None = None,
    force: bool = False,
    cache_dir: str | Path | None = None,
    allow_shared_root: bool = False,
    store: Store | None = None,
) -> BuildResult:
    """Build the artifact unless the cache has it; return where it is.

    ``max_seq_len``/``max_batch``: the context length and the rows every step runs
    (``generate_batch`` takes up to that many prompts); default: the recipe's.
    ``quant="int8wo"``: int8 weights (eager, inductor, aoti; docs/backends.md).
    ``inputs``: for a model spec, its input shapes as ``SHAPE[:DTYPE[:HIGH]]``
    (default: the factory's own example inputs).
    """
    where = {"force": force, "store": store, "cache_dir": cache_dir,
             "allow_shared_root": allow_shared_root}  # fmt: skip
    if is_module_model(model):
        _refuse_recipe_choices(str(model), weights=weights, max_seq_len=max_seq_len,
                               quant=quant, max_batch=max_batch)  # fmt: skip
        return _module_result(str(model), backend, inputs=inputs, device=device, dtype=dtype,
                              mode=mode, extra=extra, seed=seed, **where)[0]  # fmt: skip
    if inputs:
        raise AcacheError("inputs are for a model spec (pkg.mod:factory), not for a recipe")
    from . import recipe

    return recipe.build(
        model, backend, device=device, dtype=dtype, mode=mode, weights=weights, seed=seed,
        extra=extra, max_seq_len=max_seq_len, quant=quant, max_batch=max_batch, **where,
    )  # fmt: skip


def load(
    model: str | Path | Recipe,
    backend: str = "eager",
    *,
    device: str = "cpu",
    dtype: str = "fp32",
    mode: str | None = None,
    weights: str | Path | None = None,
    seed: int = 0,
    extra: dict[str, Any] | None = None,
    max_seq_len: int | None = None,
    quant: str | None = None,
    max_batch: int | None = None,
    inputs: list[str] | None = None,
    build_on_miss: bool = True,
    cache_dir: str | Path | None = None,
    allow_shared_root: bool = False,
    store: Store | None = None,
    context: BuildContext | None = None,
) -> Runner | Any:
    """Ready to run from the cache, built on a miss (unless ``build_on_miss=False``).

    A recipe gives a Runner (``generate``, ``logits``); pass ``context`` to receive
    phase timestamps in ``context.phases``. A model spec gives a CompiledModule,
    called like the module.
    """
    where = {"store": store, "cache_dir": cache_dir, "allow_shared_root": allow_shared_root,
             "build_on_miss": build_on_miss}  # fmt: skip
    if is_module_model(model):
        _refuse_recipe_choices(str(model), weights=weights, max_seq_len=max_seq_len,
                               quant=quant, max_batch=max_batch)  # fmt: skip
        return _module_result(str(model), backend, inputs=inputs, device=device, dtype=dtype,
                              mode=mode, extra=extra, seed=seed, **where)[1]  # fmt: skip
    if inputs:
        raise AcacheError("inputs are for a model spec (pkg.mod:factory), not for a recipe")
    return load_with_result(
        model, backend, device=device, dtype=dtype, mode=mode, weights=weights, seed=seed,
        extra=extra, max_seq_len=max_seq_len, max_batch=max_batch, quant=quant,
        context=context, **where,
    )[1]  # fmt: skip


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
        opts = dict(options or {})
        return load(model, backend, device=device or "cpu", dtype=dtype or "fp32",
                    mode=opts.pop("mode", None), extra=opts, **where)  # fmt: skip
    from . import module

    if is_module_model(model):
        from ..module_spec import call_factory

        model, factory_inputs = call_factory(str(model))
        example_inputs = factory_inputs if example_inputs is None else example_inputs
    return module.compile(
        model, example_inputs, backend=backend, device=device, dtype=dtype,
        dynamic_shapes=dynamic_shapes, options=options, name=name, version=version,
        force=force, **where,
    )  # fmt: skip
