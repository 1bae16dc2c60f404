"""Cold, warm and eager start, each in fresh processes; break-even against eager.

Scenarios (docs/measurement.md has the full protocol):

``cold``   an EMPTY temporary acache dir, and TORCHINDUCTOR_CACHE_DIR,
           TRITON_CACHE_DIR, CUDA_CACHE_PATH (+ TRITON_HOME,
           PYTORCH_KERNEL_CACHE_PATH) at fresh empty temp dirs: the probe builds.
``warm``   the acache dir the preceding cold run populated, framework caches
           fresh and EMPTY again: only the artifact can carry the warmth.
``eager``  the eager backend, its (trivial) entry built by an untimed prime
           run first, so the baseline is plain PyTorch start-up, not acache's build.

Runs interleave (cold 1, warm 1, cold 2, warm 2, ...) so a cold run after a
warm run proves the caches were really emptied, and slow drift hits both alike.
With fewer builds than runs (``--builds``), the warm runs past the last build load
that build's entry: one build, then N warm processes of it.
The user's cache is never touched: every dir lives under a temporary work dir.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..choices import BuildChoices
from ..errors import MeasureError
from .breakeven import break_even, break_even_interval, first_results, request_times
from .phases import PHASE_ORDER, T0_ENV

# Framework caches a cold/warm run must not inherit from the user's machine.
FRAMEWORK_CACHE_VARS = (
    "TORCHINDUCTOR_CACHE_DIR",
    "TRITON_CACHE_DIR",
    "CUDA_CACHE_PATH",
    "TRITON_HOME",
    "PYTORCH_KERNEL_CACHE_PATH",
)
# Would let a child reach a cache we do not control (remote tiers, shared roots).
SCRUBBED_VARS = (
    "ACACHE_REMOTE",
    "TORCHINDUCTOR_FX_GRAPH_REMOTE_CACHE",
    "TORCHINDUCTOR_AUTOTUNE_REMOTE_CACHE",
    "TORCHINDUCTOR_AUTOGRAD_REMOTE_CACHE",
)
SCENARIOS = ("cold", "warm", "eager")
# In a cold run's dir: its entry was built by a warm run (untimed), not by the cold run.
PRIMED_MARKER = "entry-built-by-a-warm-run"
DEFAULT_TIMEOUT_S = 1800.0
# What a warm load must not pay for: the compiler stack, and the optional extras a load
# of a built-in recipe with random weights never uses. tests/test_backends_aoti.py
# checks a warm aoti load imports none; benchmarks/startup_diag.py reports which it did.
NOT_ON_A_WARM_LOAD = (
    "torch._dynamo", "torch._inductor", "torch.onnx", "sympy", "triton", "onnx", "onnxruntime",
    "tensorrt", "transformers", "tokenizers", "safetensors", "cryptography", "obstore",
    "matplotlib",
)  # fmt: skip
# The first lines of a child whose sys.modules at exit is wanted: it pops the output
# path from argv[1] and writes the sorted module names there as JSON.
MODULES_AT_EXIT = (
    "import atexit, json, sys\n"
    "out = sys.argv.pop(1)\n"
    "atexit.register(lambda: open(out, 'w').write(json.dumps(sorted(sys.modules))))\n"
)

Progress = Callable[[str], None]


@dataclass
class ProbeSpec:
    """What one probe child measures: the model, the backend, the build choices (sent
    whole, as JSON) and how to measure."""

    recipe: str
    backend: str
    choices: BuildChoices = field(default_factory=BuildChoices)
    new_tokens: int | None = None
    iters: int = 10
    warmup: int = 2
    copy_bandwidth: bool = False
    matmul_flops: bool = False
    step_latency: bool = False
    extra_flags: list[str] = field(default_factory=list)
    # A model spec's batch size (dimension 0 of its inputs); for a recipe, the prompts
    # of each timed request.
    batch: int | None = None
    # A recipe's prompt lengths whose time to first token is also measured
    # (measure/prefill.py); a measurement option, never a build choice.
    prompt_lens: tuple[int, ...] = ()

    def argv(self, cache_dir: Path | None) -> list[str]:
        cmd = [sys.executable, "-m", "artifactcache.measure.child.probe", "--recipe", self.recipe]
        cmd += ["--backend", self.backend, "--choices-json", self.choices.to_json()]
        if cache_dir is not None:
            cmd += ["--cache-dir", str(cache_dir)]
        cmd += ["--iters", str(self.iters), "--warmup", str(self.warmup)]
        if self.new_tokens is not None:
            cmd += ["--new-tokens", str(self.new_tokens)]
        if self.copy_bandwidth:
            cmd.append("--copy-bandwidth")
        if self.matmul_flops:
            cmd.append("--matmul-flops")
        if self.step_latency:
            cmd.append("--step-latency")
        if self.batch is not None:
            cmd += ["--batch", str(self.batch)]
        if self.prompt_lens:
            cmd += ["--prompt-lens", ",".join(str(n) for n in self.prompt_lens)]
        return cmd + list(self.extra_flags)


def _dir_bytes(path: Path) -> int:
    from ..store.entry import tree_bytes  # the store's own walk: lstat, no symlinks

    return tree_bytes(path)


def fresh_framework_dirs(parent: Path) -> dict[str, Path]:
    """New, empty dirs for every framework cache variable (checked empty)."""
    dirs: dict[str, Path] = {}
    for var in FRAMEWORK_CACHE_VARS:
        d = parent / var.lower()
        if d.exists():
            shutil.rmtree(d)
        d.mkdir(parents=True, mode=0o700)
        dirs[var] = d
    return dirs


def spawn_probe(
    spec: ProbeSpec,
    cache_dir: Path | None,
    *,
    env_dirs: dict[str, Path] | None = None,
    log_path: Path | None = None,
    timeout: float = DEFAULT_TIMEOUT_S,
    extra_env: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Run one probe child and return its JSON; MeasureError if it failed.

    ``cache_dir`` None: the child uses the user's cache ($ACACHE_DIR or the default).
    """
    env = dict(os.environ)
    for var in SCRUBBED_VARS:
        env.pop(var, None)
    if cache_dir is not None:
        env["ACACHE_DIR"] = str(cache_dir)
    for var, d in (env_dirs or {}).items():
        env[var] = str(d)
    env.update(extra_env or {})
    cmd = spec.argv(cache_dir)
    log = open(log_path, "wb") if log_path else subprocess.DEVNULL  # noqa: SIM115
    try:
        # The child measures from this stamp: taken as late as possible before exec.
        env[T0_ENV] = repr(time.monotonic())
        proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=log, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise MeasureError(
            f"probe for {spec.recipe}/{spec.backend} ran past {timeout:.0f} s and was stopped"
        ) from None
    finally:
        if log_path:
            log.close()  # type: ignore[union-attr]
    lines = [ln for ln in proc.stdout.decode(errors="replace").splitlines() if ln.startswith("{")]
    result = json.loads(lines[-1]) if lines else {"ok": False, "error": None}
    if not result.get("ok"):
        what = result.get("error") or f"exited {proc.returncode} without a result"
        raise MeasureError(
            f"probe for {spec.recipe}/{spec.backend} failed: {what}{_keep_log(log_path)}"
        )
    return result


def _keep_log(log_path: Path | None) -> str:
    """Copy a failed child's stderr somewhere that outlives the temp work dir."""
    if not log_path or not log_path.is_file():
        return ""
    fd, kept = tempfile.mkstemp(prefix="acache-probe-", suffix=".log")
    os.close(fd)
    shutil.copyfile(log_path, kept)
    tail = [ln.strip() for ln in log_path.read_text(errors="replace").splitlines() if ln.strip()]
    last = f"; last log line: {tail[-1][:200]}" if tail else ""
    return f" (log: {kept}{last})"


def _cache_sizes(dirs: dict[str, Path]) -> dict[str, int]:
    return {var: _dir_bytes(d) for var, d in dirs.items()}


def _one_run(
    spec: ProbeSpec, run_dir: Path, acache_dir: Path, timeout: float, *, must_be_empty: bool
) -> dict[str, Any]:
    dirs = fresh_framework_dirs(run_dir / "framework")
    if must_be_empty and acache_dir.exists() and any(acache_dir.iterdir()):
        raise MeasureError(f"cold run's acache dir {acache_dir} is not empty")
    acache_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    before = _cache_sizes(dirs)
    if any(before.values()):  # fresh_framework_dirs just made them; a leak would be a bug
        raise MeasureError(f"framework cache dirs not empty before a run: {before}")
    result = spawn_probe(
        spec, acache_dir, env_dirs=dirs, log_path=run_dir / "probe.log", timeout=timeout
    )
    result["framework_cache_bytes_after"] = _cache_sizes(dirs)
    shutil.rmtree(run_dir / "framework", ignore_errors=True)
    return result


def _journal_load(path: Path | None) -> dict[tuple[str, int], dict[str, Any]]:
    done: dict[tuple[str, int], dict[str, Any]] = {}
    if path and path.is_file():
        for line in path.read_text().splitlines():
            try:
                rec = json.loads(line)
                done[(rec["scenario"], int(rec["index"]))] = rec["result"]
            except (ValueError, KeyError, TypeError):
                continue  # a line cut short by a killed run: that run is redone
    return done


def _journal_add(path: Path | None, scenario: str, index: int, result: dict[str, Any]) -> None:
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        f.write(json.dumps({"scenario": scenario, "index": index, "result": result}) + "\n")


def run_scenarios(
    spec: ProbeSpec,
    runs: int,
    scenarios: Iterable[str] = ("cold", "warm", "eager"),
    *,
    work_dir: Path | None = None,
    journal: Path | None = None,
    timeout: float = DEFAULT_TIMEOUT_S,
    progress: Progress | None = None,
    builds: int | None = None,
) -> dict[str, list[dict[str, Any]]]:
    """Fresh-process runs per scenario, interleaved; results keyed by scenario.

    ``builds`` (default ``runs``): how many cold runs there are. Warm run i loads the
    entry of cold run min(i, builds - 1), so ``builds=1`` is one build and ``runs``
    warm processes of that one entry (the cheaper proof that warm starts agree with
    their build and with each other).

    With ``journal``, each finished run is appended there and skipped on a later
    call (the work dir must then persist too, so a warm run finds its entry).
    """
    builds = check_builds(runs, builds)
    wanted = [s for s in SCENARIOS if s in set(scenarios)]
    if not wanted:
        raise MeasureError(f"no scenario to run: choose from {', '.join(SCENARIOS)}")
    say = progress or (lambda _msg: None)
    own_tmp = work_dir is None
    # Absolute: the children hand these dirs to compilers that run in other cwds
    # (a relative TORCHINDUCTOR_CACHE_DIR broke AOTI's g++ step on the GPU machine).
    root = Path(tempfile.mkdtemp(prefix="acache-coldstart-")) if own_tmp else Path(work_dir)
    root = root.expanduser().resolve()
    root.mkdir(parents=True, exist_ok=True)
    done = _journal_load(journal)
    out: dict[str, list[dict[str, Any]]] = {s: [] for s in wanted}
    eager_spec = dataclasses.replace(spec, backend="eager", choices=spec.choices.replace(mode=None))
    eager_dir = root / "eager" / "acache"
    try:
        if "eager" in wanted and any(("eager", i) not in done for i in range(runs)):
            say("eager: building the baseline entry (untimed)")
            prime = dataclasses.replace(eager_spec, extra_flags=["--build-only"])
            _one_run(prime, root / "eager" / "prime", eager_dir, timeout, must_be_empty=False)
        for i in range(runs):
            cold_dir = root / f"cold-{builder(i, builds)}" / "acache"
            if "cold" in wanted and i < builds:
                if ("cold", i) in done:
                    out["cold"].append(done[("cold", i)])
                else:
                    say(f"cold {i + 1}/{runs}: empty caches, builds")
                    shutil.rmtree(cold_dir.parent, ignore_errors=True)
                    # TTFT by prompt length is read from the warm and eager runs only.
                    cold = dataclasses.replace(spec, prompt_lens=())
                    res = _one_run(cold, cold_dir.parent, cold_dir, timeout, must_be_empty=True)
                    _journal_add(journal, "cold", i, res)
                    out["cold"].append(res)
            if "warm" in wanted:
                if ("warm", i) in done:
                    out["warm"].append(done[("warm", i)])
                else:
                    # An entry built here, not by a cold run, is marked: a later warm run
                    # of the same entry (--builds) must not take it for the cold run's.
                    marker = cold_dir.parent / PRIMED_MARKER
                    if not cold_dir.is_dir():  # warm alone: populate an entry, untimed
                        say(f"warm {i + 1}/{runs}: building the entry first (untimed)")
                        prime = dataclasses.replace(spec, extra_flags=["--build-only"])
                        _one_run(prime, cold_dir.parent, cold_dir, timeout, must_be_empty=False)
                        marker.touch()
                    say(f"warm {i + 1}/{runs}: entry present, framework caches empty")
                    res = _one_run(spec, root / f"warm-{i}", cold_dir, timeout, must_be_empty=False)
                    # Not a cold run's entry: matches_build has no build to compare with.
                    res["entry_primed"] = marker.exists()
                    res["build_index"] = builder(i, builds)
                    _journal_add(journal, "warm", i, res)
                    out["warm"].append(res)
            # Cold entries can be huge (an AOTI package with weights is 13.6 GB for 7B):
            # each goes once its last warm run is done.
            if not builds - 1 <= i < runs - 1:  # the last build's entry serves those after
                shutil.rmtree(cold_dir.parent, ignore_errors=True)
            if "eager" in wanted:
                if ("eager", i) in done:
                    out["eager"].append(done[("eager", i)])
                else:
                    say(f"eager {i + 1}/{runs}: baseline")
                    res = _one_run(
                        eager_spec, root / f"eager-{i}", eager_dir, timeout, must_be_empty=False
                    )
                    _journal_add(journal, "eager", i, res)
                    out["eager"].append(res)
    finally:
        if own_tmp:
            shutil.rmtree(root, ignore_errors=True)
    return out


# ---------------------------------------------------------------- summary --


def spread(values: list[float]) -> dict[str, float]:
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "n": len(values),
    }


def phase_summary(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Per phase: median and min-max over runs, in seconds since process start."""
    out: dict[str, Any] = {}
    for ph in PHASE_ORDER:
        vals = [r["phases"][ph] for r in results if ph in r.get("phases", {})]
        if vals:
            out[ph] = spread(vals)
    return out


def request_latency(results: list[dict[str, Any]]) -> float | None:
    """Median seconds of one seed request (prefill + N tokens) over every timed iteration."""
    vals = request_times(results)
    return statistics.median(vals) if vals else None


def ttfr(results: list[dict[str, Any]]) -> float | None:
    vals = first_results(results)
    return statistics.median(vals) if vals else None


def compile_counts(report: dict[str, Any]) -> dict[str, Any]:
    """One process's compile work (measure/child/compiles.py): graphs Inductor compiled,
    Triton kernels compiled (None where not counted), kernel timings run for tuning."""
    return {
        "graphs": report.get("fxgraph_cache_miss", 0) + report.get("fxgraph_cache_bypass", 0),
        "triton_kernels": report.get("triton_compiles"),
        "kernel_benchmarks": report.get("kernel_benchmarks", 0),
    }


def greedy_output(result: dict[str, Any]) -> tuple[Any, Any]:
    """A run's greedy output: its first token and its timed request's tokens."""
    return result.get("first_token"), (result.get("steady") or {}).get("tokens")


def outputs_agree(results: list[dict[str, Any]]) -> bool | None:
    """Whether every process of a scenario produced the same greedy tokens (its first
    token and its timed request's); None with fewer than two, or none with tokens."""
    outs = [greedy_output(r) for r in results]
    if len(outs) < 2 or all(o == (None, None) for o in outs):  # a model spec has no tokens
        return None
    return all(o == outs[0] for o in outs)


def check_builds(runs: int, builds: int | None) -> int:
    """The number of cold runs (``builds``, default ``runs``); a bad one is one line."""
    if runs < 1:
        raise MeasureError(f"--runs must be at least 1, got {runs}")
    if builds is None:
        return runs
    if not 1 <= builds <= runs:
        raise MeasureError(f"--builds must be between 1 and --runs ({runs}), got {builds}")
    return builds


def builder(warm_index: int, builds: int) -> int:
    """The cold run whose entry warm run ``warm_index`` loads."""
    return min(warm_index, builds - 1)


def matches_build(cold: list[dict[str, Any]], warm: list[dict[str, Any]]) -> list[bool | None]:
    """Per warm run, whether its greedy tokens are those of the cold run that built the
    entry it loaded (its ``build_index``, else its own index); None where either has no
    tokens or that cold run is missing, or where the warm run's entry was built for it
    (``entry_primed``: a resumed run)."""
    out: list[bool | None] = []
    for i, w in enumerate(warm):
        b = w.get("build_index", i)
        if b >= len(cold):
            out.append(None)
            continue
        pair = [greedy_output(cold[b]), greedy_output(w)]
        same = None if (None, None) in pair or w.get("entry_primed") else pair[0] == pair[1]
        out.append(same)
    return out


def summarize(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Phase spreads per scenario, cold/warm ratio, and break-even vs eager."""
    out: dict[str, Any] = {"scenarios": {}}
    for scen, results in runs.items():
        if not results:
            continue
        out["scenarios"][scen] = {
            "runs": len(results),
            "phases": phase_summary(results),
            "ttfr_s": ttfr(results),
            "request_latency_s": request_latency(results),
            "compiled": [bool(r["compile"]["compiled"]) for r in results],
            "compile_counts": [compile_counts(r["compile"]) for r in results],
            "outputs_agree": outputs_agree(results),
            "built": [bool(r.get("built")) for r in results],
            "peak_rss_bytes": max(r["memory"]["peak_rss_bytes"] for r in results),
            "peak_device_allocated_bytes": max(
                (r["memory"].get("peak_device_allocated_bytes", 0) for r in results), default=0
            ),
        }
    sc = out["scenarios"]
    if "cold" in sc and "warm" in sc:
        # Each warm run loads the entry its cold run built: a warm process that differs
        # from its own build is a broken warm start; warm runs that differ only from one
        # another come from builds that tuned differently.
        sc["warm"]["matches_build"] = matches_build(runs["cold"], runs["warm"])
    if "cold" in sc and "warm" in sc and sc["warm"]["ttfr_s"]:
        out["cold_warm_ratio"] = sc["cold"]["ttfr_s"] / sc["warm"]["ttfr_s"]
    if "eager" in sc:
        e = sc["eager"]
        for scen in ("warm", "cold"):
            if scen in sc and sc[scen]["request_latency_s"] and e["request_latency_s"]:
                out[f"break_even_{scen}"] = break_even(
                    sc[scen]["ttfr_s"],
                    sc[scen]["request_latency_s"],
                    e["ttfr_s"],
                    e["request_latency_s"],
                )
                out[f"break_even_{scen}"]["interval"] = break_even_interval(
                    runs[scen], runs["eager"]
                )
    return out
