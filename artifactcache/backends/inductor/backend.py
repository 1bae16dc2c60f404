"""inductor: torch.compile of the prefill, extend and decode steps, warm without recompiling.

Two ways to warm, chosen per torch (``warm_path``, a key factor: the files differ):

Three steps (steps.STEP_KINDS): a prompt's first pass (causal over its own keys),
a pass that reads the cache (a later chunk, left-padded rows), and decode. Shapes are
static but for the passes' token count (up to prefill_len) and the KV-read length of
extend and decode (the size of their ``kv_pos`` input, models/common.py), marked
dynamic where they vary, so one compiled step serves every length. The passes are
compiled without CUDA graphs (a graph per pass length would be recorded, and a pass
of hundreds of tokens is compute-bound anyway); decode keeps the mode's.

``aot_compile`` (wherever ``torch.compiler.load_compiled_function`` exists, CPU and CUDA): each step
is ``torch.compile(run_model, fullgraph=True).aot_compile(((model, *inputs), {}))``
and saved with ``save_compiled_function``. The model is an *argument*, so its
parameters and buffers (the KV caches, mutated in place, included) are graph
inputs: the saved function holds no weights and writes the caller's buffers. A
warm process deserializes the functions: no Dynamo tracing, no guard building
from bytecode, no Inductor compile. Only the inputs' tensor guards are saved
(``torch_private.step_guards_kept``): guards on ~290 parameters were rebuilt in every
warm process and checked on every call. On CUDA, modes whose options turn on
``triton.cudagraphs`` are compiled without it and decode is replayed from a graph
captured at load (``cuda_graph.cuda_graph_step``), as for aoti.

``megacache`` (the fallback): ``megacache.bin`` from
``torch.compiler.save_cache_artifacts()`` after compiling and running the steps
once; a warm process hot-loads it and runs torch.compile again, so Dynamo still
traces the model while the FX-graph and AOTAutograd caches hit.

Both paths carry:

``kernels/``       what the build compiled that a fresh process with empty framework
                   caches would compile again (files.py): the C++ kernel
                   objects on CPU (measured: 21 g++ runs for tiny-llama without
                   them), and on CUDA the Triton kernels and the autotuning winners.
``megacache.bin``  on the aot_compile path too when torch recorded anything beyond
                   what the saved functions bundle (autotune results, say); one
                   ``megacache-<step>.bin`` per step instead where the steps were
                   built in workers (compiling.py).
``inductor.json``  a record of the above, with ``warm_path``.

build() compiles inside ``torch._inductor.utils.fresh_cache()`` (compiling.py), the
steps one after the other in this process, or on the aot_compile path each in a build
worker of its own, all at once (shared/build_jobs.py; ACACHE_BUILD_JOBS, as for aoti).
"""

from __future__ import annotations

import contextlib
import json
import shutil
import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

from ... import settings
from ...choices import BuildChoices
from ...code_factors import codegen_factors
from ...devices import device_index, device_type, is_cuda
from ...errors import BackendError
from ...keys import toolchain_fingerprint
from ..base import BuildContext
from ..shared.build_jobs import StepJob, build_concurrently
from ..shared.build_plan import planned_jobs
from ..shared.cpu_isa import isa_verdicts_kept
from ..shared.cuda_graph import cuda_graph_step
from ..shared.cxx import identity, inductor_default_cxx, missing_compiler
from ..shared.model_options import (
    check_model_options,
    check_recipe_options,
    model_factors,
    split_kv_decode,
)
from ..shared.runner import StepRunner, build_model_for, check_device_dtype, device_of, sync
from ..shared.steps import (
    LazyStep,
    decode_examples,
    example_inputs,
    kv_buckets_of,
    opened_when_used,
)
from ..shared.torch_private import aot_compile_missing, load_compiled_step, pin_triton_ptxas
from ..shared.tuning import check_extra, inductor_tuning
from .autotune_cache import inductor_tuning_results_kept
from .compiling import (
    KERNELS,
    MEGACACHE,
    MODES,
    STEP_FILES,
    STEPS,
    build_here,
    build_in_worker,
    compile_options,
    compile_steps,
    dynamic_dims,
    inductor_mode,
    merge_worker_files,
    register_model_ops,
    step_megacache,
)
from .files import install_compiled_files
from .options import INDUCTOR_EXTRA_KEYS, check_layer_regions, layer_regions
from .triton_key import prefetch_triton_key

RECORD = "inductor.json"
FORMAT = 2  # 2: three steps (prefill, extend, decode)
WARM_PATHS = ("aot_compile", "megacache")
# Picks the warm path against the default below, to measure one against the other.
WARM_PATH_ENV = "ACACHE_INDUCTOR_WARM_PATH"


def warm_path() -> str:
    """How this entry is warmed: "aot_compile" where torch can save a compiled function,
    else "megacache". A function of the torch and $ACACHE_INDUCTOR_WARM_PATH, which the
    key names (the factor ``warm_path``), so the same toolchain always picks the same path.

    On an H200 (llama-7b, bf16, one call, docs/perf-notes.md attempt 25) three warm
    aot_compile processes loaded and gave the first token in 8.0-8.9 s beyond imports,
    with no Triton compile, benchmark or coordinate-descent run, and decoded at 222 tok/s;
    a megacache process took 28.7 s, compiled 5 kernels, re-tuned 4, and decoded at 203.
    """
    chosen = settings.raw(WARM_PATH_ENV).strip()
    if chosen:
        if chosen not in WARM_PATHS:
            raise BackendError(
                f"{WARM_PATH_ENV}={chosen!r}: choose one of {', '.join(WARM_PATHS)}, or unset it"
            )
        if chosen == "aot_compile" and (missing := aot_compile_missing()):
            raise BackendError(f"{WARM_PATH_ENV}=aot_compile: {missing}; unset it")
        return chosen
    return "megacache" if aot_compile_missing() else "aot_compile"


class InductorBackend:
    name = "inductor"
    weights_external = False  # the graphs embed no weights, but AOTAutograd keys on them

    def available(self, opts: BuildChoices) -> tuple[bool, str]:
        import torch

        if is_cuda(opts.device) and not torch.cuda.is_available():
            return False, "torch sees no CUDA GPU; use --device cpu"
        if opts.device == "cpu" and (reason := missing_compiler()):
            return False, reason  # Inductor's CPU kernels are C++
        return True, ""

    def check_options(self, opts: BuildChoices) -> None:
        check_device_dtype(opts)
        mode = inductor_mode(opts)
        if mode not in MODES:
            raise BackendError(f"unknown inductor mode {mode!r}: choose one of {', '.join(MODES)}")
        if mode == "reduce-overhead" and not is_cuda(opts.device):
            # CUDA graphs are the whole point of this mode; on CPU torch.compile
            # would quietly compile as "default", and a key saying otherwise lies.
            raise BackendError(
                "--mode reduce-overhead uses CUDA graphs and needs --device cuda; "
                "use --mode default on cpu"
            )
        check_extra(self.name, opts, INDUCTOR_EXTRA_KEYS)
        check_model_options(self.name, opts)
        check_layer_regions(opts)

    def check_recipe(self, recipe: Any, opts: BuildChoices) -> None:
        check_recipe_options(self.name, recipe, opts)
        layer_regions(recipe, opts)  # the rope kernel with asked-for regions: one line

    def factors(self, recipe: Any, opts: BuildChoices) -> dict[str, Any]:
        # The mode is a factor of its own; the tuning flags are the config passed on top.
        codegen = codegen_factors(inductor_tuning(opts))
        if opts.device == "cpu":
            # The entry's kernels/ are this compiler's output, and Inductor keys its
            # own caches on the compile command, so another compiler would miss them.
            codegen["cxx"] = identity(inductor_default_cxx())
        split_kv = split_kv_decode(self.name, opts, recipe)
        return {
            "format": FORMAT,
            "dtype": opts.dtype,
            "device": device_type(opts.device),
            "mode": inductor_mode(opts),
            **model_factors(self.name, recipe, opts),
            "fullgraph": True,
            "dynamic": dynamic_dims(recipe, not split_kv),
            "codegen": codegen,
            "warm_path": warm_path(),
            "layer_regions": layer_regions(recipe, opts),
        }

    def toolchain(self, opts: BuildChoices) -> dict[str, Any]:
        if is_cuda(opts.device):
            return toolchain_fingerprint(("torch", "triton"))
        return toolchain_fingerprint(("torch",))

    def build(self, ctx: BuildContext, workdir: Path) -> dict[str, Any]:
        t_build = time.perf_counter()
        path = warm_path()
        # Workers only on the aot_compile path: a megacache entry is compiled again by
        # every warm process, so its build has nothing to split into step files.
        jobs = planned_jobs(ctx.recipe, ctx.opts, len(STEPS))  # a bad setting: one line
        jobs = jobs if path == "aot_compile" else 1
        # The build is the one cost paid per key: its parts (each step's trace, compile,
        # tuning and first run; the save) say which of them a slow build should cut.
        if jobs > 1:
            scratch = workdir / ".steps"
            scratch.mkdir()
            _, timings = build_concurrently(self.name, ctx, workdir, scratch, STEPS, None, jobs)
            t_save = time.perf_counter()
            record = merge_worker_files(scratch, workdir)
            shutil.rmtree(scratch)
            timings["save"] = round(time.perf_counter() - t_save, 3)
        else:
            dev = device_of(ctx.opts)
            pin_triton_ptxas()
            model = build_model_for(ctx, dev, self.name)
            from ...models.rows import register_ops

            register_ops(model)  # before Dynamo traces it
            timings = {"model": round(time.perf_counter() - t_build, 3)}
            record = build_here(model, ctx.opts, ctx.recipe, dev, path, workdir, timings)
        timings["wall"] = round(time.perf_counter() - t_build, 3)
        ctx.phases.update({f"inductor_{k}_seconds": v for k, v in timings.items()})
        meta = {
            "format": FORMAT,
            "mode": inductor_mode(ctx.opts),
            "warm_path": path,
            **record,
            "compile_seconds": timings,
            # How the build was scheduled: not a key factor, a load reads either layout.
            "build_jobs": jobs,
        }
        (workdir / RECORD).write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
        return meta

    def worker_step(
        self, model: Any, job: StepJob, dev: Any, config: Callable[[], Any], timings: dict
    ) -> str:
        """One step in a build worker (shared/build_jobs.py); its saved function."""
        return build_in_worker(model, job, dev, config, timings)

    def load(self, ctx: BuildContext, entry_dir: Path, meta: dict[str, Any]) -> StepRunner:
        path = meta.get("warm_path", "megacache")
        mega = entry_dir / MEGACACHE
        if path == "megacache" and not mega.is_file():
            raise BackendError(f"entry {entry_dir} has no {MEGACACHE}: rebuild it with --force")
        if path == "aot_compile":
            for f in STEP_FILES.values():
                if not (entry_dir / f).is_file():
                    raise BackendError(f"entry {entry_dir} has no {f}: rebuild it with --force")
        pin_triton_ptxas()  # before any Triton key is made: the build's ptxas (torch_private)
        if is_cuda(ctx.opts.device):
            prefetch_triton_key()  # hashed beside the device and weights set-up
        # Pinning imports most of Inductor: a probe tells it from the CUDA context.
        ctx.phases["compiler_ready"] = time.perf_counter()
        dev = device_of(ctx.opts)
        model = build_model_for(ctx, dev, self.name)
        from ...models.rows import register_ops

        register_ops(model)  # the steps loaded (or compiled) call acache's op
        scope = partial(load_scope, ctx.memo_dir)
        with scope():
            return self._load_steps(ctx, entry_dir, path, model, dev, scope)

    def _load_steps(
        self, ctx: BuildContext, entry_dir: Path, path: str, model: Any, dev: Any, scope: Any
    ) -> StepRunner:
        """Install the carried files, then compile (megacache) or deserialize
        (aot_compile, the pass steps at their first call) the steps and run them once."""
        import torch

        install_compiled_files(entry_dir / KERNELS, device_index(ctx.opts.device))
        ctx.phases["files_installed"] = time.perf_counter()
        # One megacache from a serial build, one per step from workers (compiling.py).
        for name in (MEGACACHE, *(step_megacache(step) for step in STEPS)):
            if (entry_dir / name).is_file():
                torch.compiler.load_cache_artifacts((entry_dir / name).read_bytes())
        ctx.phases["cache_loaded"] = time.perf_counter()
        if path == "megacache":
            prefill, extend, decode = compile_steps(model, ctx.opts, ctx.recipe, dev)
            ctx.phases["artifact_ready"] = time.perf_counter()
            return StepRunner(
                ctx.recipe, extend, decode, dev, fresh=prefill, keepalive=model,
                kv_len_hint=True, kv_buckets=kv_buckets_of(model),
            )  # fmt: skip
        prefill, extend, decode = load_aot_steps(
            model, entry_dir, ctx.recipe, dev, scope, ctx.phases
        )
        ctx.phases["steps_loaded"] = time.perf_counter()
        info: dict[str, Any] = {"cuda_graph": False}
        if compile_options(ctx.opts).get("triton.cudagraphs"):
            # The modes' CUDA graphs, which the saved functions were compiled without.
            examples = decode_examples(ctx.recipe, dev, kv_buckets_of(model))
            decode, info = cuda_graph_step(decode, examples)
        ctx.phases["artifact_ready"] = time.perf_counter()
        return StepRunner(
            ctx.recipe, extend, decode, dev, fresh=prefill, keepalive=model, info=info,
            kv_len_hint=True, kv_buckets=kv_buckets_of(model),
        )  # fmt: skip


@contextlib.contextmanager
def load_scope(memo_dir: Path | None) -> Iterator[None]:
    """What a load runs its steps in, and a pass step opened after it too: the tuning
    results kept (autotune_cache.py) and the CPU ISA verdicts kept (cpu_isa.py)."""
    with inductor_tuning_results_kept(), isa_verdicts_kept(memo_dir):
        yield


def load_aot_steps(
    model: Any, entry_dir: Path, recipe: Any, dev: Any, scope: Any, stamps: dict[str, float]
) -> tuple[Any, Any, Any]:
    """(prefill, extend, decode) step callables over ``model`` from the entry's saved
    functions. All are read here, while the store's reader lock holds the verified
    entry; decode is deserialized and run once, so its one-time costs land in the load.
    The pass steps are deserialized at their first call (steps.LAZY_STEPS), inside
    ``scope()``, the scope the load runs in (load_scope). ``stamps`` gets
    ``steps_read`` and ``steps_opened`` (the eager steps deserialized, before their run)."""
    import torch

    register_model_ops(model)
    saved = {step: (entry_dir / STEP_FILES[step]).read_bytes() for step in STEPS}
    stamps["steps_read"] = time.perf_counter()

    def open_step(step: str) -> Any:
        compiled = load_compiled_step(saved[step])
        del saved[step]  # opened: the bytes are not needed again
        return lambda *inputs: compiled(model, *inputs)

    steps = {step: opened_when_used(step, partial(open_step, step), scope) for step in STEPS}
    stamps["steps_opened"] = time.perf_counter()
    with torch.no_grad():
        for step, call in steps.items():
            if not isinstance(call, LazyStep):
                call(*example_inputs(recipe, dev, step, kv_buckets_of(model)))
    sync(dev)
    return steps["prefill"], steps["extend"], steps["decode"]


BACKEND = InductorBackend()
