"""The probe's path for a user module (``--recipe pkg.mod:factory``): one load, timed calls.

Phases are the probe's (probe.py, measure/phases.py); for a module they mean:

``load_called``     the factory is about to run (the module is built with its weights)
``entry_ready``     the store returned the entry: the factory, the key (no tracing)
                    and the lookup, or the whole build on a miss
``weights_ready`` / ``artifact_ready``  the module backend's stamps
``first_result``    the first call on the example inputs returned, device synchronized
``first_request``   the first warm-up call after it
``done``            the timed calls are over

``steady.request_s`` holds one latency per timed call, so coldstart's request
latency and break-even read a module's calls as they read an LLM's requests;
the parent pools them with bench.summarize_module.
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any


def measure(args: argparse.Namespace, stamps: dict[str, float]) -> tuple[dict[str, Any], Any]:
    """(the probe's result fields, the torch device) for a module spec."""
    import torch

    from ...api import module as module_api
    from ...api import module_options
    from ...backends.base import get_module_backend
    from ...store.local import LocalStore
    from .recording import RecordingStore
    from .timing import measure_calls, sync

    get_module_backend(args.backend)
    stamps["imports_done"] = time.perf_counter()
    stamps["load_called"] = time.perf_counter()
    choices = args.choices
    spec = module_api.spec_of(args.recipe, choices, batch=args.batch)
    dev = torch.device(spec.device)
    sync(dev)
    stamps["model_ready"] = time.perf_counter()
    store = RecordingStore(
        LocalStore(args.cache_dir, allow_shared_root=args.allow_shared_root), stamps
    )
    options = module_options(choices)
    batch = spec.inputs[0].shape[0] if spec.inputs and spec.inputs[0].shape else 1
    result: dict[str, Any] = {
        "schema": 1,
        "ok": True,
        "recipe": args.recipe,
        "kind": "module",
        "backend": args.backend,
        "device": choices.device,
        "dtype": choices.dtype,
        "mode": choices.mode,
        "seed": choices.seed,
        "inputs": [s.describe() for s in spec.inputs],
        "batch": batch,
        "pid": os.getpid(),
    }
    if args.build_only:
        res, _ = module_api.compile_with_result(spec, args.backend, options=options, store=store)
        result.update(built=res.built, entry_source=res.source, key=res.key)
        stamps["done"] = time.perf_counter()
        return result, dev
    phases: dict[str, float] = {}
    res, compiled = module_api.compile_with_result(
        spec, args.backend, options=options, store=store, phases=phases,
        build_on_miss=not args.no_build,
    )  # fmt: skip
    x = spec.example_inputs
    compiled(*x)
    sync(dev)
    stamps["first_result"] = time.perf_counter()
    steady = measure_calls(compiled, x, iters=args.iters, warmup=args.warmup, device=dev)
    stamps["first_request"] = steady.pop("first_request_end")
    stamps["done"] = time.perf_counter()
    for k in ("entry_ready", "weights_ready", "artifact_ready"):
        stamps[k] = phases.pop(k)
    durations = {k: v for k, v in phases.items() if k.endswith(("_seconds", "_s"))}
    stamps.update({k: v for k, v in phases.items() if k not in durations})
    result.update(
        backend_durations=durations,
        built=res.built,
        entry_source=res.source,
        key=res.key,
        entry_bytes=res.bytes,
        entry_build_seconds=getattr(res.entry, "build_seconds", None),
        steady={**steady, "batch": batch},
    )
    return result, dev
