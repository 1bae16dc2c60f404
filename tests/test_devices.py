"""artifactcache/devices.py: the one rule for device strings, used everywhere."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import artifactcache
from artifactcache.devices import device_index, device_type, is_cuda, parse_device
from artifactcache.errors import BackendError
from artifactcache.keys import hardware_fingerprint

PACKAGE = Path(artifactcache.__file__).parent


@pytest.mark.parametrize(
    ("device", "parsed"),
    [
        ("cpu", ("cpu", None)),
        ("cuda", ("cuda", None)),
        ("cuda:0", ("cuda", 0)),
        ("cuda:12", ("cuda", 12)),
    ],
)
def test_parse_device_accepts(device: str, parsed: tuple[str, int | None]) -> None:
    assert parse_device(device) == parsed


@pytest.mark.parametrize(
    "device", ["", "gpu", "CUDA", "cuda:", "cuda:x", "cuda:-1", "cpu:0", " cpu", "mps"]
)
def test_parse_device_refuses(device: str) -> None:
    with pytest.raises(BackendError, match=r"unknown device .*: use cpu, cuda or cuda:N"):
        parse_device(device)


def test_type_index_and_cuda() -> None:
    assert [device_type(d) for d in ("cpu", "cuda", "cuda:3")] == ["cpu", "cuda", "cuda"]
    assert [device_index(d) for d in ("cpu", "cuda", "cuda:3")] == [0, 0, 3]
    assert [is_cuda(d) for d in ("cpu", "cuda", "cuda:3")] == [False, True, True]


def test_keys_use_the_same_rule() -> None:
    # Before one rule, the hardware factor took the text before ":" and keyed "cuda:x" as cuda.
    with pytest.raises(BackendError, match="unknown device 'cuda:x'"):
        hardware_fingerprint("cuda:x")


AD_HOC = re.compile(
    r"""device\S*\.(startswith\(["']cuda|split\(["']:)|torch\.device\([^)]*\)\.index"""
)


def test_no_module_parses_devices_on_its_own() -> None:
    offenders = [
        f"{path.relative_to(PACKAGE)}:{n}"
        for path in PACKAGE.rglob("*.py")
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if AD_HOC.search(line)
    ]
    assert offenders == []
