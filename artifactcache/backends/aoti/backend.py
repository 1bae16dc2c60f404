"""aoti: torch.export + AOTInductor, three weight-stripped packages sharing one model.

The artifact (see docs/backends.md): the steps of steps.STEP_KINDS (a prompt's first
pass, causal over its own keys; a pass that reads the cache; decode), each exported
with ``torch.export`` and compiled with ``aoti_compile_and_package`` using
``aot_inductor.package_constants_in_so=False``. The passes' token count (up to
prefill_len) and the KV-read length of extend and decode (the size of their ``kv_pos``
input, models/common.py) are dynamic dimensions of the export, so one package per step
serves every prompt length and every length bucket. Each .pt2 is unpacked into the
entry at build time (``prefill/``, ``extend/``, ``decode/``) and the archive dropped,
so a load never extracts anything: it dlopens the ``.so`` straight from the entry.

Constants are supplied at load time. AOTInductor treats every parameter *and*
buffer as a constant, including the KV caches (which the graphs mutate in place)
and the RoPE table. load() builds our model once and hands the same tensors to
every runner with ``update_constant_buffer(..., user_managed=True)``: the
runners keep pointers to our storage instead of copying, so prefill writes the
KV cache that decode then reads, and the weights exist once in memory. Because
no weights are in the artifact, ``weights_external = True``: api/recipe.py keys the
entry by architecture, and one build serves every checkpoint of that shape.

The runner is constructed directly (``torch._C._aoti.AOTIModelContainerRunner
Cpu/Cuda``, see torch_private.py) rather than through ``aoti_load_package``, which
extracts the whole archive to a temp dir on every load. On CUDA a context is
created before the .so is loaded (``runner.device_of``), and the wrapper is built
with a compiler whose C++ runtime matches the libstdc++ the loading process uses
(cxx.py): a mismatch segfaults at the first call.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import time
import zipfile
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import Any

from ...choices import BuildChoices
from ...code_factors import codegen_factors
from ...devices import device_type, is_cuda
from ...errors import BackendError, BackendUnavailable
from ...keys import toolchain_fingerprint
from ...kv_buckets import kv_len_range
from ...store.entry import entry_file
from ..base import BuildContext
from ..shared.build_jobs import StepJob, build_concurrently
from ..shared.build_plan import planned_jobs
from ..shared.cpu_clock import children_cpu_seconds
from ..shared.cpu_isa import isa_verdicts_kept, prefill_isa_verdicts
from ..shared.cuda_graph import cuda_graph_step
from ..shared.cxx import build_record, check_runtime, choose_cxx, missing_compiler, runtime_id
from ..shared.model_options import check_model_options, check_recipe_options, model_factors
from ..shared.runner import (
    StepRunner,
    build_model_for,
    check_device_dtype,
    device_of,
)
from ..shared.steps import (
    STEP_KINDS,
    decode_examples,
    dynamic_ranges,
    example_inputs,
    kv_buckets_of,
    prefill_tokens_range,
)
from ..shared.torch_private import (
    aoti_container_runner,
    aoti_runner_missing,
    declare_int_arrays_at_each_use,
    export_user_error,
    inductor_config_kept,
    release_export_state,
)
from ..shared.tuning import check_extra, decode_only, inductor_tuning
from .options import (
    AOTI_EXTRA_KEYS,
    check_wrapper_opt_supported,
    wrapper_configs,
    wrapper_opt,
)

RECORD = "aoti.json"
FORMAT = 2  # 2: three steps (prefill, extend, decode)
STEPS = STEP_KINDS
MODES = ("default", "max-autotune")
PREFILL_JOIN_S = 60.0  # at most this long after a failed build for the ISA verdicts' thread


def _mode(opts: BuildChoices) -> str:
    return opts.mode or "default"


def _codegen_configs(opts: BuildChoices) -> dict[str, Any]:
    """The Inductor config a build passes, but the compiler: all of it is a key factor."""
    cfg: dict[str, Any] = {
        # The weight-stripped package: no constants in the .so, none beside it.
        "aot_inductor.package_constants_in_so": False,
    }
    if _mode(opts) == "max-autotune":
        cfg["max_autotune"] = True
    # Without it every M=1 decode matmul goes to cuBLAS (tuning.py says why).
    cfg.update(inductor_tuning(opts))
    cfg.update(wrapper_configs(opts))
    return cfg


def inductor_configs(opts: BuildChoices, memo_dir: Path | None = None) -> dict[str, Any]:
    cfg = _codegen_configs(opts)
    cxx = choose_cxx(memo_dir=memo_dir)
    if cxx:
        # Build with the compiler whose libstdc++ the loading process uses (cxx.py says why).
        cfg["cpp.cxx"] = cxx
    return cfg


def export_dynamic_shapes(
    recipe: Any, step: str, *, strict: bool = True, kv_buckets: bool = True
) -> Any:
    """torch.export's dynamic_shapes for a step's inputs (steps.example_inputs' order):
    the passes' token count and the KV-read length of extend and decode; None if static.

    ``strict``: named Dims, which export refuses unless it proves every guard over the
    whole range; else ``Dim.DYNAMIC`` over the same ranges, under which it keeps a guard
    it cannot prove as a runtime check.
    """
    import torch

    def dim(name: str, span: tuple[int, int] | None) -> Any:
        if span is None:
            return None
        if strict:
            return torch.export.Dim(name, min=span[0], max=span[1])
        return torch.export.Dim.DYNAMIC(min=span[0], max=span[1])

    tokens = dim("tokens", prefill_tokens_range(recipe) if step != "decode" else None)
    kv_len = dim("kv_len", kv_len_range(recipe.shapes.max_seq_len, kv_buckets))
    per_token = (None, None) if tokens is None else ({1: tokens}, {0: tokens})
    if step == "prefill":
        return None if tokens is None else per_token
    if tokens is None and kv_len is None:
        return None
    # idx, input_pos, row_start (static), kv_pos
    return (*per_token, None, None if kv_len is None else {0: kv_len})


def exported_range(ep: Any, index: int, dim: int) -> tuple[int, int] | None:
    """The range an exported step admits for dimension ``dim`` of its user input
    ``index``; None when export made it a constant."""
    name = ep.graph_signature.user_inputs[index]
    node = next((n for n in ep.graph.nodes if n.op == "placeholder" and n.name == name), None)
    if node is None:  # a graph whose signature names no such placeholder: no range known
        return None
    size = node.meta["val"].shape[dim]
    if isinstance(size, int):
        return None
    vr = ep.range_constraints.get(size.node.expr)
    return (int(vr.lower), int(vr.upper)) if vr is not None else None


def safe_extract(archive: Path, dest: Path) -> list[str]:
    """Unpack a .pt2 (a zip we just wrote) refusing absolute or '..' member names."""
    names = []
    with zipfile.ZipFile(archive) as z:
        for info in z.infolist():
            p = PurePosixPath(info.filename)
            if p.is_absolute() or ".." in p.parts:
                raise BackendError(f"{archive}: unsafe member name {info.filename!r}")
            if info.is_dir():
                continue
            target = dest.joinpath(*p.parts)
            target.parent.mkdir(parents=True, exist_ok=True)
            with z.open(info) as src, open(target, "wb") as out:
                shutil.copyfileobj(src, out, 1 << 20)
            names.append(str(p))
    return names


def share_constants(runner: Any, state: dict[str, Any], step: str) -> int:
    """Point the runner's constants at our model's tensors (zero copies)."""
    fqns = runner.get_constant_names_to_original_fqns()
    cmap = {}
    for name, fqn in fqns.items():
        t = state.get(fqn)
        if t is None:
            raise BackendError(
                f"the {step} package needs constant {fqn!r}, which the model does not have: "
                "rebuild the entry with --force"
            )
        cmap[name] = t
    try:
        # (tensor_map, use_inactive, validate_full_updates, user_managed)
        runner.update_constant_buffer(cmap, False, True, True)
    except TypeError:
        import torch

        # Without user_managed each runner would copy the KV cache, and decode
        # would never see what prefill wrote.
        raise BackendUnavailable(
            f"torch {torch.__version__} cannot share AOTInductor constants "
            "(update_constant_buffer has no user_managed argument); use torch >= 2.8"
        ) from None
    return len(cmap)


def export_step(model: Any, args: tuple[Any, ...], recipe: Any, step: str) -> Any:
    """torch.export of one step; a refused dynamic dimension is a one-line BackendError.

    torch.export raises UserError (CONSTRAINT_VIOLATION) when the KV-length range it was
    given does not satisfy a guard some kernel path adds (seen on CUDA with torch 2.11
    for a tiny model); its message is many lines of symbolic shapes.
    """
    import torch

    from ...models.rows import register_ops

    register_ops(model)  # torch.export refuses to register an op inside its trace
    UserError = export_user_error()
    buckets = kv_buckets_of(model)
    try:
        shapes = export_dynamic_shapes(recipe, step, kv_buckets=buckets)
        return torch.export.export(model, args, dynamic_shapes=shapes, strict=False)
    except UserError as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    refused = BackendError(
        f"torch.export refused the {step} step's dynamic lengths ({first}); "
        f"try another --max-seq-len (now {recipe.shapes.max_seq_len})"
    )
    # A guard export could not prove over the range (on the H200, torch 2.11, CUDA:
    # min(16*L, 32*L) == 16*L, true for every L > 0): Dim.DYNAMIC keeps such a guard as
    # a runtime check instead, and the step is kept only if its range is still whole.
    try:
        shapes = export_dynamic_shapes(recipe, step, strict=False, kv_buckets=buckets)
    except TypeError:  # a torch whose Dim.DYNAMIC takes no range
        raise refused from None
    try:
        ep = torch.export.export(model, args, dynamic_shapes=shapes, strict=False)
    except UserError:
        raise refused from None
    for (index, dim), span in dynamic_ranges(recipe, step, buckets).items():
        got = exported_range(ep, index, dim)
        if got is None or got[0] > span[0] or got[1] < span[1]:
            if index != -1:  # idx or input_pos; kv_pos is the last input
                what, fix = "token count", f"[shapes].prefill_len ({recipe.shapes.prefill_len})"
            else:
                what, fix = "KV length", f"--max-seq-len (now {recipe.shapes.max_seq_len})"
            raise BackendError(
                f"torch.export kept the {step} step's {what} only over {got} of {span}; "
                f"try another {fix}"
            )
    return ep


def build_step(
    model: Any,
    recipe: Any,
    dev: Any,
    step: str,
    cfg: dict[str, Any] | Callable[[], dict[str, Any]],
    workdir: Path,
    scratch: Path,
    timings: dict[str, float],
    memo_dir: Path | None = None,
) -> str:
    """Export and compile one step into ``workdir/<step>/``; its .so, relative to workdir.

    ``cfg``: the Inductor config, or a callable that returns it (called after the
    export, so a worker process exports while its parent still probes the compiler).
    Records ``<step>_export``, ``<step>_compile`` and ``<step>`` (the two together),
    ``<step>_probe_wait`` where it waited for the config, and this process's CPU seconds
    (all its threads, not its compile subprocesses) in ``<step>_export_cpu`` and
    ``<step>_compile_cpu``: a phase whose CPU seconds fall far under its wall seconds
    waited for a core (steps at once on a busy host) or for its children rather than
    doing more work. ``<step>_compile_children_cpu`` is the children's share (g++ runs;
    shared/cpu_clock.py). The wrapper compile reads Inductor's CPU ISA verdicts from
    ``memo_dir`` (shared/cpu_isa.py) instead of probing each candidate.
    """
    import torch

    t0, c0 = time.perf_counter(), time.process_time()
    args = example_inputs(recipe, dev, step, kv_buckets_of(model))
    declare_int_arrays_at_each_use()
    with torch.no_grad(), inductor_config_kept():
        ep = export_step(model, args, recipe, step)
        timings[f"{step}_export"] = round(time.perf_counter() - t0, 3)
        timings[f"{step}_export_cpu"] = round(time.process_time() - c0, 3)
        waited = 0.0
        if callable(cfg):
            t_wait = time.perf_counter()
            cfg = cfg()
            waited = time.perf_counter() - t_wait
            timings[f"{step}_probe_wait"] = round(waited, 3)
        t_compile, c_compile = time.perf_counter(), time.process_time()
        children_compile = children_cpu_seconds()
        with isa_verdicts_kept(memo_dir):
            pkg = torch._inductor.aoti_compile_and_package(
                ep,
                package_path=str(scratch / f"{step}.pt2"),
                inductor_configs=decode_only(cfg, step),
            )
    del ep
    # Members are under "<step>/" (the package's stem), so each step
    # lands in its own folder of the entry.
    names = safe_extract(Path(pkg), workdir)
    sos = [n for n in names if n.endswith(".so")]
    if len(sos) != 1 or not sos[0].startswith(f"{step}/"):
        raise BackendError(f"the {step} package holds .so files {sos}, expected one")
    done = time.perf_counter()
    timings[f"{step}_compile"] = round(done - t_compile, 3)
    timings[f"{step}_compile_cpu"] = round(time.process_time() - c_compile, 3)
    timings[f"{step}_compile_children_cpu"] = round(children_cpu_seconds() - children_compile, 3)
    timings[step] = round(done - t0 - waited, 3)
    return sos[0]


class AotiBackend:
    name = "aoti"
    weights_external = True

    def available(self, opts: BuildChoices) -> tuple[bool, str]:
        import torch

        # Not `torch._inductor.aoti_compile_and_package`: touching torch._inductor imports
        # Inductor (~1.5 s), which a warm load never needs (it only uses torch._C._aoti).
        if importlib.util.find_spec("torch._inductor") is None:
            return False, f"torch {torch.__version__} has no AOTInductor"
        if reason := missing_compiler():
            return False, reason  # every AOTInductor wrapper is C++
        if is_cuda(opts.device) and not torch.cuda.is_available():
            return False, "torch sees no CUDA GPU; use --device cpu"
        if reason := aoti_runner_missing(device_type(opts.device)):
            return False, reason
        return True, ""

    def check_options(self, opts: BuildChoices) -> None:
        check_device_dtype(opts)
        mode = _mode(opts)
        if mode not in MODES:
            raise BackendError(f"unknown aoti mode {mode!r}: choose one of {', '.join(MODES)}")
        check_extra(self.name, opts, AOTI_EXTRA_KEYS)
        check_model_options(self.name, opts)
        wrapper_opt(opts)  # the level only: torch's support is checked by build()

    def check_recipe(self, recipe: Any, opts: BuildChoices) -> None:
        check_recipe_options(self.name, recipe, opts)

    def factors(self, recipe: Any, opts: BuildChoices) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "dtype": opts.dtype,
            "device": device_type(opts.device),
            "mode": _mode(opts),
            **model_factors(self.name, recipe, opts),
            "constants": "user-managed",
            # The compiler is not here: the C++ runtime in toolchain stands for it (below).
            "codegen": codegen_factors(_codegen_configs(opts)),
        }

    def toolchain(self, opts: BuildChoices) -> dict[str, Any]:
        names = ("torch", "triton") if is_cuda(opts.device) else ("torch",)
        # The C++ runtime decides whether the wrapper .so loads (cxx.py). Key on the
        # runtime, not on the compiler's path, so a deploy host without g++ computes
        # the key of the entry the build host pushed; the compiler goes in the manifest.
        return {**toolchain_fingerprint(names), "libstdcxx": runtime_id()}

    def build(self, ctx: BuildContext, workdir: Path) -> dict[str, Any]:
        t_build = time.perf_counter()
        check_wrapper_opt_supported(ctx.opts)
        jobs = planned_jobs(ctx.recipe, ctx.opts, len(STEPS))  # a bad ACACHE_BUILD_JOBS: one line
        scratch = workdir / ".pt2"
        scratch.mkdir()
        memo_dir = ctx.memo_dir
        cfg: dict[str, Any] = {}
        prefills = []

        def probe() -> dict[str, Any]:
            cfg.update(inductor_configs(ctx.opts, memo_dir))  # probes compilers not probed before
            if jobs > 1 and memo_dir is not None:  # the ISA verdicts, while workers export
                prefills.append(prefill_isa_verdicts(cfg.get("cpp.cxx"), memo_dir))
            return cfg

        try:
            if jobs > 1:
                steps, timings = build_concurrently(
                    self.name, ctx, workdir, scratch, STEPS, probe, jobs
                )
            else:
                steps, timings = self._build_serially(ctx, workdir, scratch, probe)
        finally:
            # Long done when the steps are. After a failed step, a bounded wait: while
            # it runs, torch's check_build is replaced and its Inductor config patched.
            for thread in prefills:
                thread.join(timeout=PREFILL_JOIN_S)
        shutil.rmtree(scratch)  # the unpacked files are all load needs
        timings["wall"] = round(time.perf_counter() - t_build, 3)
        # Where a build's time goes, for the probe's report (durations, not stamps).
        ctx.phases.update({f"aoti_{k}_seconds": v for k, v in timings.items()})
        meta = {
            "format": FORMAT,
            "mode": _mode(ctx.opts),
            "steps": steps,
            "compile_seconds": timings,
            # How the build was scheduled: not a key factor, the files are the same.
            "build_jobs": jobs,
            "weights": "external (user-managed constants)",
            **build_record(cfg.get("cpp.cxx"), memo_dir),
        }
        (workdir / RECORD).write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
        return meta

    def worker_step(
        self, model: Any, job: StepJob, dev: Any, config: Callable[[], Any], timings: dict
    ) -> str:
        """One step in a build worker (build_jobs.py); its .so, relative to the workdir."""
        job.mark("exporting")
        return build_step(
            model,
            job.recipe,
            dev,
            job.step,
            config,
            job.workdir,
            job.scratch,
            timings,
            job.memo_dir,
        )

    def _build_serially(
        self, ctx: BuildContext, workdir: Path, scratch: Path, probe: Callable[[], dict[str, Any]]
    ) -> tuple[dict[str, str], dict[str, float]]:
        """Both steps in this process from one model, one after the other."""
        timings: dict[str, float] = {}
        t0 = time.perf_counter()
        dev = device_of(ctx.opts)
        model = build_model_for(ctx, dev, self.name)
        timings["model"] = round(time.perf_counter() - t0, 3)
        t0 = time.perf_counter()
        cfg = probe()
        timings["compiler_probe"] = round(time.perf_counter() - t0, 3)
        steps: dict[str, str] = {}
        for step in STEPS:
            steps[step] = build_step(
                model, ctx.recipe, dev, step, cfg, workdir, scratch, timings, ctx.memo_dir
            )
        del model
        release_export_state()
        return steps, timings

    def load(self, ctx: BuildContext, entry_dir: Path, meta: dict[str, Any]) -> StepRunner:
        steps = meta.get("steps")
        if not (isinstance(steps, dict) and all(s in steps for s in STEPS)):
            raise BackendError(f"entry {entry_dir} has no step libraries: rebuild it with --force")
        # The manifest names the libraries: never dlopen anything outside the verified entry.
        paths = {s: entry_file(entry_dir, steps[s]) for s in STEPS}
        dev = device_of(ctx.opts)  # CUDA context first: see the module docstring
        check_runtime(meta)  # before any dlopen: a C++ runtime mismatch segfaults
        model = build_model_for(ctx, dev, self.name)
        state = dict(model.named_parameters(remove_duplicate=False))
        state.update(dict(model.named_buffers(remove_duplicate=False)))
        runners: dict[str, Any] = {}

        def open_step(s: str) -> Any:
            """A runner on the entry's .so, bound to our tensors; its step callable."""
            runners[s] = runner = aoti_container_runner(paths[s], dev)
            share_constants(runner, state, s)
            return lambda *inputs: runner.run(list(inputs))

        prefill, extend, decode = (open_step(s) for s in STEPS)
        t0 = time.perf_counter()
        # Inductor's reduce-overhead mode replays CUDA graphs; an AOTI runner has
        # none of its own, so decode gets one here (load-time only: not in the key).
        # A failed capture leaves that container holding a captured event: the
        # fallback is a fresh one.
        decode, info = cuda_graph_step(
            decode,
            decode_examples(ctx.recipe, dev, kv_buckets_of(model)),
            fresh_step=lambda: open_step("decode"),
        )
        ctx.phases["cuda_graph_seconds"] = time.perf_counter() - t0
        ctx.phases["artifact_ready"] = time.perf_counter()
        return StepRunner(
            ctx.recipe,
            extend,
            decode,
            dev,
            fresh=prefill,
            keepalive=(model, runners),
            info=info,
            kv_len_hint=True,
            kv_buckets=kv_buckets_of(model),
        )


BACKEND = AotiBackend()
