"""How the inductor steps are compiled: in a build, one after the other in this process
or each in a build worker (shared/build_jobs.py); in a megacache load, compiled again.

A build compiles inside ``torch._inductor.utils.fresh_cache()`` so the artifact never
depends on what the user's framework caches happened to hold, and so the kernel files
to keep (files.py) are exactly the ones that compile produced.

Built in workers (the aot_compile path; ``build_plan.planned_jobs`` decides), each step
is compiled in a process of its own with its own fresh caches, so the files it leaves
are staged per step and merged here::

    <scratch>/<step>/kernels/...          the step's kernel files (files.py's layout)
    <scratch>/<step>/megacache.bin        what torch recorded beyond the saved function

Kernel files are named by content hashes, so two steps' same-named files are the same
kernel. Where both hold its tuning winner (``.best_config``), the merge keeps the one
that coordinate descent found, else the later step's (prefill, extend, decode): in a
serial build, decode's coordinate descent rewrites the plain winner a pass step left
for a kernel they share, and a warm process would tune again on a plain one. Each
step's megacache, where it has one, becomes ``megacache-<step>.bin`` of the entry; a
load reads them all.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...choices import BuildChoices
from ...devices import device_index, is_cuda
from ...errors import BackendError
from ...kv_buckets import kv_len_range
from ..shared.runner import sync
from ..shared.steps import (
    STEP_KINDS,
    dynamic_ranges,
    example_inputs,
    kv_buckets_of,
    prefill_tokens_range,
)
from ..shared.torch_private import (
    aot_compile_step,
    forget_inductor_process_caches,
    fresh_cache_artifact_manager,
    fresh_inductor_cache,
    inductor_mode_options,
    mark_dynamic_dim,
    pin_triton_ptxas,
    raise_dynamo_recompile_limit,
    save_compiled_step,
)
from ..shared.tuning import decode_only, inductor_tuning
from .autotune_cache import inductor_tuning_results_kept
from .files import save_compiled_files
from .options import layer_regions, region_configs

if TYPE_CHECKING:
    from ..shared.build_jobs import StepJob

MEGACACHE = "megacache.bin"
KERNELS = "kernels"
# A worker's cache-artifact sizes by type, staged beside its megacache for the record.
ARTIFACTS = "cache_artifacts.json"
MODES = ("default", "reduce-overhead", "max-autotune")
STEPS = STEP_KINDS
# The saved compiled function of each step on the aot_compile path.
STEP_FILES = {step: f"{step}.aotfn" for step in STEPS}
# Mega-Cache artifact types a saved compiled function already carries (its
# AOTAutograd entry is bundled, Inductor's compiled graph inside it).
_BUNDLED_IN_STEPS = {"aot_autograd", "inductor"}
# One recipe's three steps per model class and dtype; a
# process that loads several recipes needs more than Dynamo's default of 8
# entries per code object before it would silently fall back to eager.
_RECOMPILE_LIMIT = 64


def step_megacache(step: str) -> str:
    """The entry's megacache file of one step built in a worker."""
    return f"megacache-{step}.bin"


def inductor_mode(opts: BuildChoices) -> str:
    """The fast path is the default: CUDA graphs on CUDA, plain compile on CPU."""
    return opts.mode or ("reduce-overhead" if is_cuda(opts.device) else "default")


def compile_options(opts: BuildChoices) -> dict[str, Any]:
    """Inductor options for torch.compile: the mode's own, plus acache's tuning flags."""
    return {**inductor_mode_options(inductor_mode(opts)), **inductor_tuning(opts)}


def run_model(model: Any, *inputs: Any) -> Any:
    """The step aot_compile traces: the model is an input, so its weights are not
    baked in and its KV-cache buffers are the caller's."""
    return model(*inputs)


def step_inputs(recipe: Any, dev: Any, step: str, kv_buckets: bool = True) -> tuple[Any, ...]:
    """example_inputs, with the dimensions that vary marked dynamic: the passes' token
    count (idx's dim 1, input_pos's dim 0) and kv_pos's length.

    Only the example a step is compiled at is marked: Dynamo's guards on a dynamic
    size are its range, so the runner's unmarked inputs of other lengths hit it.
    """
    inputs = example_inputs(recipe, dev, step, kv_buckets)
    for (index, dim), (lo, hi) in dynamic_ranges(recipe, step, kv_buckets).items():
        mark_dynamic_dim(inputs[index], dim, lo, hi)
    return inputs


def dynamic_dims(recipe: Any, kv_buckets: bool) -> list[str]:
    """The dimensions the steps are compiled dynamic in (a key factor)."""
    dims = ["tokens"] if prefill_tokens_range(recipe) else []
    return dims + (["kv_len"] if kv_len_range(recipe.shapes.max_seq_len, kv_buckets) else [])


def pass_options(options: dict[str, Any]) -> dict[str, Any]:
    """The prefill passes' Inductor options: the mode's without CUDA graphs, no tuning
    flags (tuning.decode_only), and no matmul padding.

    Why no padding: on CUDA, Inductor's pad_mm pass weighs padding an unaligned matmul
    dimension by comparing the token count with the weight's sizes, which adds a guard
    such as ``tokens >= 172`` (tiny-llama-2k's intermediate size) that Dynamo refuses as
    a violation of the compiled token range: the build failed (H200, torch 2.11). The
    seed models' dimensions are aligned, so they never padded.
    """
    passes = decode_only(options, "prefill").items()
    return {**{k: v for k, v in passes if k != "triton.cudagraphs"}, "shape_padding": False}


def use_layer_regions(model: Any, recipe: Any, opts: BuildChoices) -> dict[str, bool]:
    """Set whether ``model``'s decode calls its blocks as regions (options.py), before
    any step is traced; the Inductor config the decode step then takes on top."""
    model.layer_regions = layer_regions(recipe, opts)
    return region_configs(model.layer_regions)


def register_model_ops(model: Any) -> None:
    """Register a split-KV model's custom op before Dynamo traces the model: Dynamo
    refuses to register one from inside a traced function."""
    if getattr(model, "split_kv_decode", False):
        import artifactcache.models.decode_attention  # noqa: F401


def compile_steps(
    model: Any, opts: BuildChoices, recipe: Any, dev: Any, timings: dict[str, float] | None = None
) -> tuple[Any, Any, Any]:
    """torch.compile the steps and run each once (decode twice more for reduce-overhead,
    whose CUDA graphs are recorded on the second call); (prefill, extend, decode).
    ``timings`` gets each step's seconds (compiling happens at its first call).

    The passes and decode are two compiled wrappers of one model: Dynamo keeps their
    graphs apart (each entry guards on the backend that compiled it).
    """
    import torch

    register_model_ops(model)
    regions = use_layer_regions(model, recipe, opts)

    raise_dynamo_recompile_limit(_RECOMPILE_LIMIT)
    options = compile_options(opts)
    decode = {**options, **regions}
    compiled = {
        "decode": torch.compile(model, fullgraph=True, dynamic=False, options=decode or None)
    }
    passes = pass_options(options)
    compiled["prefill"] = compiled["extend"] = torch.compile(
        model, fullgraph=True, dynamic=False, options=passes or None
    )
    with torch.no_grad():
        for step in STEPS:
            t0 = time.perf_counter()
            inputs = step_inputs(recipe, dev, step, kv_buckets_of(model))
            runs = 3 if step == "decode" and options.get("triton.cudagraphs") else 1
            for _ in range(runs):
                compiled[step](*inputs)
            if timings is not None:  # a build: each step's GPU work counted in its time
                sync(dev)
                timings[step] = round(time.perf_counter() - t0, 3)
    sync(dev)
    return compiled["prefill"], compiled["extend"], compiled["decode"]


def save_aot_steps(
    model: Any, opts: BuildChoices, recipe: Any, dev: Any, workdir: Path,
    timings: dict[str, float] | None = None, steps: tuple[str, ...] = STEPS,
) -> dict[str, int]:  # fmt: skip
    """aot_compile each of ``steps``, run each once, save them; {file: bytes}.
    ``timings`` gets each step's seconds (trace, compile, tuning, first run and save) and
    this process's CPU seconds in them, ``<step>_cpu`` (aoti's ``_export_cpu`` says why)."""
    import torch

    # On this path the CUDA graphs are acache's (cuda_graph_step at load), not torch's.
    options = {k: v for k, v in compile_options(opts).items() if k != "triton.cudagraphs"}
    register_model_ops(model)
    decode = {**options, **use_layer_regions(model, recipe, opts)}
    sizes = {}
    for step in steps:
        t0, c0 = time.perf_counter(), time.process_time()
        args = (model, *step_inputs(recipe, dev, step, kv_buckets_of(model)))
        with torch.no_grad():
            step_options = decode if step == "decode" else pass_options(options)
            compiled = aot_compile_step(run_model, args, step_options)
            compiled(*args)  # fails here, at build, rather than in a warm process
        sync(dev)
        save_compiled_step(compiled, workdir / STEP_FILES[step])
        sizes[STEP_FILES[step]] = (workdir / STEP_FILES[step]).stat().st_size
        if timings is not None:
            timings[step] = round(time.perf_counter() - t0, 3)
            timings[f"{step}_cpu"] = round(time.process_time() - c0, 3)
    return sizes


def build_here(
    model: Any, opts: BuildChoices, recipe: Any, dev: Any, path: str, workdir: Path,
    timings: dict[str, float], steps: tuple[str, ...] = STEPS, files_to: Path | None = None,
) -> dict[str, Any]:  # fmt: skip
    """``steps`` in this process, one after the other, under fresh framework caches; the
    record's ``steps`` (aot_compile), ``kernels`` and megacache fields. The saved
    functions go to ``workdir``, the kernel files and megacache to ``files_to`` (default
    ``workdir``; a worker's staging folder). ``timings`` gets each step's seconds and
    ``save``."""
    import torch

    files_to = files_to or workdir
    record: dict[str, Any] = {}
    with fresh_inductor_cache(), fresh_cache_artifact_manager(), inductor_tuning_results_kept():
        torch.compiler.reset()
        forget_inductor_process_caches()
        if path == "aot_compile":
            record["steps"] = save_aot_steps(model, opts, recipe, dev, workdir, timings, steps)
        else:
            compile_steps(model, opts, recipe, dev, timings)
        t_save = time.perf_counter()
        saved = torch.compiler.save_cache_artifacts()
        if saved is None and path == "megacache":
            raise BackendError(
                "torch.compile produced no cache artifacts (are Inductor's caches disabled, "
                "e.g. TORCHINDUCTOR_FORCE_DISABLE_CACHES=1?)"
            )
        record["kernels"] = save_compiled_files(files_to / KERNELS, device_index(opts.device))
    # The steps compiled above belong to this build's model; a later load()
    # in this process gets its own from the entry.
    torch.compiler.reset()
    record.update(write_megacache(saved, path, files_to / MEGACACHE))
    timings["save"] = round(time.perf_counter() - t_save, 3)
    return record


def write_megacache(saved: Any, path: str, dest: Path) -> dict[str, Any]:
    """``save_cache_artifacts()``'s bytes to ``dest``, unless the saved functions already
    carry all of it (aot_compile); the record's ``megacache_bytes`` and ``cache_artifacts``."""
    data, artifacts = b"", {}
    if saved is not None:
        data, info = saved
        artifacts = {k: len(v) for k, v in info.artifacts.items() if v}
        if path == "aot_compile" and set(artifacts) <= _BUNDLED_IN_STEPS:
            data = b""  # nothing the saved functions lack
    if data:
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(data)
    return {"megacache_bytes": len(data), "cache_artifacts": artifacts}


def build_in_worker(
    model: Any, job: StepJob, dev: Any, config: Callable[[], Any], timings: dict[str, float]
) -> str:
    """One step of an aot_compile build in a build worker: its saved function in the
    workdir (the return value, relative to it), its kernel files and megacache staged
    under ``job.scratch/<step>/`` for merge_worker_files."""
    from ...models.rows import register_ops

    config()  # no compiler probe on this path: sent at once
    job.mark("compiling")
    pin_triton_ptxas()
    register_ops(model)  # before Dynamo traces it
    staged = job.scratch / job.step
    staged.mkdir(parents=True, exist_ok=True)
    record = build_here(model, job.opts, job.recipe, dev, "aot_compile", job.workdir,
                        timings, (job.step,), staged)  # fmt: skip
    timings[f"{job.step}_save"] = timings.pop("save")  # the parent's "save" is the merge
    (staged / ARTIFACTS).write_text(json.dumps(record["cache_artifacts"]))
    return STEP_FILES[job.step]


def merge_worker_files(scratch: Path, workdir: Path) -> dict[str, Any]:
    """The workers' staged files into the entry (see the module docstring); the record's
    ``steps``, ``kernels``, ``megacache_bytes`` and ``cache_artifacts`` (summed over the
    steps) fields."""
    kernels: set[str] = set()
    sizes, mega, artifacts = {}, 0, {}
    for step in STEPS:
        staged = scratch / step
        src = staged / KERNELS
        for f in sorted(src.rglob("*")) if src.is_dir() else []:
            if not f.is_file():
                continue
            rel = f.relative_to(src)
            dst = workdir / KERNELS / rel
            if not dst.exists() or (f.suffix == ".best_config" and _keeps(f, over=dst)):
                dst.parent.mkdir(parents=True, exist_ok=True)
                shutil.move(f, dst)
            kernels.add(rel.as_posix())
        if (staged / MEGACACHE).is_file():
            mega += (staged / MEGACACHE).stat().st_size
            shutil.move(staged / MEGACACHE, workdir / step_megacache(step))
        if (staged / ARTIFACTS).is_file():
            for kind, n in json.loads((staged / ARTIFACTS).read_text()).items():
                artifacts[kind] = artifacts.get(kind, 0) + n
        sizes[STEP_FILES[step]] = (workdir / STEP_FILES[step]).stat().st_size
    return {
        "steps": sizes,
        "kernels": sorted(kernels),
        "megacache_bytes": mega,
        "cache_artifacts": artifacts,
    }


def _keeps(later: Path, over: Path) -> bool:
    """Whether a later step's tuning winner replaces an earlier step's: unless only the
    earlier one was found by coordinate descent."""

    def by_coordesc(f: Path) -> bool:
        try:
            return bool(json.loads(f.read_text()).get("found_by_coordesc"))
        except (OSError, ValueError, AttributeError):
            return False

    return by_coordesc(later) or not by_coordesc(over)
