"""backends/tensorrt/util.py: the plan header and the compatibility verdict, without TensorRT."""

from __future__ import annotations

from artifactcache.backends.tensorrt import util


def _header(major: int, minor: int, patch: int) -> bytes:
    head = bytearray(32)
    head[24:27] = bytes([major, minor, patch])
    return bytes(head)


def test_plan_header_version():
    assert util.plan_header_version(_header(10, 3, 0)) == (10, 3, 0)
    assert util.plan_header_version(_header(10, 3, 0)[:20]) is None  # too short
    assert util.plan_header_version(_header(0, 0, 0)) is None  # not a layout we know


def test_compat_problem():
    meta = {"tensorrt": "10.3.0", "compute_capability": "9.0"}
    assert util.compat_problem(meta, "10.3.0", "9.0") is None
    assert util.compat_problem(meta, "10.3.0.26", "9.0") is None  # build number ignored
    assert "built with TensorRT 10.3.0, this runtime is TensorRT 10.4.0" in util.compat_problem(
        meta, "10.4.0", "9.0"
    )
    assert "compute capability 9.0, this GPU is 8.0" in util.compat_problem(meta, "10.3.0", "8.0")
    assert "records no TensorRT version" in util.compat_problem({}, "10.3.0", "9.0")


def test_a_version_compatible_engine_runs_on_later_tensorrt():
    meta = {"tensorrt": "10.3.0", "compute_capability": "9.0", "allow_host_code": True}
    assert util.compat_problem(meta, "10.4.0", "9.0") is None
    assert util.compat_problem(meta, "11.4.0.106", "9.0") is None
    assert "built with TensorRT 10.3.0 runs on that version or later, this runtime is " in (
        util.compat_problem(meta, "10.2.1", "9.0")
    )
    assert "this GPU is 8.0" in util.compat_problem(meta, "10.4.0", "8.0")  # still per GPU


def test_the_plan_header_is_advisory():
    meta = {"tensorrt": "10.3.0"}
    assert util.header_note(meta, _header(10, 3, 0)) is None
    assert util.header_note(meta, b"\0" * 32) is None  # cannot be parsed: no verdict
    note = util.header_note(meta, _header(10, 2, 0))
    assert "reads TensorRT 10.2.0, the manifest says 10.3.0" in note and "advisory" in note


def test_a_tensorrt_that_is_found_but_does_not_import_is_one_line(monkeypatch, tmp_path):
    """The bare bindings wheel: the package is there, its libnvinfer is not."""
    import sys

    import pytest

    from artifactcache.errors import BackendUnavailable

    pkg = tmp_path / "tensorrt"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(
        'raise ImportError("libnvinfer.so.11: cannot open shared object file")\n'
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "tensorrt", raising=False)
    with pytest.raises(BackendUnavailable) as e:
        util.import_tensorrt()
    message = str(e.value)
    assert message.startswith("tensorrt does not import (libnvinfer.so.11: cannot open")
    assert "pip install 'artifactcache[trt]'" in message and "\n" not in message
