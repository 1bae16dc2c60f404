"""Which pip extra brings which optional dependency: every "how to install" line comes from here.

Torch-free and dependency-free, so the store, the backends and ``acache doctor``
all read the one table.
"""

from __future__ import annotations

# What needs an optional dependency -> the extra in pyproject.toml that installs it.
EXTRAS = {
    "ort": "ort",
    "ort-gpu": "ort-gpu",
    "trt": "trt",
    "trt-llm": "trtllm",
    "s3": "s3",
}


def install_hint(what: str) -> str:
    """The pip command for one entry of EXTRAS."""
    return f"pip install 'artifactcache[{EXTRAS[what]}]'"


# TensorRT's LLM recipes go through TensorRT-LLM, a second extra on top of trt.
TRT_HINT = f"{install_hint('trt')} (and 'artifactcache[{EXTRAS['trt-llm']}]' for LLM recipes)"
