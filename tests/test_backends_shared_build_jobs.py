"""Build scheduling (aoti's steps here; inductor's in test_backends_inductor.py): the
steps in worker processes at once, or serially.

The worker tests that fail before any compile run unmarked (a worker's start-up costs
seconds, no compile); the one that compiles both ways is slow.
"""

from __future__ import annotations

import hashlib
import io
import os
import pickle
import subprocess
import sys
import threading
import types
from concurrent.futures import Future
from pathlib import Path

import pytest
import torch
from _backend_util import _PRECISION_SWITCHES, matmul_precision_kept, private_dir
from typer.testing import CliRunner

from artifactcache import api
from artifactcache.backends.aoti import backend as aoti
from artifactcache.backends.base import BuildContext
from artifactcache.backends.shared import build_jobs as jobs_mod
from artifactcache.backends.shared import build_plan as plan_mod
from artifactcache.backends.shared import build_worker as worker_mod
from artifactcache.backends.shared.build_jobs import (
    BuildWorkerFailed,
    StepJob,
    out_of_memory,
    worker_failure,
)
from artifactcache.backends.shared.build_plan import (
    JOBS_ENV,
    TIMEOUT_ENV,
    build_jobs,
    build_timeout,
    planned_jobs,
)
from artifactcache.choices import BuildChoices
from artifactcache.cli.app import app
from artifactcache.errors import BackendError, WeightsError
from artifactcache.models import WeightsSpec, build_model
from artifactcache.recipes import load_recipe


def _cli(*args: str):
    return CliRunner().invoke(app, [str(a) for a in args])


def _one_line_error(result) -> str:
    """The one error line; a build that ran over a second off a terminal says so first
    (cli/render.py progress), which is progress, not the error."""
    assert result.exit_code == 1, (result.stdout, result.stderr)
    lines = [
        ln
        for ln in result.stderr.strip().splitlines()
        if not (ln.startswith("building ") and ln.endswith(" ..."))
    ]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    return lines[0]


def _nothing_cached(root: Path) -> None:
    assert not list((root / "v1" / "entries").rglob("manifest.json"))
    assert not any((root / "v1" / "staging").iterdir())


def _our_workers() -> list[int]:
    """Live processes of this test process running a build worker (or a stand-in: its
    script names the module too)."""
    found = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            cmd = (d / "cmdline").read_bytes()
        except (OSError, IndexError, ValueError):
            continue
        if ppid == os.getpid() and b"artifactcache.backends.shared.build_worker" in cmd:
            found.append(int(d.name))
    return found


# ------------------------------------------------------------ the switch --


def test_jobs_come_from_the_env_else_the_device_and_cores(monkeypatch):
    monkeypatch.delenv(JOBS_ENV, raising=False)
    assert build_jobs("cuda", 2) == 2  # the GPU default: concurrent
    monkeypatch.setattr(plan_mod, "usable_cores", lambda: 2)
    assert build_jobs("cpu", 2) == 1  # this VM's measurement: serial on few cores
    monkeypatch.setattr(plan_mod, "usable_cores", lambda: plan_mod.MIN_CPU_CORES)
    assert build_jobs("cpu", 2) == 2
    monkeypatch.setenv(JOBS_ENV, "1")
    assert build_jobs("cuda", 2) == 1
    monkeypatch.setenv(JOBS_ENV, "8")
    assert build_jobs("cpu", 2) == 2  # never more workers than steps
    for bad in ("0", "-1", "two", "1.5"):
        monkeypatch.setenv(JOBS_ENV, bad)
        with pytest.raises(BackendError, match=JOBS_ENV):
            build_jobs("cpu", 2)


def test_the_default_is_serial_where_two_workers_would_not_fit(monkeypatch):
    from artifactcache.sizing import memory_needed

    recipe = load_recipe("tiny-llama")
    opts = BuildChoices(device="cuda", dtype="fp32")
    need = memory_needed(recipe, "fp32")["total"]
    monkeypatch.delenv(JOBS_ENV, raising=False)
    monkeypatch.setattr("artifactcache.sizing.available_memory", lambda device: 3 * need)
    assert planned_jobs(recipe, opts, 2) == 2
    monkeypatch.setattr("artifactcache.sizing.available_memory", lambda device: int(1.5 * need))
    assert planned_jobs(recipe, opts, 2) == 1  # one model fits, two do not
    monkeypatch.setattr("artifactcache.sizing.available_memory", lambda device: None)
    assert planned_jobs(recipe, opts, 2) == 2  # unknown: as build_jobs says
    monkeypatch.setattr("artifactcache.sizing.available_memory", lambda device: int(1.5 * need))
    monkeypatch.setenv(JOBS_ENV, "2")
    assert planned_jobs(recipe, opts, 2) == 2  # asked for explicitly


def test_a_worker_imports_this_acache_not_one_in_the_working_dir(tmp_path):
    shadow = tmp_path / "artifactcache"
    shadow.mkdir()
    (shadow / "__init__.py").write_text("print('SHADOW'); raise SystemExit(3)\n")
    # No job on stdin: the real worker starts, then fails to read one.
    p = subprocess.run(jobs_mod.worker_argv(), cwd=tmp_path, input=b"", capture_output=True,
                       env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
                       timeout=300)  # fmt: skip
    out = (p.stdout + p.stderr).decode()
    assert "SHADOW" not in out and p.returncode not in (0, 3)
    assert "EOFError" in out


def test_timeout_comes_from_the_env(monkeypatch):
    monkeypatch.delenv(TIMEOUT_ENV, raising=False)
    assert build_timeout() == plan_mod.DEFAULT_TIMEOUT_S
    monkeypatch.setenv(TIMEOUT_ENV, "2.5")
    assert build_timeout() == 2.5
    for bad in ("0", "-3", "soon", "nan"):
        monkeypatch.setenv(TIMEOUT_ENV, bad)
        with pytest.raises(BackendError, match=TIMEOUT_ENV):
            build_timeout()


@pytest.mark.parametrize(
    ("name", "value", "backend", "jobs"),
    [
        (JOBS_ENV, "none", "aoti", "2"),
        (TIMEOUT_ENV, "-1", "aoti", "2"),
        (TIMEOUT_ENV, "abc", "aoti", "1"),  # read on the serial path too
        (TIMEOUT_ENV, "abc", "inductor", "1"),
        (JOBS_ENV, "none", "inductor", "2"),
    ],
)
def test_a_bad_setting_is_a_one_line_cli_error(
    name, value, backend, jobs, tmp_path: Path, monkeypatch
):
    monkeypatch.setenv(JOBS_ENV, jobs)
    monkeypatch.setenv(name, value)
    root = tmp_path / "never-created"  # refused with the arguments, before the cache opens
    line = _one_line_error(_cli("build", "tiny-llama", "-b", backend, "--cache-dir", root))
    assert name in line
    assert not root.exists()


# ---------------------------------------------------- what a worker sends --


def test_a_workers_acache_error_keeps_its_class_and_message():
    report = {"error": {"acache": True, "module": "artifactcache.errors", "type": "WeightsError",
                        "message": "bad tensor", "traceback": "tb"}}  # fmt: skip
    err = worker_failure("the aoti prefill step", report, 1)
    assert type(err) is WeightsError and str(err) == "bad tensor"
    report["error"].update(module="no.such.module", type="Gone")
    err = worker_failure("the aoti prefill step", report, 1)
    assert type(err) is BackendError and str(err) == "bad tensor"


def test_an_error_whose_constructor_words_its_argument_keeps_the_workers_message():
    """TorchPrivateAPIMissing words its argument; rebuilt here it must not be worded twice."""
    from artifactcache.backends.shared.torch_private import TorchPrivateAPIMissing

    said = str(TorchPrivateAPIMissing("torch._inductor.x()"))
    error = {"acache": True, "module": TorchPrivateAPIMissing.__module__,
             "type": "TorchPrivateAPIMissing", "message": said, "traceback": ""}  # fmt: skip
    report = {"error": error}
    err = worker_failure("the inductor decode step", report, 1)
    assert type(err) is TorchPrivateAPIMissing and str(err) == said


def test_the_timeout_with_nothing_running_names_no_empty_list():
    done: Future = Future()
    done.set_result({})
    msg = str(jobs_mod.timeout_error([], done, 5.0, backend="inductor"))
    assert msg.startswith("the inductor build took longer than 5 s; set ")
    assert "still running" not in msg and "the the" not in msg


def test_a_workers_bug_keeps_its_traceback():
    tb = "Traceback ...\nRuntimeError: boom\n"
    report = {"error": {"acache": False, "module": "builtins", "type": "RuntimeError",
                        "message": "boom", "traceback": tb}}  # fmt: skip
    err = worker_failure("the aoti decode step", report, 1)
    assert isinstance(err, BuildWorkerFailed) and "RuntimeError: boom" in str(err)
    assert f"{JOBS_ENV}=1" in str(err)


def test_a_worker_that_died_is_one_line():
    err = worker_failure("the aoti decode step", None, -9)
    assert isinstance(err, BackendError) and "\n" not in str(err)
    assert "signal 9" in str(err) and "out of memory" in str(err) and f"{JOBS_ENV}=1" in str(err)
    assert "exit code 3" in str(worker_failure("the aoti decode step", None, 3))


def test_a_worker_reports_what_it_raised(tmp_path: Path, monkeypatch):
    """main() turns any exception into a report (and exit 1), printing nothing."""
    job = StepJob("aoti", "decode", load_recipe("tiny-llama"), BuildChoices(), WeightsSpec(),
                  tmp_path, tmp_path, tmp_path / "decode.report", {}, os.getppid())  # fmt: skip

    def broken(*_args):
        raise RuntimeError("inductor fell over")

    monkeypatch.setattr(worker_mod, "_run", broken)
    monkeypatch.setattr(worker_mod, "_exit_with_parent", lambda pid: None)  # not pytest
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(pickle.dumps(job))))
    assert worker_mod.main() == 1
    report = pickle.loads(job.result.read_bytes())
    assert report["error"]["acache"] is False and report["error"]["type"] == "RuntimeError"
    assert "inductor fell over" in report["error"]["traceback"]
    assert isinstance(worker_failure("the aoti decode step", report, 1), BuildWorkerFailed)


def test_process_state_carries_the_matmul_precision():
    switches = [getattr(obj, name, None) for obj, name in _PRECISION_SWITCHES]
    with matmul_precision_kept():
        torch.set_float32_matmul_precision("medium")
        state = plan_mod.process_state()
        torch.set_float32_matmul_precision("highest")
        plan_mod.apply_process_state(state)
        assert torch.get_float32_matmul_precision() == "medium"
    assert [getattr(obj, name, None) for obj, name in _PRECISION_SWITCHES] == switches


# ------------------------------------------------------ real workers, no compile --


def test_a_failing_worker_is_the_serial_builds_one_line_and_caches_nothing(
    tmp_path: Path, cache_dir: Path, monkeypatch
):
    """A checkpoint whose tensor has the wrong shape fails in the worker's model build.
    Through the library: the CLI refuses that checkpoint before any build
    (test_cli_app.py), a deployment's api.build finds it where the model is built."""
    from safetensors.torch import save_file

    sd = {k: v.contiguous() for k, v in build_model(load_recipe("tiny-llama")).state_dict().items()}
    sd["model.layers.0.input_layernorm.weight"] = torch.ones(3)
    ckpt = tmp_path / "model.safetensors"
    save_file(sd, str(ckpt))
    messages = {}
    for jobs in ("2", "1"):
        monkeypatch.setenv(JOBS_ENV, jobs)
        with pytest.raises(WeightsError) as e:
            api.build("tiny-llama", "aoti", weights=ckpt, cache_dir=cache_dir)
        messages[jobs] = str(e.value)
        _nothing_cached(cache_dir)
    assert "input_layernorm" in messages["2"] and "\n" not in messages["2"]
    assert messages["2"] == messages["1"]
    assert _our_workers() == []


def test_a_job_that_cannot_be_sent_is_one_line_and_stops_the_worker(cache_dir: Path, monkeypatch):
    def refuse(self, obj):
        raise pickle.PicklingError("cannot pickle 'generator' object")

    monkeypatch.setenv(JOBS_ENV, "2")
    monkeypatch.setattr(jobs_mod._Worker, "send", refuse)
    line = _one_line_error(_cli("build", "tiny-llama", "-b", "aoti", "--cache-dir", cache_dir))
    assert "cannot be sent" in line and f"{JOBS_ENV}=1" in line
    _nothing_cached(cache_dir)
    assert _our_workers() == []


def test_a_worker_past_the_timeout_is_stopped(cache_dir: Path, monkeypatch):
    monkeypatch.setenv(JOBS_ENV, "2")
    monkeypatch.setenv(TIMEOUT_ENV, "0.5")  # less than a worker's imports
    line = _one_line_error(_cli("build", "tiny-llama", "-b", "aoti", "--cache-dir", cache_dir))
    assert "longer than 0.5 s" in line and TIMEOUT_ENV in line
    assert "the prefill step (" in line and "the extend step (" in line  # with their phases
    assert "waiting: the decode step (for a worker" in line  # two workers at once
    _nothing_cached(cache_dir)
    assert _our_workers() == []


# ---------------------------------------------- stand-in workers: how they end --

# A worker that builds no model: it reads its job and the probe's config as a real one
# does, then saves a step (an empty .so and its report) and ends as told.
_STAND_IN = """
# a stand-in for artifactcache.backends.shared.build_worker (_our_workers finds it)
import os, pickle, signal, sys, time
sys.path[0] = {root!r}
from artifactcache.backends.shared.build_jobs import WAITING_FOR_PROBE, StepJob
started = time.monotonic()
job: StepJob = pickle.load(sys.stdin.buffer)
job.mark(WAITING_FOR_PROBE)
pickle.load(sys.stdin.buffer)
so = f"{{job.step}}/{{job.step}}.so"
(job.workdir / job.step).mkdir(parents=True, exist_ok=True)
(job.workdir / so).write_bytes(b"")
report = dict(file=so, timings={{}}, started=started, finished=time.monotonic())
job.result.write_bytes(pickle.dumps(report))
{ending}
"""
_ROOT = str(Path(jobs_mod.__file__).resolve().parents[3])


def _stand_in_build(tmp_path: Path, monkeypatch, ending: str, probe=dict, progress=None):
    argv = [sys.executable, "-c", _STAND_IN.format(root=_ROOT, ending=ending)]
    monkeypatch.setattr(jobs_mod, "worker_argv", lambda: argv)
    ctx = BuildContext(load_recipe("tiny-llama"), BuildChoices(), WeightsSpec(), progress=progress)
    workdir, scratch = tmp_path / "entry", tmp_path / "scratch"
    workdir.mkdir()
    scratch.mkdir()
    return jobs_mod.build_concurrently("aoti", ctx, workdir, scratch, aoti.STEPS, probe)


@pytest.mark.parametrize(
    ("ending", "how"),
    [
        ("os.kill(os.getpid(), signal.SIGSEGV)", "exited with signal 11"),
        ("sys.stdout.flush(); os._exit(3)", "exited with exit code 3"),
    ],
)
def test_a_worker_that_saved_its_step_has_built_it_however_it_exits(
    tmp_path: Path, monkeypatch, capsys, ending, how
):
    ending = f"if job.step == 'decode':\n    {ending}"
    sos, _ = _stand_in_build(tmp_path, monkeypatch, ending)
    assert sos == {s: f"{s}/{s}.so" for s in ("prefill", "extend", "decode")}
    warnings = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("warning:")]
    assert len(warnings) == 1 and "decode step's build worker" in warnings[0], warnings
    assert how in warnings[0] and "its step is kept" in warnings[0]
    assert _our_workers() == []


def test_a_worker_that_hangs_after_saving_its_step_is_stopped_and_its_step_kept(
    tmp_path: Path, monkeypatch
):
    monkeypatch.setattr(jobs_mod, "_EXIT_GRACE_S", 0.2)
    said: list[str] = []
    sos, _ = _stand_in_build(tmp_path, monkeypatch, "time.sleep(600)", progress=said.append)
    assert set(sos) == {"prefill", "extend", "decode"}
    assert len(said) == 3 and all("was stopped" in m and "kept" in m for m in said), said
    assert _our_workers() == []


def test_a_hung_compiler_probe_is_named_not_the_steps(tmp_path: Path, monkeypatch):
    release = threading.Event()

    def hung_probe() -> dict:
        release.wait()
        return {}

    monkeypatch.setenv(TIMEOUT_ENV, "0.5")
    try:
        with pytest.raises(BackendError) as e:
            _stand_in_build(tmp_path, monkeypatch, "", probe=hung_probe)
    finally:
        release.set()
    line = str(e.value)
    assert "\n" not in line and "longer than 0.5 s" in line and TIMEOUT_ENV in line
    assert "the C++ compiler probe" in line
    assert "the prefill step (" in line and "the decode step (" in line
    assert _our_workers() == []


def test_each_worker_is_sent_the_cache_roots_memo_dir(tmp_path: Path, monkeypatch):
    """Where aoti's steps read Inductor's CPU ISA verdicts (shared/cpu_isa.py)."""
    sent: list[StepJob] = []

    def capture(self, job):
        sent.append(job)
        raise TypeError("stop at the first")

    monkeypatch.setattr(jobs_mod._Worker, "send", capture)
    ctx = BuildContext(load_recipe("tiny-llama"), BuildChoices(), WeightsSpec(),
                       memo_dir=tmp_path / "memo")  # fmt: skip
    with pytest.raises(BackendError, match="cannot be sent"):
        jobs_mod.build_concurrently("aoti", ctx, tmp_path, tmp_path, aoti.STEPS, dict)
    assert [j.memo_dir for j in sent] == [tmp_path / "memo"]
    assert _our_workers() == []


def test_the_timeout_names_the_phase_each_worker_is_in(tmp_path: Path, monkeypatch):
    """A real worker's _run marks each phase; past the timeout, the message reads them.
    Its step gets the job's memo_dir."""
    job = StepJob("aoti", "decode", load_recipe("tiny-llama"), BuildChoices(), WeightsSpec(),
                  tmp_path, tmp_path, tmp_path / "decode.report", {}, os.getppid(),
                  memo_dir=tmp_path / "memo")  # fmt: skip
    done: Future = Future()
    done.set_result({})

    def message() -> str:
        return str(jobs_mod.timeout_error([types.SimpleNamespace(job=job)], done, 9.0))

    seen = [message()]

    def model_for(ctx, dev, backend):
        seen.append(message())
        return None

    def step(model, recipe, dev, name, cfg, workdir, scratch, timings, memo_dir):
        assert memo_dir == tmp_path / "memo"
        seen.append(message())
        cfg()
        seen.append(message())
        return f"{name}/{name}.so"

    monkeypatch.setattr(worker_mod, "apply_process_state", lambda state: None)  # this process's
    monkeypatch.setattr("artifactcache.backends.shared.runner.build_model_for", model_for)
    monkeypatch.setattr(aoti, "build_step", step)
    worker_mod._run(job, io.BytesIO(pickle.dumps({})), 0.0, 0.0)
    phases = [m.split("the decode step (", 1)[1].split(")", 1)[0] for m in seen]
    assert phases == ["starting", "building the model", "exporting", "compiling"]
    assert all("compiler probe" not in m for m in seen)  # the probe was done
    job.mark(jobs_mod.WAITING_FOR_PROBE)
    assert "the decode step (waiting for the compiler probe)" in message()


# ------------------------------------------------------------- both ways --


def _source_files(entry: Path) -> list[Path]:
    """Each step's generated sources and metadata (.cpp, .json below the entry's top)."""
    return [
        f for f in sorted(entry.rglob("*")) if f.suffix in (".cpp", ".json") and f.parent != entry
    ]


def _sources(entry: Path) -> dict[str, str]:
    """Digest of each step's generated sources and metadata, paths aside: comment lines
    name the Inductor cache dir and the kernel file (whose name hashes its contents)."""
    out: dict[str, list[str]] = {}
    for f in _source_files(entry):
        kept = [ln for ln in f.read_text().splitlines() if not ln.lstrip().startswith("//")]
        digest = hashlib.sha256("\n".join(kept).encode()).hexdigest()
        kind = f.name.split(".", 1)[1]  # wrapper.cpp, kernel.cpp, kernel_metadata.json, ...
        out.setdefault(f"{f.relative_to(entry).parts[0]}:{kind}", []).append(digest)
    return {k: ",".join(sorted(v)) for k, v in out.items()}


def _first_difference(a: Path, b: Path) -> str:
    """Where two entries' generated sources first differ, for a failure's message."""
    for x, y in zip(_source_files(a), _source_files(b), strict=False):
        la, lb = x.read_text().splitlines(), y.read_text().splitlines()
        for i, (p, q) in enumerate(zip(la, lb, strict=False)):
            if p != q and not p.lstrip().startswith("//"):
                where = f"{x.relative_to(a)} line {i + 1}"
                return f"{where}: {p.strip()[:160]!r} vs {q.strip()[:160]!r}"
    return "no differing line found"


@pytest.mark.slow
def test_the_concurrent_build_is_the_serial_build(tmp_path_factory, monkeypatch):
    recipe = load_recipe("tiny-llama")
    prompt = list(recipe.bench.prompt_ids)
    built = {}
    for jobs in ("1", "2"):
        monkeypatch.setenv(JOBS_ENV, jobs)
        # Empty framework caches for each, so neither build reuses the other's work.
        monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(private_dir(tmp_path_factory, "ind")))
        root = private_dir(tmp_path_factory, f"jobs{jobs}")
        if jobs == "1":
            # The serial build runs in a fresh process, as `acache build` does: a pytest
            # worker's process carries Inductor state from earlier tests (a CI run once
            # generated other code in it), and the concurrent build's steps run in fresh
            # workers too. The entry is then read back here as a hit.
            cli = [sys.executable, "-m", "artifactcache.cli", "build", "tiny-llama", "-b", "aoti"]
            done = subprocess.run([*cli, "--cache-dir", str(root)], capture_output=True,
                                  text=True, timeout=600)  # fmt: skip
            assert done.returncode == 0, done.stderr[-2000:]
        with monkeypatch.context() as m:
            if jobs == "2":  # the workers build the model; this process holds none
                m.setattr(aoti, "build_model_for", None)
            built[jobs] = (api.build("tiny-llama", "aoti", cache_dir=root), root)
    (serial, serial_root), (conc, conc_root) = built["1"], built["2"]
    # The CLI's entry, found by its key: the CLI and the API key a build alike.
    assert (serial.built, conc.built) == (False, True), "the CLI's key differs from api.build's"
    assert serial.key == conc.key  # scheduling is no key factor
    s_meta, c_meta = serial.entry.meta, conc.entry.meta
    assert (s_meta["build_jobs"], c_meta["build_jobs"]) == (1, 2)
    # The .so names hash the generated code.
    assert s_meta["steps"] == c_meta["steps"], _first_difference(serial.entry.path, conc.entry.path)
    assert set(s_meta) == set(c_meta)
    assert _sources(serial.entry.path) == _sources(conc.entry.path)
    times = c_meta["compile_seconds"]
    for step in ("prefill", "extend", "decode"):
        for part in ("", "_export", "_export_cpu", "_compile", "_compile_cpu", "_child_start",
                     "_compile_children_cpu", "_imports", "_model", "_worker"):  # fmt: skip
            assert times[f"{step}{part}"] >= 0
    assert times["wall"] >= max(times[f"{s}_worker"] for s in ("prefill", "extend", "decode"))
    # Each worker's compile ran g++ (empty framework caches): its children's CPU shows.
    assert sum(times[f"{s}_compile_children_cpu"] for s in ("prefill", "extend", "decode")) > 0
    serial_times = set(s_meta["compile_seconds"])
    assert {"model", "compiler_probe", "prefill", "extend", "decode", "wall"} <= serial_times
    want = api.load("tiny-llama", "aoti", cache_dir=serial_root, build_on_miss=False)
    got = api.load("tiny-llama", "aoti", cache_dir=conc_root, build_on_miss=False)
    assert got.generate(prompt, 24) == want.generate(prompt, 24)
    assert torch.equal(got.logits(prompt), want.logits(prompt))


def test_jobs_bound_how_many_workers_run_at_once(tmp_path: Path, monkeypatch):
    """ACACHE_BUILD_JOBS=2 with three steps: two workers, then the third once one has
    saved its step (a worker exits right after saving)."""
    spawned: list[float] = []
    real_init = jobs_mod._Worker.__init__

    def counting_init(self, job, log):
        alive = [w for w in made if w.proc.poll() is None and jobs_mod.saved_step(w) is None]
        spawned.append(len(alive))
        real_init(self, job, log)
        made.append(self)

    made: list = []
    monkeypatch.setenv(TIMEOUT_ENV, "120")  # a late worker never sent its config fails, not hangs
    monkeypatch.setattr(jobs_mod._Worker, "__init__", counting_init)
    argv = [sys.executable, "-c", _STAND_IN.format(root=_ROOT, ending="")]
    monkeypatch.setattr(jobs_mod, "worker_argv", lambda: argv)
    ctx = BuildContext(load_recipe("tiny-llama"), BuildChoices(), WeightsSpec())
    workdir, scratch = tmp_path / "entry", tmp_path / "scratch"
    workdir.mkdir()
    scratch.mkdir()
    sos, _ = jobs_mod.build_concurrently("aoti", ctx, workdir, scratch, aoti.STEPS, dict, jobs=2)
    assert set(sos) == {"prefill", "extend", "decode"}
    assert len(made) == 3 and max(spawned) <= 1, spawned  # the third waited for a save
    assert _our_workers() == []


# A stand-in whose decode step runs out of GPU memory on its first worker (every time,
# with "always"), as torch reports it; the other steps save theirs.
_OOM_STAND_IN = """
import os, pickle, sys, time
began = time.time()
sys.path[0] = {root!r}
from artifactcache.backends.shared.build_jobs import StepJob
started = time.monotonic()
job: StepJob = pickle.load(sys.stdin.buffer)
pickle.load(sys.stdin.buffer)
marker = job.workdir / "decode-tried"
if job.step == "decode" and ({always} or not marker.exists()):
    marker.touch()
    msg = {msg!r}
    err = dict(acache=False, module="torch", type={etype!r}, message=msg,
               traceback="torch." + {etype!r} + ": " + msg)
    job.result.write_bytes(pickle.dumps(dict(error=err)))
    sys.exit(1)
if job.step != "decode":
    time.sleep(3)  # still running when decode fails
so = f"{{job.step}}/{{job.step}}.so"
(job.workdir / job.step).mkdir(parents=True, exist_ok=True)
(job.workdir / so).write_bytes(f"{{began}} {{time.time()}}".encode())  # its start and save
report = dict(file=so, timings={{}}, started=started, finished=time.monotonic())
job.result.write_bytes(pickle.dumps(report))
"""


# torch's OutOfMemoryError, and CUDA's own error where a worker's first allocation
# creates its context (an aoti build beside another on an H100, 2026-12-06).
_OOM = {"torch": ("OutOfMemoryError", "CUDA out of memory."),
        "context": ("AcceleratorError", "CUDA error: out of memory\nSearch for ...")}  # fmt: skip


def _oom_build(tmp_path: Path, monkeypatch, always: bool, said: list[str], kind: str = "torch"):
    etype, msg = _OOM[kind]
    code = _OOM_STAND_IN.format(root=_ROOT, always=always, etype=etype, msg=msg)
    monkeypatch.setattr(jobs_mod, "worker_argv", lambda: [sys.executable, "-c", code])
    monkeypatch.setenv(TIMEOUT_ENV, "120")
    ctx = BuildContext(
        load_recipe("tiny-llama"), BuildChoices(), WeightsSpec(), progress=said.append
    )
    workdir, scratch = tmp_path / "entry", tmp_path / "scratch"
    workdir.mkdir()
    scratch.mkdir()
    return workdir, jobs_mod.build_concurrently("aoti", ctx, workdir, scratch, aoti.STEPS, dict)


@pytest.mark.parametrize("kind", sorted(_OOM))
def test_a_step_out_of_gpu_memory_is_built_again_alone(tmp_path: Path, monkeypatch, kind):
    """Another build started at the same time can take the memory this one counted on:
    the step is built once more, after the build's other workers are done."""
    said: list[str] = []
    workdir, (sos, _) = _oom_build(tmp_path, monkeypatch, always=False, said=said, kind=kind)
    assert sos == {s: f"{s}/{s}.so" for s in ("prefill", "extend", "decode")}
    assert len(said) == 1 and "decode step ran out of GPU memory" in said[0], said
    # the second decode worker started once the others had saved theirs
    began, saved = {}, {}
    for s in sos:
        began[s], saved[s] = map(float, (workdir / sos[s]).read_text().split())
    assert began["decode"] > max(saved["prefill"], saved["extend"])
    assert _our_workers() == []


@pytest.mark.parametrize("kind", sorted(_OOM))
def test_a_step_out_of_gpu_memory_twice_is_a_one_line_error(tmp_path: Path, monkeypatch, kind):
    with pytest.raises(BackendError, match="decode step ran out of GPU memory") as e:
        _oom_build(tmp_path, monkeypatch, always=True, said=[], kind=kind)
    assert _OOM[kind][1].splitlines()[0] in str(e.value) and "\n" not in str(e.value)
    assert _our_workers() == []


def test_a_cuda_error_other_than_memory_keeps_its_traceback():
    report = {"error": {"acache": False, "module": "torch", "type": "AcceleratorError",
                        "message": "CUDA error: an illegal memory access was encountered",
                        "traceback": "Traceback ...\ntorch.AcceleratorError: ..."}}  # fmt: skip
    assert not out_of_memory(report)
    assert isinstance(worker_failure("the aoti decode step", report, 1), BuildWorkerFailed)
