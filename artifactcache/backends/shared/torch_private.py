"""The torch-private APIs acache depends on, in one place (with two exceptions, each
beside its only user: the patches of Inductor's autotuner, inductor/autotune_cache.py,
and of its CPU ISA probe, shared/cpu_isa.py).

torch changes these without notice. Each accessor tries the spellings of the torch
releases pyproject admits and, where none exists, raises :class:`TorchPrivateAPIMissing`:
one line that names the API and the torch version, instead of an AttributeError deep
in a build. When a new torch breaks one of these, this file is the whole fix.

All imports are inside the functions: importing this module costs nothing, and a warm
aoti load touches only ``torch._C._aoti`` (importing ``torch._inductor`` costs ~1.5 s).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import io
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ...errors import BackendError, BackendUnavailable


class TorchPrivateAPIMissing(BackendUnavailable):
    def __init__(self, api: str) -> None:
        import torch

        super().__init__(
            f"torch {torch.__version__} no longer has {api}, which acache needs; "
            "install a torch in the range pyproject.toml admits, or a newer acache"
        )


def inductor_cache_dir() -> Path:
    """The process's Inductor cache dir (TORCHINDUCTOR_CACHE_DIR or its default)."""
    try:
        from torch._inductor.runtime.cache_dir_utils import cache_dir
    except ImportError:
        try:
            from torch._inductor.codecache import cache_dir  # type: ignore[attr-defined,no-redef]
        except ImportError:
            raise TorchPrivateAPIMissing("torch._inductor...cache_dir()") from None
    return Path(cache_dir())


def triton_cache_dir(device_index: int = 0) -> Path:
    """Where Inductor points Triton's cache for this device: TRITON_CACHE_DIR, or a
    folder of the Inductor cache dir."""
    try:
        from torch._inductor.runtime.cache_dir_utils import triton_cache_dir as tcd
    except ImportError:
        try:
            from torch._inductor.runtime.runtime_utils import triton_cache_dir as tcd
        except ImportError:
            raise TorchPrivateAPIMissing("torch._inductor...triton_cache_dir()") from None
    return Path(tcd(device_index))


def pin_triton_ptxas() -> None:
    """Point Triton at the ptxas Inductor compiles with (torch's own, where the wheel has one).

    Triton's cache key holds the ``ptxas --version`` text. Inductor sets
    TRITON_PTXAS_PATH on its compile paths only (async_compile, the compile workers), so
    a process that loads kernels without compiling them (a warm start) would hash with
    Triton's bundled ptxas instead, miss every kernel the build stored, and compile it
    again. Pinned before the first key is made, both processes hash alike. A torch
    without the helper has nothing to pin: Triton then picks the same ptxas in both.
    """
    try:
        from torch._inductor.runtime.compile_tasks import _set_triton_ptxas_path
    except ImportError:
        return
    _set_triton_ptxas_path()


def _is_probe_state(isa: Any, name: str) -> bool:
    """An attribute an ISA probe stores on the ISA object (not one set at construction)."""
    if name.startswith("_is_") and name.endswith("_supported"):
        return True
    # x86 ISAs set _arch_flags only on the class; VecSVE sets its own in __post_init__.
    return name == "_arch_flags" and hasattr(type(isa), name)


def forget_inductor_process_caches() -> None:
    """Drop Inductor's per-process memos of work done under *earlier* cache dirs.

    ``fresh_cache()`` clears the registered code caches, not these functools memos.
    The one that matters: the CPU ISA probe (``cpu_vec_isa``) compiles a tiny
    ``__avx_chk_kernel`` .so once per process. If an earlier build in this process
    ran it under another cache dir, this build's cache dir never gets that .so, the
    entry lacks it, and every warm load compiles it again. The precompiled-header memo
    holds a path under the first cache dir, too. Clearing a memo costs a recomputation,
    never a behaviour change, so a torch without these memos simply has less to clear.
    """
    try:
        from torch._inductor import codecache, cpu_vec_isa
    except ImportError:
        raise TorchPrivateAPIMissing("torch._inductor.cpu_vec_isa") from None

    def clear(obj: Any) -> None:
        obj = getattr(obj, "__func__", obj)  # classmethod/staticmethod wrappers
        if isinstance(obj, functools._lru_cache_wrapper):  # functools.cache / lru_cache
            obj.cache_clear()

    for obj in list(vars(cpu_vec_isa).values()):
        if inspect.isclass(obj) and obj.__module__ == cpu_vec_isa.__name__:
            for attr in list(vars(obj).values()):
                clear(attr)
        else:
            clear(obj)
    clear(getattr(codecache, "_precompile_header", None))
    # A probe's key hashes its ISA's build flags, and those flags grow with verdicts
    # the first probe stored on the ISA object (``_is_avx512_bf16_supported`` adds
    # -mavx512bf16). Left set, the next probe here compiles under keys no fresh process
    # uses: this build's cache dir would lack the fresh process's probes and every warm
    # load would compile them. Dropping the stored verdicts, and an ``_arch_flags`` a
    # probe widened in place and failed to restore, makes the next probe run exactly as
    # a fresh process's does.
    for isa in getattr(cpu_vec_isa, "supported_vec_isa_list", []):
        for name in [n for n in vars(isa) if _is_probe_state(isa, n)]:
            delattr(isa, name)
    # Compile workers need nothing here: C++ compiles run on this process's threads
    # with output paths under this cache dir, and each worker-process task (Triton)
    # carries this process's TORCHINDUCTOR_CACHE_DIR and TRITON_CACHE_DIR.


def fresh_inductor_cache() -> Any:
    """A context manager that points Inductor (and Triton) at a fresh temp cache dir."""
    import torch._inductor.utils as iu

    fresh = getattr(iu, "fresh_cache", None) or getattr(iu, "fresh_inductor_cache", None)
    if fresh is None:
        raise TorchPrivateAPIMissing("torch._inductor.utils.fresh_cache")
    return fresh()


def fresh_cache_artifact_manager() -> Any:
    """A context in which the Mega-Cache records only this build's artifacts."""
    try:
        from torch.compiler._cache import CacheArtifactManager
    except ImportError:
        raise TorchPrivateAPIMissing("torch.compiler._cache.CacheArtifactManager") from None
    fresh = getattr(CacheArtifactManager, "with_fresh_cache", None)
    if fresh is None:
        CacheArtifactManager.clear()
        return contextlib.nullcontext()
    return fresh()


def mark_dynamic_dim(t: Any, dim: int, lo: int, hi: int) -> None:
    """Tell Dynamo that ``t.shape[dim]`` takes any value in [lo, hi] (one graph for all)."""
    try:
        from torch._dynamo import mark_dynamic
    except ImportError:
        raise TorchPrivateAPIMissing("torch._dynamo.mark_dynamic") from None
    mark_dynamic(t, dim, min=lo, max=hi)


def raise_dynamo_recompile_limit(limit: int) -> None:
    """At least ``limit`` compiled variants per code object before Dynamo falls back."""
    import torch._dynamo.config as dc

    if getattr(dc, "recompile_limit", 0) < limit:
        dc.recompile_limit = limit
    if getattr(dc, "cache_size_limit", limit) < limit:
        dc.cache_size_limit = limit  # torch < 2.6 spelling


@contextlib.contextmanager
def inductor_config_kept() -> Iterator[None]:
    """Undo what an AOTInductor compile leaves in Inductor's global config.

    ``aoti_compile_and_package`` fills ``config.aot_inductor.metadata`` in place
    (AOTI_DEVICE_KEY, AOTI_CPU_ISA, ...), past its own config patch. Every later
    torch.compile in the process then hashes that into its FX-graph and AOTAutograd
    cache keys, so an inductor entry built after an aoti build would miss its cache in
    a fresh process.
    """
    from torch._inductor import config

    if not hasattr(config, "get_config_copy") or not hasattr(config, "load_config"):
        raise TorchPrivateAPIMissing("torch._inductor.config.get_config_copy/load_config")
    saved = config.get_config_copy()
    try:
        yield
    finally:
        load_inductor_config(saved)


def declare_int_arrays_at_each_use() -> None:
    """Mend Inductor's C++ wrapper so that every ``int_array_N`` it names is declared
    where it is used.

    ``CppWrapperCpu.codegen_int_array_var`` declares a size or stride array through the
    ``writeline`` it is given and caches the name by ``id()`` of that writeline (or of
    its buffer), so a cached name can come back where its declaration is not: in a
    one-call buffer since freed (CPython gives the next new object the freed one's
    address), or in a block the use lies outside of. g++ then stops with
    "'int_array_230' was not declared in this scope". Seen on two llama-family aoti
    builds on the H200 (2026-12-04) and on phi-3-mini's on an H100 (2026-12-06), that
    one with every writeline's buffer kept alive (this mend's first form), so unique ids
    do not suffice. Here each call declares a fresh array at its own use: the cache's
    miss path, ``_codegen_int_array_var_impl``. It costs g++ a few more constant arrays
    and leaves none undeclared. Installed once per process; where the method or its
    miss path is gone there is nothing to mend.
    """
    try:
        from torch._inductor.codegen.cpp_wrapper_cpu import CppWrapperCpu
    except ImportError:
        return
    original = getattr(CppWrapperCpu, "codegen_int_array_var", None)
    impl = getattr(CppWrapperCpu, "_codegen_int_array_var_impl", None)
    if original is None or impl is None or getattr(original, "_acache_declares_each", False):
        return

    @functools.wraps(original)
    def codegen_int_array_var(
        self: Any, int_array: str, writeline: Any, known_statically: bool = False,
        graph: Any = None, **_: Any,  # graph and any later key: the cache's, unused here
    ) -> str:  # fmt: skip
        return self._codegen_int_array_var_impl(int_array, writeline, known_statically)

    codegen_int_array_var._acache_declares_each = True  # type: ignore[attr-defined]
    CppWrapperCpu.codegen_int_array_var = codegen_int_array_var


def load_inductor_config(saved: Any) -> None:
    """``config.load_config(saved)`` without the FutureWarning that torch 2.15 prints for
    each deprecated entry the whole-config copy holds (``use_mixed_mm``, ...): restoring
    a copy is not the user setting them, and the warnings broke one-line errors."""
    from torch._inductor import config

    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore", message=r"torch\._inductor\.config\.\S+ is deprecated", category=FutureWarning
        )
        config.load_config(saved)


# Inductor config entries that hold graph passes (callables or pass objects). Inductor's
# FX-graph cache hashes them apart from the rest of its config (FxGraphHashDetails), and
# save_config_portable leaves them out, whatever they hold.
INDUCTOR_CUSTOM_PASSES = (
    "pre_grad_custom_pass",
    "post_grad_custom_pre_pass",
    "post_grad_custom_post_pass",
    "joint_custom_pre_pass",
    "joint_custom_post_pass",
    "_pre_fusion_custom_pass",
    "_post_fusion_custom_pass",
    "_fuse_ddp_communication_passes",
)


def portable_inductor_config() -> tuple[dict[str, Any], list[str]]:
    """This process's Inductor config as another process can take it, and what of it
    that leaves behind: (``save_config_portable()``, names of the entries changed here
    whose value it does not carry as it is).

    Left behind are the entries that change generated code (what Inductor's own cache
    key reads: every entry but those about caches, logs, tracing and compile workers,
    plus the custom passes) which hold something other than torch's default here and
    which the portable form lacks or rewrites: custom passes, private entries, a factory
    class it replaces by its uuid. An entry set through a TORCHINDUCTOR_* variable
    counts (a child would inherit it): that errs on the side of naming too much.
    """
    from torch._inductor import config

    entries = getattr(config, "_config", None)
    if not isinstance(entries, dict) or not hasattr(config, "save_config_portable"):
        raise TorchPrivateAPIMissing("torch._inductor.config._config/save_config_portable")
    try:
        carried = config.save_config_portable()
        shaping = set(config.save_config_portable(ignore_private_configs=False))
    except RuntimeError:  # a factory class without uuid(): none of it is portable
        return {}, list(getattr(config, "_cache_config_factory_keys", ["a factory class"]))
    shaping.update(n for n in INDUCTOR_CUSTOM_PASSES if n in entries)
    left = []
    for name in sorted(shaping):
        value = getattr(config, name)
        if value is entries[name].default or value == entries[name].default:
            continue  # a worker starts with the default (a patch() undone leaves it set)
        if name not in carried or carried[name] != value:
            left.append(name)
    return carried, left


def release_export_state() -> None:
    """Drop torch.export's module-level reference to the last traced graph.

    Non-strict export leaves ``proxy_tensor._FAKE_TENSOR_ID_TO_PROXY_MAP_FOR_EXPORT``
    filled until the next export; its nodes hold the traced module and through it the
    model, so a process that builds and then loads would hold two copies of the
    weights. On a torch without the map there is nothing to release.
    """
    import gc

    from torch.fx.experimental import proxy_tensor

    leftover = getattr(proxy_tensor, "_FAKE_TENSOR_ID_TO_PROXY_MAP_FOR_EXPORT", None)
    if isinstance(leftover, dict):
        leftover.clear()
    gc.collect()  # the model and the graph reference each other through cycles


def aoti_runner_missing(device_type: str) -> str:
    """Why this torch cannot run an AOTInductor package on ``device_type`` ("" if it can)."""
    import torch

    aoti = getattr(torch._C, "_aoti", None)
    if aoti is None:
        return f"torch {torch.__version__} has no AOTInductor runtime (torch._C._aoti)"
    name = "AOTIModelContainerRunner" + ("Cuda" if device_type == "cuda" else "Cpu")
    if not hasattr(aoti, name):
        return f"this torch build has no AOTInductor runner torch._C._aoti.{name}"
    return ""


def aoti_container_runner(so_path: Path, dev: Any) -> Any:
    """An AOTI model-container runner over an already-unpacked .so.

    Constructed directly rather than through ``aoti_load_package``, which extracts the
    whole archive to a temp dir on every load.
    """
    import torch

    if reason := aoti_runner_missing(dev.type):
        raise BackendUnavailable(reason)
    aoti = torch._C._aoti
    if dev.type == "cuda":
        # The kernel binaries (.cubin) sit beside the .so in the unpacked package.
        return aoti.AOTIModelContainerRunnerCuda(str(so_path), 1, str(dev), str(so_path.parent))
    return aoti.AOTIModelContainerRunnerCpu(str(so_path), 1)


def output_tree(out: Any) -> tuple[list[Any], str]:
    """(flat output tensors, the structure as JSON) via torch.utils._pytree."""
    from torch.utils import _pytree

    flat, spec = _pytree.tree_flatten(out)
    try:
        return flat, _pytree.treespec_dumps(spec)
    except Exception as e:  # a pytree node type without a serialized name
        raise BackendError(
            f"the model's output structure cannot be stored ({type(e).__name__}: {e}); "
            "return tensors, or tuples, lists or dicts of them"
        ) from None


def rebuild_output(flat: list[Any], tree: str) -> Any:
    """The model's output structure from its flat tensors and output_tree's JSON."""
    from torch.utils import _pytree

    return _pytree.tree_unflatten(list(flat), _pytree.treespec_loads(tree))


def output_leaves(out: Any) -> list[tuple[str, Any]]:
    """(path in the output structure, e.g. "[0]" or "['feat']", leaf) for every leaf."""
    from torch.utils import _pytree

    leaves, _ = _pytree.tree_flatten_with_path(out)
    return [(_pytree.keystr(path), leaf) for path, leaf in leaves]


def inductor_mode_options(mode: str) -> dict[str, Any]:
    """The Inductor options torch.compile applies for ``mode`` (as ``mode=`` would).

    acache passes options rather than a mode so that it can add tuning flags on top:
    torch.compile takes one or the other, not both.
    """
    if mode == "default":
        return {}
    try:
        from torch._inductor import list_mode_options
    except ImportError:
        raise TorchPrivateAPIMissing("torch._inductor.list_mode_options") from None
    return dict(list_mode_options(mode))


def aot_compile_missing() -> str:
    """Why this torch cannot save and reload a compiled function ("" if it can).

    Checks only ``torch.compiler`` (already imported with torch): key computation
    asks this, and importing ``torch._dynamo`` to find out would cost seconds there.
    """
    import torch

    if not hasattr(torch.compiler, "load_compiled_function"):
        return f"torch {torch.__version__} has no torch.compiler.load_compiled_function"
    return ""


def step_guards_kept(guard_entries: Any) -> list[bool]:
    """Dynamo's ``guard_filter_fn`` for a saved step: keep the shape/dtype/device guards
    of the tensors a caller passes in (tokens, positions, caches) and the shape
    environment's guard (the ranges of dynamic dimensions: a pass's T, kv_pos's L),
    drop the rest.

    A step's first argument is the model, so by default every parameter gets a tensor
    guard, and the module's attributes get type and value guards: on llama-7b ~290
    tensors a step, unpickled and rebuilt in every warm process (~0.8 s of a warm
    load's profile, attempt 27) and checked on every call made outside a CUDA graph.
    The entry's key already fixes what they guard (architecture, dtype, device, shapes
    and acache's code), so they can only fail where the key would have missed. A wrong
    input still fails its guard (a dynamic size outside its range too), so a misuse is
    an error, not a silent wrong result. Buffers keep their guards: int8/int4 weights
    are buffers, so quantized steps keep theirs."""
    import torch

    return [
        entry.guard_type == "SHAPE_ENV"
        or (
            entry.guard_type == "TENSOR_MATCH"
            and not entry.is_global  # torch cannot save a global's guard
            and not isinstance(entry.value, torch.nn.Parameter)
        )
        for entry in guard_entries
    ]


def aot_compile_step(fn: Any, args: tuple[Any, ...], options: dict[str, Any]) -> Any:
    """``torch.compile(fn, fullgraph=True, dynamic=False, options=...).aot_compile(args)``,
    saving only the guards :func:`step_guards_kept` keeps.

    Returns the compiled function (callable with ``args``' structure, savable with
    :func:`save_compiled_step`). torch gates the method behind
    ``torch._dynamo.config.enable_aot_compile``, read when torch.compile wraps ``fn``.
    """
    import torch
    import torch._dynamo.config as dc

    flag = {"enable_aot_compile": True} if hasattr(dc, "enable_aot_compile") else {}
    options = {**(options or {}), "guard_filter_fn": step_guards_kept}
    with dc.patch(**flag):
        compiled = torch.compile(fn, fullgraph=True, dynamic=False, options=options)
        aot = getattr(compiled, "aot_compile", None)
        if aot is None:
            raise TorchPrivateAPIMissing("torch.compile(...).aot_compile")
        return aot((args, {}))


def save_compiled_step(compiled: Any, path: Path) -> None:
    """Write an :func:`aot_compile_step` result to ``path``."""
    save = getattr(compiled, "save_compiled_function", None)
    if save is None:
        raise TorchPrivateAPIMissing("AOTCompiledFunction.save_compiled_function")
    save(str(path))


def load_compiled_step(saved: Path | bytes) -> Any:
    """The compiled function saved at a path, or its bytes: no Dynamo tracing, no compile."""
    import torch

    load = getattr(torch.compiler, "load_compiled_function", None)
    if load is None:
        raise TorchPrivateAPIMissing("torch.compiler.load_compiled_function")
    if isinstance(saved, bytes):
        return load(io.BytesIO(saved))
    with open(saved, "rb") as f:
        return load(f)


def export_user_error() -> type[Exception]:
    """The exception class torch.export raises for a user-side problem (constraints)."""
    try:
        from torch._dynamo.exc import UserError
    except ImportError:
        raise TorchPrivateAPIMissing("torch._dynamo.exc.UserError") from None
    return UserError
