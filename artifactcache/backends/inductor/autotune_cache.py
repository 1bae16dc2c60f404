"""Inductor's autotuning results, kept where a later process finds and trusts them.

The entry carries Inductor's autotune cache files (files.py); these patches of
Inductor's private autotuner make a warm process look them up in its own cache dir and
keep coordinate-descent results as such (docs/perf-notes.md, attempts 16-18). Like
shared/torch_private.py, every name of torch it touches is private: a torch without
them runs unpatched (a slower first call, never an error).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..shared.patches import ProcessPatches
from ..shared.torch_private import inductor_cache_dir

# inductor_tuning_results_kept's patches: process-wide, for as long as any scope is open.
PATCHES = ProcessPatches()


@contextlib.contextmanager
def inductor_tuning_results_kept() -> Iterator[None]:
    """While Inductor compiles, loads or first runs graphs with Triton kernels, keep
    its autotuning results findable by a later process (docs/perf-notes.md, attempt 16):

    - a *static* autotuner from a saved graph was pickled whole, with its kernel file's
      absolute path in the build's temporary cache dir and a save hook whose cache
      file lies there too. Its recheck looks there, misses, tunes again and saves
      where no later process looks. Here both point under the same content-hash path
      in this process's cache dir, where the entry's files are installed;
    - a plain benchmark result does not overwrite a coordinate-descent result saved
      for the same kernel and candidate configs. On torch 2.11 the plain save is made
      without ``found_by_coordesc``, so a second autotuner of one kernel file
      (prefill's and decode's) would leave the unrefined result, and every warm
      process would run coordinate descent again. torch 2.13 labels that save with the
      tuning flag, so the guard never fires there.
    - a static autotuner whose recheck hits a coordinate-descent result runs with that
      result marked as found by coordinate descent (attempt 18). torch 2.11's recheck
      (runtime/triton_heuristics.py:461-478) keeps the hit only when the autotuner has
      more than one compiled config, and then keeps the matching compiled config
      without the mark. ``CachingAutotuner.run`` (:1450-1455) runs coordinate descent
      on any launcher whose config lacks the mark, so every such kernel was tuned
      again, compiling each config it tried. torch 2.13 does both itself; there the
      mark is already set and this step does nothing.
    - an autotuner whose config came from an autotune-cache hit is not widened again
      by ``_dynamic_scale_rblock``. torch 2.11 runs it after every precompile: a
      register-heavy reduction (llama-7b's fused RMSNorm + decode matmul) gets a
      second config with half the R0_BLOCK, which a warm process compiles and
      benchmarks against the cached winner, then tunes again by coordinate descent
      (docs/perf-notes.md, attempt 25). torch 2.13 returns early on a hit itself.

    Autotuners created inside keep the guarded save as their hook afterwards; it only
    ever skips a save. A torch without these internals runs unpatched (the slow path,
    never an error).
    """
    try:
        import torch._inductor.runtime.autotune_cache as ac
        import torch._inductor.runtime.triton_heuristics as th
    except ImportError:
        yield
        return
    with PATCHES.scope(lambda: _install_tuning_patches(th.CachingAutotuner, ac.AutotuneCache)):
        yield


def _install_tuning_patches(autotuner_cls: Any, cache_cls: Any) -> None:
    real_recheck = getattr(autotuner_cls, "recheck_autotune_cache", None)
    real_save = getattr(cache_cls, "save", None)
    real_scale = getattr(autotuner_cls, "_dynamic_scale_rblock", None)

    def recheck(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            here = inductor_cache_dir()
            self.filename = local_kernel_path(getattr(self, "filename", None), here)
            hook_cache = getattr(getattr(self, "save_cache_hook", None), "__self__", None)
            local = getattr(hook_cache, "local_cache", None)
            if local:
                hook_cache.local_cache = (local[0], local_kernel_path(local[1], here))
        except Exception:  # noqa: BLE001 - a failed remap is a slower load, never a failed one
            pass
        configs = [r.config for r in getattr(self, "compile_results", ()) or ()]
        result = real_recheck(self, *args, **kwargs)
        try:
            reload = args[0] if args else kwargs.get("reload_kernel_from_src")
            keep_coordesc_mark(self, configs, reload)
        except Exception:  # noqa: BLE001 - unmarked is a slower first call, never a failed one
            pass
        return result

    def save(self: Any, *args: Any, **kwargs: Any) -> Any:
        coordesc = kwargs.get("found_by_coordesc", args[2] if len(args) > 2 else False)
        if not coordesc and _holds_coordesc_result(self):
            return None
        return real_save(self, *args, **kwargs)

    def scale_rblock(self: Any, *args: Any, **kwargs: Any) -> Any:
        if cache_hit(self):
            return None
        return real_scale(self, *args, **kwargs)

    if real_scale is not None:
        PATCHES.replace(autotuner_cls, "_dynamic_scale_rblock", scale_rblock)
    if real_recheck is not None:
        PATCHES.replace(autotuner_cls, "recheck_autotune_cache", recheck)
    if real_save is not None:
        PATCHES.replace(cache_cls, "save", save)


def cache_hit(tuner: Any) -> bool:
    """Whether this autotuner's configs came from an autotune-cache hit."""
    info = getattr(tuner, "autotune_cache_info", None) or {}
    return info.get("autotune_cache_state") == "hit"


def keep_coordesc_mark(tuner: Any, configs: list[Any], reload_kernel_from_src: Any) -> None:
    """After a static autotuner's recheck: where its autotune cache holds a
    coordinate-descent result for ``configs`` (its compiled configs before the recheck)
    and the torch's recheck did not leave that config marked as the one compiled result,
    do what torch 2.13's recheck does: mark the matching compiled config, or compile
    the cached one when none matches. A no-op without coordinate-descent tuning (CPU
    builds), on a miss, and where the torch marked it already."""
    import torch._inductor.runtime.autotune_cache as ac
    import torch._inductor.runtime.triton_heuristics as th

    meta = getattr(tuner, "inductor_meta", None) or {}
    if not configs or not meta.get("coordinate_descent_tuning"):
        return
    if not cache_hit(tuner):
        return
    results = tuner.compile_results
    if len(results) == 1 and getattr(results[0].config, "found_by_coordesc", False):
        return  # the torch's own recheck kept the mark
    best = _cached_coordesc_config(ac, th, tuner.filename, configs, meta)
    if best is None:
        return
    want = th.triton_config_to_hashable(best)
    for r in results:
        if th.triton_config_to_hashable(r.config) == want:
            r.config.found_by_coordesc = True
            tuner.compile_results = [r]
            return
    if getattr(tuner.fn, "fn", None) is None and reload_kernel_from_src is not None:
        tuner.fn = reload_kernel_from_src().fn
    tuner.compile_results = [tuner._precompile_config(best)]


def _cached_coordesc_config(
    ac: Any, th: Any, filename: str | None, configs: list[Any], meta: dict[str, Any]
) -> Any:
    """The coordinate-descent config the local autotune cache holds for this kernel
    file and these candidate configs, marked ``found_by_coordesc``; else None."""
    if not filename:
        return None
    configs_hash = th.hash_configs(configs)
    cache = ac.AutotuneCache.create(meta, filename, configs_hash)
    local = getattr(cache, "local_cache", None)
    if not local:
        return None
    try:
        data = json.loads(Path(local[1]).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or not data.get("found_by_coordesc"):
        return None
    best = ac._load_cached_autotuning(data, configs_hash, configs, meta)
    return best if getattr(best, "found_by_coordesc", False) else None


def local_kernel_path(filename: str | None, cache_dir: Path) -> str | None:
    """A kernel file's path (or its tuning result's) under ``cache_dir``, where it is
    not there already and its own path is gone: Inductor names these files
    ``<xx>/<hash>.<ext>`` by content, so the same two components name them in any
    process's cache dir."""
    if not filename:
        return filename
    path = Path(filename)
    if len(path.parts) < 2 or path.is_relative_to(cache_dir) or path.parent.exists():
        return filename
    return str(cache_dir / path.parent.name / path.name)


def _holds_coordesc_result(cache: Any) -> bool:
    """Whether this AutotuneCache's local file already holds a coordinate-descent
    result for the same candidate configs."""
    local = getattr(cache, "local_cache", None)
    try:
        data = json.loads(Path(local[1]).read_text()) if local else None
    except (OSError, ValueError, TypeError, IndexError):
        return False
    return (
        isinstance(data, dict)
        and bool(data.get("found_by_coordesc"))
        and data.get("configs_hash") == getattr(cache, "configs_hash", None)
    )
