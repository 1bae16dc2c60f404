"""compare: coldstart + bench for every (recipe, backend) pair -> one report.

Work is split into *units*, each saved under ``OUT/units/`` the moment it
finishes, so a long comparison can be resumed (``resume=True``) across several
calls: one eager unit per recipe (the baseline every backend's break-even is
computed against, and the eager column) and one cold+warm unit per other
backend. Steady-state numbers (the bench) come from the warm runs' timed loops,
which happen after the phases are stamped and never affect them.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import re
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import sizing
from ..choices import BuildChoices
from ..devices import is_cuda, parse_device
from ..dtypes import check_dtype
from ..errors import AcacheError, BackendError, BackendUnavailable, MeasureError
from . import bench, coldstart, prefill

Progress = Callable[[str, int, int], None]  # (message, units done, units total)


@dataclass
class CompareSpec:
    recipes: list[str]
    backends: list[str]
    # What every backend builds with (eager too); mode and extra are per backend, below.
    # A recipe's requests are batch 1 whatever choices.max_batch builds for.
    choices: BuildChoices = field(default_factory=BuildChoices)
    runs: int = 3
    builds: int | None = None  # cold runs; None: one per run (coldstart.run_scenarios)
    new_tokens: int | None = None
    iters: int = 10
    warmup: int = 2
    modes: dict[str, str] = field(default_factory=dict)  # backend -> mode
    extras: dict[str, dict[str, Any]] = field(default_factory=dict)  # backend -> --extra options
    timeout: float = coldstart.DEFAULT_TIMEOUT_S
    batch: int | None = None  # module specs: dimension 0 of every input
    # Recipes: also the time to first token of a prompt of each length (measure/prefill.py).
    prompt_lens: tuple[int, ...] = ()


def spec_for(
    recipes: list[str], backends: list[str], choices: BuildChoices, **kw: Any
) -> CompareSpec:
    """A CompareSpec from one BuildChoices: its mode and extras become the one backend's."""
    if len(backends) == 1 and (choices.mode or choices.extra):
        kw.setdefault("modes", {backends[0]: choices.mode} if choices.mode else {})
        kw.setdefault("extras", {backends[0]: dict(choices.extra)} if choices.extra else {})
    shared = choices.replace(mode=None, extra={})
    return CompareSpec(recipes=recipes, backends=backends, choices=shared, **kw)


def parse_list(text: str, what: str) -> list[str]:
    items = [x.strip() for x in text.split(",") if x.strip()]
    if not items:
        raise MeasureError(f"--{what} needs at least one name (comma-separated)")
    if len(set(items)) != len(items):
        raise MeasureError(f"--{what} names one entry twice: {text}")
    return items


def parse_modes(values: list[str]) -> dict[str, str]:
    """``inductor=reduce-overhead,aoti=default`` -> {backend: mode}."""
    out: dict[str, str] = {}
    for v in values:
        for part in filter(None, (x.strip() for x in v.split(","))):
            b, sep, m = part.partition("=")
            if not sep or not b or not m:
                raise MeasureError(f"--modes takes BACKEND=MODE pairs, got {part!r}")
            out[b] = m
    return out


def check_out_dir(out: Path) -> None:
    """The report dir must be creatable and writable: checked before any run."""
    try:
        out.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=out, prefix=".acache-write-test-")
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise MeasureError(f"cannot write to --out {out}: {e.strerror or e}") from None


def validate(spec: CompareSpec) -> dict[str, Any]:
    """Recipes, backends, numbers and shapes; raises before anything is spawned."""
    from ..backends.base import BACKEND_NAMES, get_backend
    from ..recipes import load_recipe

    coldstart.check_builds(spec.runs, spec.builds)
    if spec.iters < 1:
        raise MeasureError(f"--iters must be at least 1, got {spec.iters}")
    if spec.warmup < 1:
        raise MeasureError(f"--warmup must be at least 1, got {spec.warmup}")
    for b in [*spec.backends, *spec.modes, *spec.extras]:
        if b not in BACKEND_NAMES:
            raise BackendError(f"unknown backend {b!r}: choose one of {', '.join(BACKEND_NAMES)}")
    c = spec.choices
    parse_device(c.device)
    check_dtype(c.dtype)
    # A mode or option the backend refuses is the user's mistake, not "unavailable here".
    for name in dict.fromkeys(["eager", *spec.backends, *spec.modes, *spec.extras]):
        get_backend(name).check_options(build_options(spec, name))
    from ..sources.module import check_cli_spec, is_module_spec

    # A module spec maps to None: it has no recipe, and its probe builds the module.
    recipes = {
        r: None
        if is_module_spec(r)
        else bench.with_bench_prompt(
            load_recipe(r).with_shapes(max_seq_len=c.max_seq_len, max_batch=c.max_batch)
        )
        for r in spec.recipes
    }
    if c.inputs and all(rec is not None for rec in recipes.values()):
        raise MeasureError("--input is for a model spec (pkg.mod:factory), not for a recipe")
    if c.max_seq_len is not None and all(rec is None for rec in recipes.values()):
        raise MeasureError("--max-seq-len is for a recipe (an LLM's context), not a model spec")
    if c.quant is not None and any(rec is None for rec in recipes.values()):
        raise MeasureError("--quant is for a recipe (acache's LLM), not a model spec")
    if c.tag is not None and all(rec is None for rec in recipes.values()):
        raise MeasureError("--tag is for a recipe; a model spec keys on compile(..., version=)")
    if spec.prompt_lens and all(rec is None for rec in recipes.values()):
        raise MeasureError("--prompt-len is for a recipe (an LLM's prompt), not a model spec")
    if c.max_batch is not None and all(rec is None for rec in recipes.values()):
        raise MeasureError("--max-batch is for a recipe (an LLM's batch rows), not a model spec")
    for r, rec in recipes.items():
        if rec is None:
            check_cli_spec(r, list(c.inputs), c.dtype, spec.batch)
        else:
            bench.resolve_new_tokens(rec, spec.new_tokens)  # ShapeError / MeasureError
            prefill.check_prompt_lens(rec, spec.prompt_lens)  # N + 1 <= max_seq_len
            for name in dict.fromkeys(["eager", *spec.backends]):
                get_backend(name).check_recipe(rec, build_options(spec, name))  # phi-3 unfused, ...
            if parse_device(c.device)[0] == "cpu":
                # On a GPU the probe checks, before it builds: asking CUDA here would
                # hold a context in this process for the whole measurement.
                sizing.check_fits_memory(rec, c.dtype, c.device)
    if c.weights is not None and not Path(c.weights).exists():
        raise MeasureError(f"--weights {c.weights} does not exist")
    return recipes


def build_options(spec: CompareSpec, backend: str) -> BuildChoices:
    """The BuildChoices the probes of ``backend`` build and load with."""
    return spec.choices.replace(
        mode=spec.modes.get(backend), extra=dict(spec.extras.get(backend, {}))
    )


def availability(spec: CompareSpec) -> dict[str, tuple[bool, str]]:
    """backend -> (ok, reason), from each backend's own available()/check_options()."""
    from ..backends.base import get_backend

    out: dict[str, tuple[bool, str]] = {}
    for name in dict.fromkeys(["eager", *spec.backends]):
        opts = build_options(spec, name)
        try:
            b = get_backend(name)
            b.check_options(opts)
            ok, reason = b.available(opts)
        except AcacheError as e:
            ok, reason = False, str(e)
        out[name] = (ok, reason or "")
    return out


def require_available(spec: CompareSpec, backend: str) -> None:
    """A one-line BackendUnavailable when ``backend`` cannot run here."""
    ok, reason = availability(spec)[backend]
    if not ok:
        raise BackendUnavailable(f"backend {backend!r} is unavailable here: {reason}")


def probe_spec(spec: CompareSpec, backend: str) -> coldstart.ProbeSpec:
    """The probe one backend of ``spec`` runs (recipe filled in by the caller)."""
    return coldstart.ProbeSpec(
        recipe="", backend=backend, choices=build_options(spec, backend),
        new_tokens=spec.new_tokens, iters=spec.iters, warmup=spec.warmup, copy_bandwidth=True,
        batch=spec.batch, prompt_lens=tuple(spec.prompt_lens),
    )  # fmt: skip


def unit_name(recipe: str, backend: str) -> str:
    # A .toml path or a model spec (examples/vision.py:net) names a file, not a folder.
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", recipe)
    return f"{safe}__{backend}"


def run_unit(
    spec: CompareSpec,
    recipe: str,
    backend: str,
    units_dir: Path,
    *,
    resume: bool,
    work_root: Path | None,
    say: Callable[[str], None],
) -> dict[str, Any]:
    """Run (or, with resume, reload) one unit; never raises for a failed probe."""
    name = unit_name(recipe, backend)
    done_path = units_dir / f"{name}.json"
    if resume and done_path.is_file():
        return json.loads(done_path.read_text())
    from ..sources.module import is_module_spec

    ps = probe_spec(spec, backend)
    ps.recipe = recipe
    if is_module_spec(recipe):
        # What only a recipe takes stays with the recipe units of a mixed compare.
        ps.choices = ps.choices.replace(
            max_seq_len=None, max_batch=None, quant=None, weights=None, tag=None
        )
        ps.prompt_lens = ()  # a model spec has no prompt
    else:
        ps.batch = None  # a recipe's requests are the seed's batch 1
        ps.choices = ps.choices.replace(inputs=())  # --input is the model specs' only
    scenarios = ("eager",) if backend == "eager" else ("cold", "warm")
    work = (work_root / name) if work_root else None
    try:
        runs = coldstart.run_scenarios(
            ps,
            spec.runs,
            scenarios,
            work_dir=work,
            journal=(units_dir / f"{name}.jsonl") if resume else None,
            timeout=spec.timeout,
            progress=lambda m: say(f"{recipe}/{backend}: {m}"),
            builds=spec.builds,
        )
        unit = {"status": "ok", "runs": runs}
    except MeasureError as e:
        unit = {"status": "failed", "reason": str(e), "runs": {}}
    units_dir.mkdir(parents=True, exist_ok=True)
    done_path.write_text(json.dumps(unit) + "\n")
    if work is not None and unit["status"] == "ok":
        shutil.rmtree(work, ignore_errors=True)
    return unit


def pair_result(
    recipe_obj: Any, spec: CompareSpec, unit: dict[str, Any], eager: dict[str, Any] | None
) -> dict[str, Any]:
    """Coldstart summary (with break-even against eager) and bench for one pair."""
    if unit["status"] != "ok":
        return {"status": unit["status"], "reason": unit["reason"]}
    runs = dict(unit["runs"])
    steady_from = runs.get("warm") or runs.get("eager")
    with_eager = dict(runs)
    if eager and eager["status"] == "ok" and "eager" not in runs:
        with_eager["eager"] = eager["runs"]["eager"]
    summary = coldstart.summarize(with_eager)
    if "eager" not in runs:  # the baseline's own rows belong to the eager pair
        summary["scenarios"].pop("eager", None)
    return {
        "status": "ok",
        "runs": runs,
        "coldstart": summary,
        "bench": bench.summarize(
            recipe_obj, spec.choices.dtype, steady_from, quant=spec.choices.quant
        )
        if recipe_obj is not None
        else bench.summarize_module(steady_from),
    }


def _environment(pairs: dict[str, Any], device: str) -> dict[str, Any]:
    from ..doctor import bytecode_status
    from ..keys import cuda_driver_version

    env: dict[str, Any] = {"host": platform.node(), "machine": platform.machine()}
    for p in pairs.values():
        for results in p.get("runs", {}).values():
            if results:
                env.update(results[0].get("environment", {}))
                break
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                env["cpu"] = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    env["cpu_count"] = os.cpu_count()
    env["driver"] = cuda_driver_version() if is_cuda(device) else None
    # Without cached bytecode every process compiles what it imports: seconds of each
    # start that a normal install does not pay (docs/doctor.md, "bytecode").
    env["bytecode"] = {k: v for k, v in bytecode_status().items() if k != "problem"}
    return env


def run_compare(
    spec: CompareSpec,
    out: Path,
    *,
    command: str,
    resume: bool = False,
    work_root: Path | None = None,
    progress: Progress | None = None,
    keep_going: Callable[[str, str], bool] | None = None,
) -> dict[str, Any]:
    """Every unit, then report.json's dict (not yet written). See module doc.

    ``keep_going(recipe, backend)`` is asked before each unit that still has to
    run; False leaves it (and its pair) "not run" so a later call can resume.
    """
    recipes = validate(spec)
    check_out_dir(out)
    avail = availability(spec)
    units_dir = out / "units"
    todo = [(r, b) for r in spec.recipes for b in dict.fromkeys(["eager", *spec.backends])]
    todo = [(r, b) for r, b in todo if avail[b][0]]
    total = len(todo)
    say = progress or (lambda _m, _d, _t: None)
    units: dict[tuple[str, str], dict[str, Any]] = {}
    for i, (r, b) in enumerate(todo):
        have = resume and (units_dir / f"{unit_name(r, b)}.json").is_file()
        if not have and keep_going is not None and not keep_going(r, b):
            units[(r, b)] = {"status": "skipped", "reason": "left for a later call (time budget)"}
            continue
        say(f"{r}/{b}: starting", i, total)
        units[(r, b)] = run_unit(
            spec,
            r,
            b,
            units_dir,
            resume=resume,
            work_root=work_root,
            say=lambda m, i=i: say(m, i, total),
        )
        say(f"{r}/{b}: {units[(r, b)]['status']}", i + 1, total)
    pairs: dict[str, Any] = {}
    for r in spec.recipes:
        eager = units.get((r, "eager"))
        for b in spec.backends:
            ok, reason = avail[b]
            if not ok:
                pairs[f"{r}/{b}"] = {
                    "status": "skipped",
                    "reason": f"{b} unavailable here ({reason})",
                }
            elif units[(r, b)]["status"] == "skipped":
                pairs[f"{r}/{b}"] = dict(units[(r, b)])
            else:
                pairs[f"{r}/{b}"] = pair_result(recipes[r], spec, units[(r, b)], eager)
    baselines: dict[str, Any] = {}
    for r in spec.recipes:
        e = units.get((r, "eager"))
        if e is None:
            baselines[r] = {
                "status": "skipped",
                "reason": f"eager unavailable here ({avail['eager'][1]})",
            }
        elif e["status"] != "ok":
            baselines[r] = {"status": e["status"], "reason": e["reason"]}
        else:
            baselines[r] = {
                "status": "ok",
                "runs": e["runs"],
                "coldstart": coldstart.summarize(e["runs"]),
            }
    new_tokens = sorted(
        {bench.resolve_new_tokens(rec, spec.new_tokens) for rec in recipes.values() if rec}
    )
    return {
        "schema": 1,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": command,
        "recipes": spec.recipes,
        "backends": spec.backends,
        "settings": {
            "device": spec.choices.device,
            "dtype": spec.choices.dtype,
            "weights": spec.choices.weights,
            "seed": spec.choices.seed,
            "runs": spec.runs,
            "builds": spec.builds or spec.runs,
            "iters": spec.iters,
            "warmup": spec.warmup,
            "new_tokens": spec.new_tokens,
            "max_seq_len": spec.choices.max_seq_len,
            "max_batch": spec.choices.max_batch,
            "new_tokens_label": "/".join(str(n) for n in new_tokens),
            "modes": spec.modes,
            "extras": spec.extras,
            "quant": spec.choices.quant,
            "tag": spec.choices.tag,
            "prompt_lens": list(spec.prompt_lens),
        },
        "environment": _environment(pairs, spec.choices.device),
        "pairs": pairs,
        "baselines": baselines,
    }
