"""The measurement probe: one fresh process, one load, one JSON line.

Run as ``python -m artifactcache.measure.child.probe --recipe R --backend B ...`` by
measure/coldstart.py (which controls the environment: empty or warm caches). It prints
exactly one JSON line on stdout; everything else anything prints goes to stderr.

Clock: every timestamp is seconds since *process start*, on CLOCK_MONOTONIC.
The parent writes ``time.monotonic()`` into ``ACACHE_PROBE_T0`` immediately
before it spawns us; on Linux ``time.perf_counter()`` reads the same
system-wide clock, so the child's stamps and the parent's are directly
comparable, with nanosecond resolution, and "process start" includes fork,
exec and interpreter start-up, which is what a user waits for. Without that
variable (or on a platform where perf_counter is another clock) we fall back to
the kernel's start time of this process from /proc/self/stat, which only has
clock-tick (10 ms) resolution. Both are recorded; ``t0_source`` says which one
the phases use.

Phases (all in ``phases``; a later phase never precedes an earlier one):

``python_ready``    the interpreter has started and this module is running
``imports_done``    torch, artifactcache.api and the backend module are imported
``load_called``     api.load() was entered (key computation follows)
``entry_ready``     the store returned a verified entry (lookup + digest check,
                    or the whole build on a miss)
``weights_ready``   the backend's weights are on the device (backend stamp)
``artifact_ready``  the artifact is loaded/deserialized/compiled (backend stamp)
``first_result``    the first generated token of the seed prompt (prefill +
                    one greedy pick), device synchronized
``first_request``   the first complete seed request (prefill + N new tokens)
                    after first_result: a lazily compiled decode step shows here
``done``            the steady-state loop is over

``subphases`` holds whatever else the backend stamped in ``context.phases``
plus the probe's own ``store_call``/``build_start``/``build_done``.
"""

from __future__ import annotations

import os
import sys
import time

_PY_READY = time.perf_counter()  # before any heavy import: when our code first ran

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import json  # noqa: E402
import resource  # noqa: E402
import traceback  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

from ...choices import BuildChoices  # noqa: E402
from ..phases import PHASE_ORDER, SCHEMA, T0_ENV  # noqa: E402
from .compiles import compile_report, watch_triton_compiles  # noqa: E402
from .recording import RecordingStore  # noqa: E402


def _proc_start_perf() -> float | None:
    """This process's start on the perf_counter clock, from /proc (10 ms resolution)."""
    try:
        stat = Path("/proc/self/stat").read_text()
        uptime = float(Path("/proc/uptime").read_text().split()[0])
    except OSError:
        return None
    now = time.perf_counter()
    # Field 22 (starttime, clock ticks since boot); the command name in field 2 may
    # contain spaces, so count from the closing parenthesis.
    fields = stat.rsplit(")", 1)[1].split()
    start_ticks = int(fields[19])
    age = uptime - start_ticks / os.sysconf("SC_CLK_TCK")
    return now - age


def _t0() -> tuple[float, str, float | None]:
    """(t0 on the perf_counter clock, its source, the /proc estimate)."""
    proc = _proc_start_perf()
    same_clock = (
        time.get_clock_info("perf_counter").implementation
        == time.get_clock_info("monotonic").implementation
    )
    from ... import settings  # here: nothing more to import before python_ready

    raw = settings.raw(T0_ENV)
    if raw and same_clock:
        try:
            return float(raw), "parent_spawn_monotonic", proc
        except ValueError:
            pass
    if proc is not None:
        return proc, "proc_self_stat", proc
    return _PY_READY, "python_ready", proc  # no better start known: says so in t0_source


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m artifactcache.measure.child.probe")
    p.add_argument("--recipe", required=True)
    p.add_argument("--backend", required=True)
    p.add_argument(
        "--choices-json", dest="choices", type=BuildChoices.from_json, default=BuildChoices(),
        help="the build choices, whole (artifactcache.choices.BuildChoices as JSON)",
    )  # fmt: skip
    p.add_argument("--cache-dir", default=None, help="default: $ACACHE_DIR or the user cache")
    p.add_argument("--new-tokens", type=int, default=None)
    p.add_argument("--iters", type=int, default=3, help="timed steady-state requests")
    p.add_argument("--warmup", type=int, default=1, help="excluded requests after first_result")
    p.add_argument("--no-build", action="store_true", help="fail instead of building on a miss")
    p.add_argument("--build-only", action="store_true", help="build the entry and exit")
    p.add_argument("--copy-bandwidth", action="store_true", help="also measure device copy GB/s")
    p.add_argument("--matmul-flops", action="store_true", help="also measure matmul FLOP/s")
    p.add_argument(
        "--step-latency", action="store_true", help="also time each decode step of one request"
    )
    p.add_argument(
        "--prompt-lens", default="",
        help="also time the first token of a prompt of each of these lengths, e.g. 16,128 "
        "(measure/prefill.py); implies --matmul-flops",
    )  # fmt: skip
    p.add_argument("--allow-shared-root", action="store_true")
    p.add_argument(
        "--batch", type=int, default=None,
        help="a recipe: prompts per timed request (default 1); a model spec: dimension 0 "
        "of every input",
    )  # fmt: skip
    return p.parse_args(argv)


def _memory(dev: Any) -> dict[str, Any]:
    import torch

    # ru_maxrss is KiB on Linux (bytes on macOS).
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    rss_bytes = rss if sys.platform == "darwin" else rss * 1024
    out: dict[str, Any] = {"peak_rss_bytes": rss_bytes}
    if dev.type == "cuda":
        out["peak_device_allocated_bytes"] = int(torch.cuda.max_memory_allocated(dev))
        out["peak_device_reserved_bytes"] = int(torch.cuda.max_memory_reserved(dev))
    return out


def _environment(dev: Any) -> dict[str, Any]:
    import platform

    import torch

    from ...keys import package_version

    # Read from metadata: importing triton would cost start-up time, and it is absent
    # from CPU builds of torch.
    env: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "triton": package_version("triton"),
    }
    if dev.type == "cuda":
        env["gpu"] = torch.cuda.get_device_name(dev)
        env["cuda"] = torch.version.cuda
    env["torch_threads"] = torch.get_num_threads()
    return env


def run(args: argparse.Namespace, t0: float, t0_source: str, proc: float | None) -> dict[str, Any]:
    stamps: dict[str, float] = {"python_ready": _PY_READY}
    from ...devices import is_cuda
    from ...sources.module import is_module_spec

    if args.backend == "inductor" and is_cuda(args.choices.device):
        watch_triton_compiles()  # its load imports triton anyway: an import, not a cost
    if is_module_spec(args.recipe):
        from .module import measure

        result, dev = measure(args, stamps)
        return _finish(args, result, stamps, dev, t0, t0_source, proc)
    import torch

    from ... import api
    from ...backends.base import BuildContext, get_backend
    from ...recipes import load_recipe
    from ...store.local import LocalStore
    from .. import bench, prefill
    from . import timing

    get_backend(args.backend)  # imports the backend module: part of "imports done"
    stamps["imports_done"] = time.perf_counter()

    choices = args.choices
    recipe = bench.with_bench_prompt(
        load_recipe(args.recipe).with_shapes(
            max_seq_len=choices.max_seq_len, max_batch=choices.max_batch
        )
    )
    prompt = list(recipe.bench.prompt_ids)
    batch = args.batch or 1
    bench.check_batch(recipe, batch)
    new_tokens = bench.resolve_new_tokens(recipe, args.new_tokens, batch)
    prompt_lens = prefill.parse_prompt_lens(args.prompt_lens) if args.prompt_lens else []
    prefill.check_prompt_lens(recipe, prompt_lens)  # before anything is built
    dev = torch.device(choices.device)
    # The report names every choice but the inputs (a recipe has none).
    common = {k: v for k, v in dataclasses.asdict(choices).items() if k != "inputs"}
    store = RecordingStore(
        LocalStore(args.cache_dir, allow_shared_root=args.allow_shared_root), stamps
    )
    result: dict[str, Any] = {
        "schema": SCHEMA,
        "ok": True,
        "recipe": recipe.name,
        "backend": args.backend,
        **common,
        "prompt_len": len(prompt),
        "max_seq_len": recipe.shapes.max_seq_len,
        "max_batch": recipe.shapes.max_batch,
        "batch": batch,
        "new_tokens": new_tokens,
        "pid": os.getpid(),
        "t0_source": t0_source,
    }
    if args.build_only:
        built = api.build(args.recipe, args.backend, choices, store=store)
        result.update(built=built.built, entry_source=built.source, key=built.key)
        stamps["done"] = time.perf_counter()
    else:
        ctx = BuildContext(recipe=recipe, opts=None, weights=None)  # type: ignore[arg-type]
        stamps["load_called"] = time.perf_counter()
        runner = api.load(
            args.recipe, args.backend, choices, store=store, context=ctx,
            build_on_miss=not args.no_build,
        )  # fmt: skip
        timing.sync(dev)
        backend_stamps = dict(ctx.phases)
        first = runner.generate(prompt, 1)
        timing.sync(dev)
        stamps["first_result"] = time.perf_counter()
        prompts = [prompt] * batch
        steady = timing.measure_requests(
            runner, prompts, new_tokens, iters=args.iters, warmup=args.warmup, device=dev
        )
        if args.step_latency:
            steady["step_s"] = timing.measure_step_latency(runner, prompts, new_tokens, dev)
        stamps["first_request"] = steady.pop("first_request_end")
        stamps["done"] = time.perf_counter()
        if prompt_lens:  # after "done": the phases keep their meaning
            # The peak of the requests above, before long prompts' passes raise it.
            result["memory"] = _memory(dev)
            prompts_n = [prefill.prompt_of_length(recipe, n) for n in prompt_lens]
            result["ttft"] = timing.measure_ttft(
                runner, prompts_n, iters=args.iters, warmup=args.warmup, device=dev
            )
        for k in ("entry_ready", "weights_ready", "artifact_ready"):
            if k not in backend_stamps:
                raise RuntimeError(f"backend {args.backend!r} did not record phase {k!r}")
            stamps[k] = backend_stamps.pop(k)
        # The contract says phases are perf_counter stamps, but a backend may also
        # report a duration there (ort's "session_seconds"): keep those apart.
        durations = {k: v for k, v in backend_stamps.items() if k.endswith(("_seconds", "_s"))}
        stamps.update({k: v for k, v in backend_stamps.items() if k not in durations})
        result["backend_durations"] = durations
        result["runner_info"] = dict(getattr(runner, "info", None) or {})
        if store.entry is not None:  # what the cache holds for this key, and its build time
            result["entry_bytes"] = store.entry.size
            result["entry_build_seconds"] = store.entry.build_seconds
        result.update(
            built=store.source == "built",
            entry_source=store.source,
            first_token=first[0],
            steady=steady,
        )
    return _finish(args, result, stamps, dev, t0, t0_source, proc)


def _finish(
    args: argparse.Namespace,
    result: dict[str, Any],
    stamps: dict[str, float],
    dev: Any,
    t0: float,
    t0_source: str,
    proc: float | None,
) -> dict[str, Any]:
    """Memory, compile report, environment and the phases relative to t0."""
    from . import timing

    result["t0_source"] = t0_source
    # Before the copy test, whose buffers are not the model's (and before --prompt-lens).
    result.setdefault("memory", _memory(dev))
    result["compile"] = compile_report(args.backend, bool(result.get("built")))
    result["environment"] = _environment(dev)
    if args.copy_bandwidth:
        result["copy_bandwidth"] = timing.copy_bandwidth(dev)
    if args.matmul_flops or args.prompt_lens:  # --prompt-lens: the prefill roofline's rate
        result["matmul_flops"] = timing.matmul_flops(dev, args.choices.dtype)
    main_phases = {k: stamps.pop(k) - t0 for k in PHASE_ORDER if k in stamps}
    result["phases"] = main_phases
    result["subphases"] = dict(
        sorted(((k, v - t0) for k, v in stamps.items()), key=lambda kv: kv[1])
    )
    result["proc_start"] = None if proc is None else proc - t0
    return result


def _emit(out_fd: int, obj: dict[str, Any]) -> None:
    os.write(out_fd, (json.dumps(obj, sort_keys=True) + "\n").encode())


def main(argv: list[str] | None = None) -> int:
    t0, t0_source, proc = _t0()
    # Keep stdout for our one JSON line: anything torch or a backend prints goes to stderr.
    out_fd = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    args = _parse(argv)
    from ...errors import AcacheError

    try:
        result = run(args, t0, t0_source, proc)
    except AcacheError as e:
        _emit(
            out_fd, {"schema": SCHEMA, "ok": False, "error": str(e), "error_type": type(e).__name__}
        )
        return 1
    except Exception as e:  # a bug or a crash in a backend: keep the traceback on stderr
        traceback.print_exc()
        msg = " ".join(f"{type(e).__name__}: {e}".split())[:500]
        _emit(out_fd, {"schema": SCHEMA, "ok": False, "error": msg, "error_type": "crash"})
        return 2
    _emit(out_fd, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
