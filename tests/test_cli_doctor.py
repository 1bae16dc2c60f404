"""`acache doctor --json`: a stable schema, and honest reasons for what is missing."""

from __future__ import annotations

import importlib.util
import json
import os
import re

import pytest
from _backend_util import CRASHING_PROBE, fake_cxx
from typer.testing import CliRunner

from artifactcache.cli.app import app
from artifactcache.doctor import BACKEND_ROWS, DOCTOR_SCHEMA
from artifactcache.settings import SETTINGS

TOP_KEYS = {
    "schema",
    "python",
    "platform",
    "torch",
    "driver",
    "gpus",
    "device_checked",
    "backends",
    "compiler",
    "cache",
    "remote",
    "settings",
    "bytecode",
    "probed",
}
BACKEND_KEYS = {"name", "available", "reason", "install"}
SETTING_KEYS = {"name", "kind", "value", "default", "doc", "internal", "problem"}
CACHE_KEYS = {"dir", "exists", "mode", "owner_is_you", "size_bytes", "entries", "problem", "stray"}


def _doctor(*args: str, env: dict | None = None) -> dict:
    r = CliRunner().invoke(app, ["doctor", "--json", *args], env=env)
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def test_schema_is_stable(cache_dir):
    rep = _doctor()
    assert set(rep) == TOP_KEYS and rep["schema"] == DOCTOR_SCHEMA
    assert set(rep["torch"]) >= {"version", "cuda", "cuda_available"}
    assert [b["name"] for b in rep["backends"]] == list(BACKEND_ROWS)
    for b in rep["backends"]:
        assert set(b) == BACKEND_KEYS and isinstance(b["available"], bool)
        assert b["available"] or b["reason"]  # never "no" without a reason
    assert set(rep["cache"]) == CACHE_KEYS
    assert rep["cache"]["dir"] == str(cache_dir) and rep["cache"]["mode"] == "0700"
    assert rep["cache"]["problem"] is None
    assert rep["remote"] == {"configured": False, "url": None}
    assert set(rep["compiler"]) == {
        "cxx_env", "chosen", "version", "runtime", "passed_over", "checked"
    }  # fmt: skip
    for g in rep["gpus"]:
        assert set(g) == {"index", "name", "compute_capability", "memory_bytes"}
    assert [s["name"] for s in rep["settings"]] == list(SETTINGS)
    for s in rep["settings"]:
        assert set(s) == SETTING_KEYS and s["doc"] and s["problem"] is None
    by_name = {s["name"]: s for s in rep["settings"]}
    assert by_name["ACACHE_DIR"]["value"] == str(cache_dir)
    assert by_name["ACACHE_VERIFY"]["default"] == "memo"
    assert set(rep["bytecode"]) == {"writes_bytecode", "pycache_prefix", "torch_bytecode",
                                    "problem"}  # fmt: skip


@pytest.mark.skipif(importlib.util.find_spec("tensorrt") is not None, reason="tensorrt present")
def test_says_trt_and_trtllm_are_unavailable_with_reason(cache_dir):
    rows = {b["name"]: b for b in _doctor()["backends"]}
    # The trt row is the default (plain TensorRT): the trt extra, no TensorRT-LLM.
    assert rows["trt"]["available"] is False
    assert rows["trt"]["reason"] == "tensorrt not importable: pip install 'artifactcache[trt]'"
    assert rows["trt"]["install"] == "pip install 'artifactcache[trt]'"
    # The trt-llm row is --mode llm: the trtllm extra, and the way back to the default.
    assert rows["trt-llm"]["available"] is False
    assert rows["trt-llm"]["reason"].startswith("tensorrt_llm not importable")
    assert "drop --mode llm" in rows["trt-llm"]["reason"]
    assert rows["trt-llm"]["install"] == "pip install 'artifactcache[trtllm]'"
    assert rows["eager"]["available"] is True and rows["eager"]["install"] is None
    assert rows["ort"]["available"] is (importlib.util.find_spec("onnxruntime") is not None)


def test_cache_size_and_unsafe_permissions(tmp_path):
    root = tmp_path / "c"
    rep = _doctor("--cache-dir", str(root))
    assert rep["cache"]["exists"] is False and "does not exist yet" in rep["cache"]["problem"]
    assert not root.exists()  # doctor only looks
    (root / "v1" / "entries" / "ab" / ("ab" + "0" * 62)).mkdir(parents=True)
    (root / "v1" / "entries" / "ab" / ("ab" + "0" * 62) / "f.bin").write_bytes(b"x" * 1000)
    os.chmod(root, 0o777)
    rep = _doctor("--cache-dir", str(root))
    assert rep["cache"]["size_bytes"] == 1000 and rep["cache"]["entries"] == 1
    assert (
        rep["cache"]["mode"] == "0777" and "writable by group or others" in rep["cache"]["problem"]
    )


def test_remote_is_checked_when_configured(cache_dir):
    rep = _doctor("--remote", "s3://")
    r = rep["remote"]
    assert r["configured"] is True and r["url"] == "s3://"
    assert r.get("error")  # an unusable URL is reported, not raised


def test_human_output_shows_each_backend_row_as_the_json_does(cache_dir):
    env = {"COLUMNS": "400"}  # one table row per line
    rows = {b["name"]: b for b in _doctor(env=env)["backends"]}
    r = CliRunner().invoke(app, ["doctor"], env=env)
    assert r.exit_code == 0, r.output
    table = {
        m["name"]: (m["available"], m["why"])
        for m in re.finditer(
            r"^│ (?P<name>\S+)\s+│ (?P<available>yes|no)\s+│ (?P<why>.*?)\s*│$", r.output, re.M
        )
    }
    assert list(table) == list(BACKEND_ROWS)
    for name, row in rows.items():
        # an unavailable row carries its reason, install hint included where there is one
        want = ("yes", "") if row["available"] else ("no", row["reason"])
        assert table[name] == want, name


def test_names_a_crashing_cxx_it_passes_over(cache_dir, monkeypatch, tmp_path):
    """The GPU image's trap: $CXX builds code that crashes; doctor says which and why."""
    import shutil

    if shutil.which("g++") is None:
        pytest.skip("no g++ on this machine")
    from artifactcache import doctor

    _store_root(cache_dir)  # a cache with v1/, where the probe keeps its verdicts
    bad = fake_cxx(tmp_path, "bad-g++", CRASHING_PROBE)
    monkeypatch.setenv("CXX", bad)
    quick = _doctor()["compiler"]  # the quick look does not probe
    assert quick["chosen"] == bad and quick["checked"] is False
    cc = _doctor("--full")["compiler"]
    assert cc["cxx_env"] == bad and cc["chosen"] and cc["chosen"] != bad and cc["checked"]
    assert any("bad-g++" in why and "signal 11" in why for why in cc["passed_over"])
    later = doctor._quick_compiler(cache_dir / "v1")  # the kept verdicts, read without torch
    assert later["chosen"] == cc["chosen"] and later["checked"] is True
    assert any("bad-g++" in why for why in later["passed_over"])


def test_stray_items_in_entries_are_reported_not_fatal(cache_dir):
    entries = cache_dir / "v1" / "entries"
    (entries / "ab" / ("ab" + "0" * 62)).mkdir(parents=True)
    (entries / "cd").write_text("a file where a prefix dir belongs")
    (entries / "ab" / "junk").write_text("x")
    rep = _doctor()
    assert rep["cache"]["entries"] == 1
    assert rep["cache"]["stray"] == ["entries/ab/junk", "entries/cd"]
    r = CliRunner().invoke(app, ["doctor"])
    assert r.exit_code == 0 and "stray item entries/cd" in r.stdout


def test_settings_in_effect_and_a_refused_value_are_reported_not_fatal(cache_dir, monkeypatch):
    monkeypatch.setenv("ACACHE_VERIFY", "bogus")
    monkeypatch.setenv("ACACHE_LOAD_THREADS", "3")
    monkeypatch.delenv("ACACHE_ORT_VERBOSE", raising=False)
    rows = {s["name"]: s for s in _doctor()["settings"]}
    assert (
        rows["ACACHE_LOAD_THREADS"]["value"] == "3"
        and rows["ACACHE_LOAD_THREADS"]["problem"] is None
    )
    assert rows["ACACHE_VERIFY"]["value"] == "bogus"
    assert "ACACHE_VERIFY='bogus'" in rows["ACACHE_VERIFY"]["problem"]
    assert rows["ACACHE_ORT_VERBOSE"]["value"] is None
    r = CliRunner().invoke(app, ["doctor"], env={"COLUMNS": "400"})
    assert r.exit_code == 0, r.output
    lines = {
        m[0]: (m[1], m[2])
        for m in re.findall(r"^│ (ACACHE_\w+)\s+│ (.*?)\s+│ (.*?)\s*│$", r.output, re.M)
    }
    assert list(lines) == list(SETTINGS)
    assert lines["ACACHE_LOAD_THREADS"] == ("3", SETTINGS["ACACHE_LOAD_THREADS"].doc)
    assert lines["ACACHE_ORT_VERBOSE"] == ("(default: False)", SETTINGS["ACACHE_ORT_VERBOSE"].doc)
    assert lines["ACACHE_VERIFY"][1].startswith("refused: ACACHE_VERIFY='bogus'")


def _store_root(cache_dir):
    from artifactcache.store.local import LocalStore

    LocalStore(cache_dir)  # an existing cache: doctor keeps its memo there
    return cache_dir


def test_a_repeat_doctor_reuses_the_toolchain_checks(cache_dir, monkeypatch):
    from artifactcache import doctor

    _store_root(cache_dir)
    first = _doctor("--full")
    assert first["probed"]["from_memo"] is False and (cache_dir / "v1" / doctor.MEMO).is_file()

    def no_probe(_memo_dir):
        raise AssertionError("probed again on the same toolchain")

    monkeypatch.setattr(doctor, "_probe", no_probe)
    again = _doctor()
    assert again["probed"] == {"at": first["probed"]["at"], "from_memo": True, "full": True}
    for k in doctor.PROBED_KEYS:
        assert again[k] == first[k], k
    r = CliRunner().invoke(app, ["doctor"])
    assert r.exit_code == 0 and "kept for this toolchain" in r.stdout


def test_full_and_a_changed_toolchain_probe_again(cache_dir, monkeypatch):
    from artifactcache import doctor

    _store_root(cache_dir)
    calls = []
    real = doctor._probe
    monkeypatch.setattr(doctor, "_probe", lambda d: calls.append(d) or real(d))
    quick = _doctor()["probed"]
    assert quick["full"] is False and quick["from_memo"] is False and not calls
    assert not (cache_dir / "v1" / doctor.MEMO).exists()  # quick checks are not kept
    assert _doctor("--full")["probed"]["from_memo"] is False and len(calls) == 1
    assert _doctor()["probed"]["from_memo"] is True and len(calls) == 1
    assert _doctor("--full")["probed"]["from_memo"] is False and len(calls) == 2
    monkeypatch.setenv("CXX", "/nonexistent/g++")  # the compiler choice depends on it
    again = _doctor()["probed"]
    assert {k: v for k, v in again.items() if k != "at"} == {
        k: v for k, v in quick.items() if k != "at"
    }
    assert len(calls) == 2


def test_a_corrupt_memo_is_probed_over_and_no_cache_means_no_memo(cache_dir, tmp_path):
    from artifactcache import doctor

    _store_root(cache_dir)
    (cache_dir / "v1" / doctor.MEMO).write_text("{not json")
    assert _doctor()["probed"]["from_memo"] is False
    assert _doctor("--full")["probed"]["from_memo"] is False
    assert json.loads((cache_dir / "v1" / doctor.MEMO).read_text())  # rewritten whole
    absent = tmp_path / "no-cache-yet"
    rep = _doctor("--full", "--cache-dir", str(absent))
    assert rep["probed"]["from_memo"] is False and not absent.exists()  # never created


def test_a_python_that_neither_has_nor_writes_torch_bytecode_is_named(
    cache_dir, monkeypatch, tmp_path
):
    """As the H200 image was: PYTHONDONTWRITEBYTECODE=1 and no .pyc in site-packages.
    An empty pycache prefix makes this machine's torch look the same."""
    import sys

    monkeypatch.setattr(sys, "pycache_prefix", str(tmp_path / "empty"))
    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    assert _doctor()["bytecode"]["problem"] is None  # it would write them: no problem
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    b = _doctor()["bytecode"]
    assert b["torch_bytecode"] is False and "compileall" in b["problem"]
    r = CliRunner().invoke(app, ["doctor"])
    assert r.exit_code == 0 and "PYTHONDONTWRITEBYTECODE" in r.output


def test_the_quick_look_imports_no_torch_and_agrees_with_the_full_checks(cache_dir):
    """Without --full and without kept checks, doctor answers from what is installed: a
    fresh process that never imports torch (seconds on a machine without torch's
    bytecode), saying what the full checks say of torch and each backend here."""
    import subprocess
    import sys

    code = (
        "import sys; from typer.testing import CliRunner; "
        "from artifactcache.cli.app import app; "
        "r = CliRunner().invoke(app, ['doctor', '--json']); "
        "assert r.exit_code == 0, r.output; print(r.stdout); "
        "sys.exit(3 if 'torch' in sys.modules else 0)"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-2000:]
    quick, full = json.loads(run.stdout), _doctor("--full")
    assert quick["probed"]["full"] is False and full["probed"]["full"] is True
    for key in ("version", "cuda", "cuda_available"):
        assert quick["torch"][key] == full["torch"][key], key
    assert quick["device_checked"] == full["device_checked"]
    assert [g["name"] for g in quick["gpus"]] == [g["name"] for g in full["gpus"]]
    for q, f in zip(quick["backends"], full["backends"], strict=True):
        assert (q["name"], q["available"]) == (f["name"], f["available"])


def test_the_quick_look_says_what_is_missing(tmp_path, monkeypatch):
    from artifactcache import doctor

    version_py = "__version__ = '2.11.0+cu130'\ndebug = False\ncuda: Optional[str] = '13.0'\n"
    (tmp_path / "version.py").write_text(version_py)
    assert doctor._torch_build(tmp_path) == ("2.11.0+cu130", "13.0")
    (tmp_path / "version.py").write_text("__version__ = '2.13.0+cpu'\ncuda: Optional[str] = None\n")
    assert doctor._torch_build(tmp_path) == ("2.13.0+cpu", None)
    assert doctor._torch_build(tmp_path / "absent") == (None, None)
    no_torch = doctor._quick_backend("eager", "cpu", None)
    assert no_torch["available"] is False and "torch is not installed" in no_torch["reason"]
    assert "AOTInductor" in doctor._quick_backend("aoti", "cpu", tmp_path)["reason"]
    (tmp_path / "_inductor").mkdir()
    monkeypatch.setenv("CXX", "/nonexistent/g++")
    assert "no C++ compiler" in doctor._quick_backend("aoti", "cpu", tmp_path)["reason"]
    assert doctor._quick_backend("eager", "cpu", tmp_path)["available"] is True


def test_the_quick_look_sees_the_gpus_cuda_visible_devices_shows():
    from artifactcache.doctor import visible_devices

    gpus = [{"name": f"g{i}", "uuid": f"GPU-{i}aaa"} for i in range(3)]
    assert visible_devices(gpus, None) == gpus
    assert visible_devices(gpus, "") == [] and visible_devices(gpus, "-1") == []
    assert visible_devices(gpus, "2,0") == [gpus[2], gpus[0]]
    assert visible_devices(gpus, "1,7,0") == [gpus[1]]  # CUDA stops at the first bad one
    assert visible_devices(gpus, "GPU-2a, 0") == [gpus[2], gpus[0]]
    assert visible_devices(gpus, "1,1") == [gpus[1]]


def test_a_cxx_that_cannot_be_tried_is_passed_over_in_the_quick_look(cache_dir, monkeypatch):
    import shutil

    if shutil.which("g++") is None:
        pytest.skip("no g++ on this machine")
    monkeypatch.setenv("CXX", "g++ -O2")
    cc = _doctor()["compiler"]
    assert cc["chosen"] and "-O2" not in cc["chosen"]
    assert any("has arguments" in why for why in cc["passed_over"])
