"""backends/shared/cpu_isa.py: Inductor's CPU ISA verdicts kept across processes."""

from __future__ import annotations

import platform
import sys

import pytest

cpu_vec_isa = pytest.importorskip("torch._inductor.cpu_vec_isa")

from artifactcache.backends.shared import cpu_isa  # noqa: E402

VecISA = cpu_vec_isa.VecISA
CODE = "int main() { return 0; }"


@pytest.fixture
def probes(monkeypatch):
    """Stand in for torch's check_build: count calls, answer from a table."""
    answers: dict[str, bool] = {}
    calls: list[str] = []

    def check_build(self, code):
        calls.append(str(self))
        return answers.get(str(self), True)

    monkeypatch.setattr(VecISA, "check_build", check_build)
    return answers, calls


def _isa(name: str):
    return next(i for i in cpu_vec_isa.supported_vec_isa_list if str(i) == name)


def test_a_passing_verdict_is_probed_once_then_read_from_the_memo(probes, tmp_path):
    _, calls = probes
    isa = _isa("avx2")
    with cpu_isa.isa_verdicts_kept(tmp_path):
        assert isa.check_build(CODE) and isa.check_build(CODE)
    assert calls == ["avx2"]
    with cpu_isa.isa_verdicts_kept(tmp_path):  # a later process
        assert isa.check_build(CODE)
    assert calls == ["avx2"]
    assert (tmp_path / cpu_isa.MEMO).is_file()


def test_a_failed_probe_is_not_kept(probes, tmp_path):
    answers, calls = probes
    answers["avx512"] = False
    isa = _isa("avx512")
    with cpu_isa.isa_verdicts_kept(tmp_path):
        assert not isa.check_build(CODE)
        assert not isa.check_build(CODE)
    assert calls == ["avx512", "avx512"]  # a timeout today may pass tomorrow


def test_the_key_names_the_isa_the_probe_the_process_and_the_cpu():
    if not hasattr(cpu_vec_isa, "_get_isa_dry_compile_fingerprint"):
        pytest.skip("this torch has no ISA fingerprint: the memo is off and probes run")
    a, b = _isa("avx2"), _isa("avx512")
    ka, kb = cpu_isa.verdict_key(a, CODE), cpu_isa.verdict_key(b, CODE)
    assert ka and kb and ka != kb
    assert cpu_isa.verdict_key(a, CODE + " ") != ka
    assert cpu_isa.cpu_identity() in ka and "avx2" in ka
    assert sys.executable in ka  # the Python the probe's dlopen runs in


def test_the_patch_lives_only_while_a_scope_is_open(probes, tmp_path):
    _, calls = probes
    stand_in = VecISA.__dict__["check_build"]
    with cpu_isa.isa_verdicts_kept(tmp_path):
        with cpu_isa.isa_verdicts_kept(tmp_path):
            assert VecISA.__dict__["check_build"] is not stand_in
        assert VecISA.__dict__["check_build"] is not stand_in  # the outer scope is open
    assert VecISA.__dict__["check_build"] is stand_in
    with cpu_isa.isa_verdicts_kept(None):  # no cache root: nothing patched
        assert VecISA.__dict__["check_build"] is stand_in


def test_a_damaged_memo_is_probed_again_and_rewritten(probes, tmp_path):
    _, calls = probes
    (tmp_path / cpu_isa.MEMO).write_text("{not json")
    with cpu_isa.isa_verdicts_kept(tmp_path):
        assert _isa("avx2").check_build(CODE)
    assert calls == ["avx2"]
    with cpu_isa.isa_verdicts_kept(tmp_path):
        assert _isa("avx2").check_build(CODE)
    assert calls == ["avx2"]


def test_scopes_that_close_out_of_order_put_torchs_method_back(probes, tmp_path):
    """Two loads on two threads: the second joins the first's replacement, and when the
    last one closes torch's own method is back (never a replacement kept as 'real')."""
    stand_in = VecISA.__dict__["check_build"]
    first, second = cpu_isa.isa_verdicts_kept(tmp_path), cpu_isa.isa_verdicts_kept(tmp_path)
    first.__enter__()
    second.__enter__()
    first.__exit__(None, None, None)
    assert VecISA.__dict__["check_build"] is not stand_in  # the second is still open
    second.__exit__(None, None, None)
    assert VecISA.__dict__["check_build"] is stand_in
    with cpu_isa.isa_verdicts_kept(tmp_path):
        assert VecISA.__dict__["check_build"] is not stand_in


def test_a_call_the_memo_does_not_know_goes_to_torch_as_it_is(monkeypatch, tmp_path):
    """A later torch that passes more than the probe's source gets its own answer."""
    calls: list[tuple] = []

    def check_build(self, code, *args, **kwargs):
        calls.append((str(self), args, kwargs))
        return True

    monkeypatch.setattr(VecISA, "check_build", check_build)
    with cpu_isa.isa_verdicts_kept(tmp_path):
        assert _isa("avx2").check_build(CODE, "more", flag=1)
        assert _isa("avx2").check_build(code=CODE)  # the source by name: memoized
        assert _isa("avx2").check_build(CODE)
    assert calls == [("avx2", ("more",), {"flag": 1}), ("avx2", (), {})]


@pytest.mark.slow
@pytest.mark.skipif(platform.machine() != "x86_64", reason="probes an x86 ISA (avx2)")
def test_through_torchs_own_check_a_later_process_runs_no_probe(tmp_path, monkeypatch):
    """torch's check_build compiles the probe (g++) and dlopens it in a child Python
    (``_probe_load``, stubbed here to count); a later scope reads the memo instead."""
    if not hasattr(VecISA, "_probe_load"):
        pytest.skip("this torch dlopens its ISA probe inside check_build: nothing to count")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    probed: list[str] = []
    monkeypatch.setattr(VecISA, "_probe_load", lambda self, path: probed.append(str(self)) or True)
    bool_impl = VecISA._VecISA__bool__impl  # functools.cache: one answer per process
    isa = cpu_vec_isa.VecAVX2()
    for expected in (["avx2"], []):  # a first process probes, a later one reads the memo
        bool_impl.cache_clear()
        probed.clear()
        with cpu_isa.isa_verdicts_kept(tmp_path):
            assert bool(isa)
        assert probed == expected
    bool_impl.cache_clear()


def test_a_prefill_leaves_the_verdicts_a_later_scope_reads(probes, tmp_path):
    """What a concurrent aoti build starts beside its workers: the ISA picked under the
    memo, so a worker's wrapper compile, picking it again, probes nothing."""
    if not hasattr(cpu_vec_isa, "_get_isa_dry_compile_fingerprint"):
        pytest.skip("this torch has no ISA fingerprint: the memo is off and probes run")
    from artifactcache.backends.shared.torch_private import forget_inductor_process_caches

    _, calls = probes
    forget_inductor_process_caches()  # pick_vec_isa answers once per process
    try:
        thread = cpu_isa.prefill_isa_verdicts(None, tmp_path)
        thread.join(timeout=120)
        assert not thread.is_alive()
        if not calls:
            pytest.skip("this CPU offers Inductor no vector ISA to probe")
        probed = list(calls)
        assert (tmp_path / cpu_isa.MEMO).is_file()
        forget_inductor_process_caches()  # a worker: a process of its own
        with cpu_isa.isa_verdicts_kept(tmp_path):
            assert cpu_vec_isa.pick_vec_isa()
        assert calls == probed
    finally:
        forget_inductor_process_caches()
    assert "check_build" not in VecISA.__dict__ or not getattr(
        VecISA.__dict__["check_build"], "_acache_isa_memo", False
    )


def test_a_prefill_that_fails_costs_only_its_saving(monkeypatch, tmp_path):
    def broken():
        raise RuntimeError("no compiler today")

    monkeypatch.setattr(cpu_vec_isa, "pick_vec_isa", broken)
    thread = cpu_isa.prefill_isa_verdicts("/no/such/g++", tmp_path)
    thread.join(timeout=30)
    assert not thread.is_alive() and not (tmp_path / cpu_isa.MEMO).exists()


def test_verdicts_are_keyed_by_the_compiler_the_prefill_was_given(probes, tmp_path):
    """A prefill under aoti's chosen compiler leaves verdicts a compile under that
    compiler reads, and not ones a compile under another compiler would take for its
    own (one process may hold both: the key is computed per compiler)."""
    import shutil

    from torch._inductor import config as inductor_config

    from artifactcache.backends.shared.torch_private import forget_inductor_process_caches

    if not hasattr(cpu_vec_isa, "_get_isa_dry_compile_fingerprint"):
        pytest.skip("this torch has no ISA fingerprint: the memo is off and probes run")
    gxx = shutil.which("g++")
    if gxx is None:
        pytest.skip("no g++ to stand a second compiler in for")
    other = tmp_path / "bin" / "g++"
    other.parent.mkdir()
    other.write_text(f'#!/bin/sh\nexec {gxx} "$@"\n')
    other.chmod(0o755)
    _, calls = probes
    memo = tmp_path / "memo"
    memo.mkdir()  # the cache root's, which a store makes
    forget_inductor_process_caches()
    try:
        cpu_isa.prefill_isa_verdicts(str(other), memo).join(timeout=120)
        if not calls:
            pytest.skip("this CPU offers Inductor no vector ISA to probe")
        probed = len(calls)
        forget_inductor_process_caches()
        with inductor_config.patch({"cpp.cxx": str(other)}), cpu_isa.isa_verdicts_kept(memo):
            cpu_vec_isa.pick_vec_isa()
        assert len(calls) == probed  # the same compiler: read from the memo
        forget_inductor_process_caches()
        with inductor_config.patch({"cpp.cxx": gxx}), cpu_isa.isa_verdicts_kept(memo):
            cpu_vec_isa.pick_vec_isa()
        assert len(calls) > probed  # another compiler file: probed again
    finally:
        forget_inductor_process_caches()
