"""artifactcache/extras.py: every install hint names an extra pyproject.toml declares."""

from __future__ import annotations

import sys
from pathlib import Path

import artifactcache
from artifactcache.doctor import INSTALL
from artifactcache.extras import EXTRAS, TRT_HINT, TRTLLM_HINT, install_hint

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = Path(artifactcache.__file__).parent


def test_every_extra_is_declared() -> None:
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    assert set(EXTRAS.values()) <= set(declared)


def test_hints() -> None:
    assert install_hint("trt-llm") == "pip install 'artifactcache[trtllm]'"
    assert install_hint("ort-gpu") == "pip install 'artifactcache[ort-gpu]'"
    assert install_hint("trt", "trt-llm") == "pip install 'artifactcache[trt,trtllm]'"
    # The trt default (plain TensorRT) needs the trt extra only; --mode llm both.
    assert TRT_HINT == "pip install 'artifactcache[trt]'"
    assert TRTLLM_HINT == "pip install 'artifactcache[trt,trtllm]'"


def test_doctor_rows_read_the_table() -> None:
    assert INSTALL == {
        "eager": None,
        "inductor": None,
        "aoti": None,
        "ort": install_hint("ort"),
        "trt": install_hint("trt"),
        "trt-llm": install_hint("trt-llm"),
    }


def test_no_module_spells_a_hint_itself() -> None:
    offenders = [
        str(path.relative_to(PACKAGE))
        for path in PACKAGE.rglob("*.py")
        if path.name != "extras.py" and "artifactcache[" in path.read_text()
    ]
    assert offenders == []
