"""`acache bench`'s runs: one probe per batch size, each summarized by bench.py.

- ``run_bench``: a recipe. Each batch size B is measured on the artifact built for
  max_batch = B (built on a miss), or on the choices' max_batch one; every size is
  checked (shapes, memory, the backend's availability) before any probe runs or
  anything is built.
- ``run_module_bench``: a model spec (pkg.mod:factory); each batch size sets
  dimension 0 of every input (None: the inputs as given).

The measuring happens in fresh probe processes (child/probe.py), never in this one;
bench.py turns their timings into latency, tokens/s and rooflines. Nothing here
imports torch. ``progress(message, done, total)`` is told before each probe.
"""

from __future__ import annotations

import dataclasses
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..choices import BuildChoices
from ..errors import MeasureError
from . import bench, coldstart, compare, prefill
from .compare import Progress


def _quiet(_msg: str, _done: int, _total: int) -> None:
    pass


def _probe_flags(allow_shared_root: bool) -> list[str]:
    return ["--allow-shared-root"] if allow_shared_root else []


def _spawn(ps: coldstart.ProbeSpec, cache_dir: Path | None) -> dict[str, Any]:
    """One probe; its log is removed on success and kept (and named) on failure."""
    log = Path(tempfile.mkstemp(prefix="acache-bench-", suffix=".log")[1])
    probe = coldstart.spawn_probe(ps, cache_dir, log_path=log)  # kept on failure
    log.unlink(missing_ok=True)
    return probe


def run_bench(
    recipe: str,
    backend: str,
    choices: BuildChoices,
    sizes: Sequence[int] = (1,),
    *,
    new_tokens: int | None = None,
    iters: int = 10,
    warmup: int = 2,
    cache_dir: Path | None = None,
    allow_shared_root: bool = False,
    progress: Progress | None = None,
    prompt_lens: Sequence[int] = (),
) -> list[dict[str, Any]]:
    """One bench result per batch size of ``sizes``, in order (bench.summarize's dict
    plus what was measured: recipe, backend, device, dtype, mode, quant, entry, ...).

    With ``prompt_lens``, the probe of the one-row artifact also times the first token
    of a prompt of each length: its result's ``prompt_lengths``. Only there: on a wider
    artifact a lone prompt pays for every padding row, and its passes are shorter
    (config.default_prefill_len), so its FLOP roofline would not be the prompt's."""
    choices.check_scope("recipe")
    if not sizes:
        raise MeasureError("--batch needs at least one batch size, e.g. 1,8,32")
    # Every size is checked (shapes, memory) before any probe runs or anything is built.
    runs = []
    for b in sizes:
        rows = b if choices.max_batch is None else choices.max_batch
        spec = compare.spec_for([recipe], [backend], choices.replace(max_batch=rows),
                                new_tokens=new_tokens, iters=iters, warmup=warmup)  # fmt: skip
        rec = compare.validate(spec)[recipe]
        bench.check_batch(rec, b)  # a batch past --max-batch: one line, nothing built
        bench.resolve_new_tokens(rec, new_tokens, b)
        prefill.check_prompt_lens(rec, prompt_lens)  # N + 1 <= max_seq_len: nothing built
        runs.append((b, spec, rec))
    if prompt_lens and all(spec.choices.max_batch != 1 for _, spec, _ in runs):
        raise MeasureError(
            "--prompt-len times the first token on the one-row artifact: add 1 to --batch "
            "(without --max-batch)"
        )
    compare.require_available(runs[0][1], backend)
    say = progress or _quiet
    results = []
    for i, (b, spec, rec) in enumerate(runs):
        timed = prompt_lens if spec.choices.max_batch == 1 else ()
        lens = f", first token of {len(timed)} prompt lengths" if timed else ""
        say(
            f"bench {recipe}/{backend} batch {b} (max_batch {spec.choices.max_batch}): "
            f"load (builds on a miss), {spec.iters} timed requests{lens}", i, len(runs),
        )  # fmt: skip
        results.append(
            _bench_one(recipe, backend, spec, rec, b, cache_dir, allow_shared_root, timed)
        )
    return results


def _bench_one(
    recipe: str, backend: str, spec: compare.CompareSpec, rec: Any, batch: int,
    cache_dir: Path | None, allow_shared_root: bool, prompt_lens: Sequence[int] = (),
) -> dict[str, Any]:  # fmt: skip
    """One probe at one batch size on the artifact of ``spec.choices.max_batch`` rows."""
    ps = dataclasses.replace(
        compare.probe_spec(spec, backend),
        recipe=recipe,
        matmul_flops=True,
        step_latency=True,
        extra_flags=_probe_flags(allow_shared_root),
        batch=batch,
        prompt_lens=tuple(prompt_lens),
    )
    probe = _spawn(ps, cache_dir)
    c = spec.choices
    res = bench.summarize(rec, c.dtype, [probe], batch, quant=c.quant)
    res.update(
        recipe=recipe,
        backend=backend,
        device=c.device,
        dtype=c.dtype,
        mode=spec.modes.get(backend),
        quant=c.quant,
        entry={"built": "built", "pulled": "pulled"}.get(probe.get("entry_source"), "hit"),
        phases=probe["phases"],
        memory=probe["memory"],
        environment=probe["environment"],
        runner_info=probe.get("runner_info", {}),
    )
    return res


def run_module_bench(
    spec_text: str,
    backend: str,
    choices: BuildChoices,
    sizes: Sequence[int | None] = (None,),
    *,
    iters: int = 10,
    warmup: int = 2,
    cache_dir: Path | None = None,
    allow_shared_root: bool = False,
    progress: Progress | None = None,
) -> list[dict[str, Any]]:
    """One result per batch size (None: the inputs' own): latency percentiles, items/s."""
    from ..sources.module import check_cli_spec

    choices.check_scope("module")
    for b in sizes:
        check_cli_spec(spec_text, list(choices.inputs) or None, choices.dtype, b)
    if iters < 1 or warmup < 1:
        raise MeasureError(f"--iters and --warmup must be at least 1, got {iters} and {warmup}")
    say = progress or _quiet
    rows = []
    for i, b in enumerate(sizes):
        ps = coldstart.ProbeSpec(
            recipe=spec_text, backend=backend, choices=choices, iters=iters, warmup=warmup,
            batch=b, extra_flags=_probe_flags(allow_shared_root),
        )  # fmt: skip
        say(f"bench {spec_text}/{backend} batch {b or 'as given'}", i, len(sizes))
        probe = _spawn(ps, cache_dir)
        res = bench.summarize_module([probe])
        res.update(
            recipe=spec_text, backend=backend, device=choices.device, dtype=choices.dtype,
            mode=choices.mode, key=probe.get("key"), phases=probe["phases"], memory=probe["memory"],
            environment=probe["environment"],
        )  # fmt: skip
        rows.append(res)
    return rows
