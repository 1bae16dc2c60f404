"""backends/inductor/cpu_isa.py: Inductor's CPU ISA verdicts kept across processes."""

from __future__ import annotations

import pytest

cpu_vec_isa = pytest.importorskip("torch._inductor.cpu_vec_isa")

from artifactcache.backends.inductor import cpu_isa  # noqa: E402

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


def test_the_key_names_the_isa_the_probe_and_the_cpu():
    a, b = _isa("avx2"), _isa("avx512")
    ka, kb = cpu_isa.verdict_key(a, CODE), cpu_isa.verdict_key(b, CODE)
    assert ka and kb and ka != kb
    assert cpu_isa.verdict_key(a, CODE + " ") != ka
    assert cpu_isa.cpu_identity() in ka and "avx2" in ka


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
