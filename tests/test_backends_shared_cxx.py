"""The aoti compiler choice and the C++ runtime guard (backends/cxx.py)."""

from __future__ import annotations

import shutil

import pytest
from _backend_util import CRASHING_PROBE, fake_cxx

from artifactcache import keys
from artifactcache.backends.shared import cxx
from artifactcache.errors import BackendError

HAS_GXX = shutil.which("g++") is not None


@pytest.mark.skipif(not HAS_GXX, reason="no g++ on this machine")
def test_user_cxx_wins_when_its_code_runs(monkeypatch, tmp_path):
    import torch  # noqa: F401

    mine = fake_cxx(tmp_path, "my-g++", 'extern "C" int acache_regex_probe(void){return 0;}')
    monkeypatch.setenv("CXX", mine)
    assert cxx.choose_cxx() == mine
    assert cxx.rejected_compilers() == []


@pytest.mark.skipif(not HAS_GXX, reason="no g++ on this machine")
def test_user_cxx_whose_code_crashes_is_skipped(monkeypatch, tmp_path):
    """The GPU image's case: $CXX builds libraries that segfault in this process."""
    import torch  # noqa: F401

    bad = fake_cxx(tmp_path, "crashing-g++", CRASHING_PROBE)
    monkeypatch.setenv("CXX", bad)
    chosen = cxx.choose_cxx()
    assert chosen is not None and chosen != bad
    assert cxx.works_with_runtime(chosen, cxx.loaded_libstdcxx())[0]
    (why,) = cxx.rejected_compilers()
    assert "crashing-g++" in why and "signal 11" in why
    assert cxx.build_record(chosen)["cxx_rejected"] == [why]


def test_cxx_with_arguments_or_missing_is_passed_over_with_a_reason(monkeypatch):
    monkeypatch.setenv("CXX", "ccache g++")
    paths, skipped = cxx._candidates("g++")
    assert skipped == ["CXX='ccache g++' has arguments, which Inductor cannot run"]
    assert all(" " not in p for p in paths)
    monkeypatch.setenv("CXX", "/nonexistent/g++")
    assert cxx._candidates("g++")[1] == ["CXX='/nonexistent/g++' is not on PATH"]


@pytest.mark.skipif(not HAS_GXX, reason="no g++ on this machine")
def test_a_probe_child_that_cannot_run_is_no_evidence_against_the_compiler(monkeypatch):
    """E.g. a child without torch, or a noexec temp dir: keep the compiler, say so."""
    import sys

    monkeypatch.setattr(sys, "executable", "/bin/false")  # the child exits 1
    cxx.probe_compiler.cache_clear()
    try:
        verdict, why = cxx.probe_compiler(shutil.which("g++"), "/x/libstdc++.so.6")
        assert verdict == cxx.UNCHECKED and "exited 1" in why
    finally:
        cxx.probe_compiler.cache_clear()


def test_a_verified_runtime_is_trusted_over_the_reported_path(monkeypatch):
    import torch  # noqa: F401

    monkeypatch.delenv("LD_PRELOAD", raising=False)
    loaded = cxx.loaded_libstdcxx()
    meta = {"cxx": "/opt/x/g++", "libstdcxx": "/opt/x/libstdc++.so.6", "libstdcxx_verified": loaded}
    cxx.check_runtime(meta)  # the probe saw its code run against this very runtime


@pytest.mark.skipif(not HAS_GXX, reason="no g++ on this machine")
def test_choice_links_the_loaded_runtime(monkeypatch):
    import torch  # noqa: F401  (maps libstdc++ into this process, as a real load does)

    monkeypatch.delenv("CXX", raising=False)
    loaded = cxx.loaded_libstdcxx()
    assert loaded and "libstdc++" in loaded
    chosen = cxx.choose_cxx()
    assert chosen is not None
    assert cxx.compiler_libstdcxx(shutil.which(chosen)) == loaded
    assert cxx.build_record(chosen)["libstdcxx"] == loaded


def test_mismatched_runtime_is_a_one_line_error(monkeypatch):
    import torch  # noqa: F401

    monkeypatch.delenv("LD_PRELOAD", raising=False)
    meta = {"cxx": "/opt/gcc/bin/g++", "libstdcxx": "/opt/gcc/lib64/libstdc++.so.6.0.34"}
    with pytest.raises(BackendError) as e:
        cxx.check_runtime(meta)
    msg = str(e.value)
    assert "\n" not in msg and "LD_PRELOAD=" in msg and "--force" in msg


def test_matching_or_preloaded_runtime_passes(monkeypatch):
    import torch  # noqa: F401

    loaded = cxx.loaded_libstdcxx()
    cxx.check_runtime({"libstdcxx": loaded})  # same runtime
    cxx.check_runtime({})  # entries from before the record existed
    monkeypatch.setenv("LD_PRELOAD", "/usr/lib/x86_64-linux-gnu/libstdc++.so.6")
    cxx.check_runtime({"libstdcxx": "/elsewhere/libstdc++.so.6.0.99"})


def test_missing_compiler_is_a_one_line_cli_error(monkeypatch):
    from typer.testing import CliRunner

    from artifactcache.cli.app import app

    monkeypatch.setenv("CXX", "/nonexistent/g++")
    for backend in ("inductor", "aoti"):
        res = CliRunner().invoke(app, ["build", "tiny-llama", "--backend", backend])
        assert res.exit_code == 1
        lines = res.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and "install g++" in lines[0]


class ProbeCounter:
    """Counts the subprocesses cxx.py runs: compiles and probe children."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        import subprocess
        import sys
        import threading

        self.compiles = self.children = 0
        real = subprocess.run

        lock = threading.Lock()  # probes may run side by side (cxx._probe_at_once)

        def counting_run(argv, *args, **kwargs):
            with lock:
                if argv[0] == sys.executable:
                    self.children += 1
                else:
                    self.compiles += 1
            return real(argv, *args, **kwargs)

        monkeypatch.setattr(cxx.subprocess, "run", counting_run)

    @property
    def runs(self) -> int:
        return self.compiles + self.children


@pytest.fixture
def probe_memo(tmp_path, monkeypatch):
    """(memo dir, a compiler of our own, the loaded runtime); no verdicts in memory."""
    import torch  # noqa: F401  (maps libstdc++ as a build process has it)

    memo = tmp_path / "state"
    memo.mkdir()
    mine = fake_cxx(tmp_path, "my-g++", 'extern "C" int acache_regex_probe(void){return 0;}')
    cxx.probe_compiler.cache_clear()
    yield memo, mine, cxx.loaded_libstdcxx()
    cxx.probe_compiler.cache_clear()


@pytest.mark.skipif(not HAS_GXX, reason="no g++ on this machine")
def test_a_probe_verdict_is_kept_on_disk_and_reused(probe_memo, monkeypatch):
    import json

    memo, mine, runtime = probe_memo
    count = ProbeCounter(monkeypatch)
    assert cxx.probe_compiler(mine, runtime, memo) == (cxx.OK, "")
    assert (count.compiles, count.children) == (1, 1)
    assert list(json.loads((memo / cxx.PROBE_MEMO).read_text()).values()) == [[cxx.OK, ""]]
    cxx.probe_compiler.cache_clear()  # as a new process starts
    assert cxx.probe_compiler(mine, runtime, memo) == (cxx.OK, "")
    assert count.runs == 2  # nothing ran the second time
    assert not list(memo.glob("*.tmp"))


def test_a_changed_compiler_or_a_damaged_memo_probes_again(probe_memo, monkeypatch):
    """The memo's logic alone: the probe itself is counted, not run (the test above runs it)."""
    import os

    memo, mine, runtime = probe_memo
    probes: list[str] = []
    monkeypatch.setattr(cxx, "_run_probe", lambda c, r: probes.append(c) or (cxx.OK, "", True))

    def fresh_process_probe() -> tuple[str, str]:
        cxx.probe_compiler.cache_clear()
        return cxx.probe_compiler(mine, runtime, memo)

    fresh_process_probe()
    fresh_process_probe()
    assert len(probes) == 1
    st = os.stat(mine)
    os.utime(mine, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))  # an upgrade in place
    assert fresh_process_probe() == (cxx.OK, "") and len(probes) == 2
    with open(mine, "a") as f:
        f.write("# same mtime, new size\n")
    os.utime(mine, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    assert fresh_process_probe() == (cxx.OK, "") and len(probes) == 3
    for damage in ("{not json", "[1, 2]", '{"x": 1}', "\udcff"):
        (memo / cxx.PROBE_MEMO).write_text(damage, errors="surrogateescape")
        assert fresh_process_probe() == (cxx.OK, "")
    assert len(probes) == 7
    fresh_process_probe()  # the memo was rewritten whole
    assert len(probes) == 7
    monkeypatch.setattr(keys, "package_version", lambda dist: "9.9")  # another torch
    fresh_process_probe()
    assert len(probes) == 8


@pytest.mark.skipif(not HAS_GXX, reason="no g++ on this machine")
def test_a_crash_is_remembered_but_a_child_that_could_not_run_is_not(probe_memo, tmp_path):
    import sys

    memo, _, runtime = probe_memo
    bad = fake_cxx(tmp_path, "crashing-g++", CRASHING_PROBE)
    verdict, why = cxx.probe_compiler(bad, runtime, memo)
    assert verdict == cxx.REJECTED and "signal 11" in why
    cxx.probe_compiler.cache_clear()
    real_python = sys.executable
    try:
        sys.executable = "/bin/false"  # any probe child now exits 1
        assert cxx.probe_compiler(bad, runtime, memo) == (verdict, why)  # from the memo
        gxx = shutil.which("g++")
        assert cxx.probe_compiler(gxx, runtime, memo)[0] == cxx.UNCHECKED
    finally:
        sys.executable = real_python
    cxx.probe_compiler.cache_clear()
    memo_text = (memo / cxx.PROBE_MEMO).read_text()
    assert "crashing-g++" in memo_text and gxx not in memo_text


@pytest.mark.skipif(not HAS_GXX, reason="no g++ on this machine")
def test_doctor_probes_once_per_cache(monkeypatch, tmp_path):
    from artifactcache.doctor import doctor_report
    from artifactcache.store.local import LocalStore

    root = tmp_path / "cache"
    LocalStore(root)  # an existing cache: doctor keeps its verdicts there
    monkeypatch.delenv("CXX", raising=False)
    cxx.probe_compiler.cache_clear()
    count = ProbeCounter(monkeypatch)
    try:
        first = doctor_report(root, None, full=True)["compiler"]
        assert count.children >= 1
        children = count.children
        cxx.probe_compiler.cache_clear()  # as a new `acache doctor` process starts
        assert doctor_report(root, None, full=True)["compiler"] == first
        assert count.children == children
    finally:
        cxx.probe_compiler.cache_clear()
    assert (root / "v1" / cxx.PROBE_MEMO).is_file()


def test_aoti_builds_get_the_stores_memo_dir(tmp_path, monkeypatch):
    """api hands the store's v1 dir to the build, where the aoti build keeps verdicts."""
    from artifactcache import api
    from artifactcache.backends.aoti import backend as aoti

    seen: list = []

    def stop(opts, memo_dir):
        seen.append(memo_dir)
        raise RuntimeError("stop before compiling")

    monkeypatch.setattr(aoti, "inductor_configs", stop)
    with pytest.raises(RuntimeError, match="stop before compiling"):
        api.build("tiny-llama", "aoti", cache_dir=tmp_path / "cache")
    assert seen == [tmp_path / "cache" / "v1"]


@pytest.mark.skipif(not HAS_GXX, reason="no g++ on this machine")
def test_the_candidates_are_probed_side_by_side_and_both_verdicts_kept(
    probe_memo, monkeypatch, tmp_path
):
    """The H200 image's case: $CXX crashes, so the choice needs two probes; they run at
    once (a barrier that only two probes in flight together can pass), and neither
    verdict is lost from the memo. Next time the kept verdicts answer, with no probe."""
    import json
    import threading

    memo, _mine, runtime = probe_memo
    bad = fake_cxx(tmp_path, "crashing-g++", CRASHING_PROBE)
    gxx = shutil.which("g++")
    monkeypatch.setattr(cxx, "_candidates", lambda default: ([bad, gxx], []))
    both_in_flight = threading.Barrier(2, timeout=30)
    real = cxx._run_probe
    calls: list[str] = []

    def probe_waiting_for_the_other(c: str, rt: str) -> tuple[str, str, bool]:
        calls.append(c)
        both_in_flight.wait()  # BrokenBarrierError if the probes ran one after the other
        return real(c, rt)

    monkeypatch.setattr(cxx, "_run_probe", probe_waiting_for_the_other)
    chosen, rejected = cxx.compiler_choice(memo_dir=memo)
    assert chosen == gxx and "signal 11" in rejected[0] and len(calls) == 2
    kept = json.loads((memo / cxx.PROBE_MEMO).read_text())
    assert sorted(v[0] for v in kept.values()) == [cxx.OK, cxx.REJECTED]
    cxx.probe_compiler.cache_clear()  # as a new process starts
    monkeypatch.setattr(cxx, "_run_probe", lambda c, rt: pytest.fail(f"probed {c} again"))
    assert cxx.compiler_choice(memo_dir=memo)[0] == gxx
    assert cxx.remembered_verdict(bad, memo)[0] == cxx.REJECTED  # the quick doctor's view


def test_the_first_candidate_that_works_does_not_wait_for_the_others(probe_memo, monkeypatch):
    """Probed side by side, a first candidate that passes is chosen while a later one's
    probe still runs (it may hang for a minute): nothing waits for it, and its error
    is never raised. Candidates after one the memo knows works are not probed."""
    import threading

    memo, _mine, runtime = probe_memo
    started, release, finished = threading.Event(), threading.Event(), threading.Event()

    def probe(c: str, rt: str) -> tuple[str, str, bool]:
        if c == "/first":
            assert started.wait(timeout=30)  # /slow is in flight when /first passes
            return cxx.OK, "", False
        started.set()
        release.wait(timeout=30)
        finished.set()
        raise OSError("a later candidate's probe broke")

    monkeypatch.setattr(cxx, "_run_probe", probe)
    monkeypatch.setattr(cxx, "_memo_key", lambda c, rt: None)
    monkeypatch.setattr(cxx, "_candidates", lambda default: (["/first", "/slow"], []))
    try:
        assert cxx.compiler_choice(memo_dir=memo) == ("/first", ())
        assert not finished.is_set()  # chosen while /slow was still being probed
    finally:
        release.set()
    assert finished.wait(timeout=30)
    cxx.probe_compiler.cache_clear()
    starts: list[str] = []
    monkeypatch.setattr(cxx, "_kept_verdict", lambda c, rt, d: (cxx.OK, "") if c == "/ok" else None)
    monkeypatch.setattr(cxx, "_candidates", lambda default: (["/a", "/ok", "/b", "/c"], []))
    monkeypatch.setattr(
        cxx, "_run_probe", lambda c, rt: starts.append(c) or (cxx.REJECTED, "no", True)
    )
    assert cxx.compiler_choice(memo_dir=memo)[0] == "/ok"
    assert starts == ["/a"]  # /b and /c come after the known-good /ok: never probed
