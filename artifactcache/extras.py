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


def install_hint(*what: str) -> str:
    """The pip command for entries of EXTRAS (several: one command, extras joined)."""
    return f"pip install 'artifactcache[{','.join(EXTRAS[w] for w in what)}]'"


# Plain TensorRT: the trt backend's default (--mode onnx, every recipe and module) and
# ONNX Runtime's TensorRT EP need the `trt` extra only.
TRT_HINT = install_hint("trt")
# trt --mode llm (TensorRT-LLM) needs the `trtllm` extra as well.
TRTLLM_HINT = install_hint("trt", "trt-llm")
