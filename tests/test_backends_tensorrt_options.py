"""backends/tensorrt/options.py: the precision plan and the engine options, without TensorRT."""

from __future__ import annotations

import pytest

from artifactcache.backends.tensorrt import options
from artifactcache.choices import BuildChoices
from artifactcache.errors import BackendError


@pytest.mark.parametrize(
    "precision, major, typing, qdq, want",
    [
        ("fp32", 10, "strong", False, (True, (), "fp32")),
        ("fp16", 10, "strong", False, (True, (), "fp16")),
        ("bf16", 11, "strong", False, (True, (), "bf16")),
        ("fp16", 10, "weak", False, (False, ("FP16",), "fp32")),
        ("bf16", 10, "weak", False, (False, ("BF16",), "fp32")),
        ("int8", 10, "weak", True, (False, ("INT8",), "fp32")),
        ("fp8", 10, "weak", True, (False, ("FP8",), "fp32")),
        ("int8", 11, "strong", True, (True, (), "fp32")),
        ("fp8", 11, "strong", True, (True, (), "fp32")),
    ],
)
def test_precision_plan(precision, major, typing, qdq, want):
    plan = options.precision_plan(precision, major, typing, qdq)
    assert (plan.strongly_typed, plan.builder_flags, plan.export_dtype) == want


@pytest.mark.parametrize(
    "args, message",
    [
        (("int8", 10, "strong", False), "int8 needs an explicitly quantized ONNX graph"),
        (("fp8", 11, "weak", False), "fp8 needs an explicitly quantized ONNX graph"),
        (("fp16", 11, "weak", False), "TensorRT 11 removed weakly typed networks"),
        (("fp64", 10, "strong", False), "supports dtype fp32, fp16, bf16, int8, fp8"),
    ],
)
def test_precision_plan_refusals(args, message):
    with pytest.raises(BackendError, match=message):
        options.precision_plan(*args)


def test_engine_options():
    eo = options.engine_options(BuildChoices(extra={"opt_level": "5", "workspace_mb": 512}))
    assert (eo.opt_level, eo.workspace_mb, eo.typing, eo.allow_host_code) == (
        5,
        512,
        "strong",
        False,
    )
    assert options.engine_options(BuildChoices(extra={"allow_host_code": "yes"})).allow_host_code
    for extra, message in [
        ({"opt_level": 6}, "opt_level must be 0-5"),
        ({"opt_level": "max"}, "opt_level must be an integer"),
        ({"workspace_mb": 0}, "workspace_mb must be a positive integer"),
        ({"typing": "loose"}, "typing must be strong or weak"),
        ({"allow_host_code": "maybe"}, "allow_host_code must be true or false"),
        ({"tactics": "all"}, "does not take ['tactics']"),
    ]:
        with pytest.raises(BackendError, match=message.replace("[", r"\[").replace("]", r"\]")):
            options.engine_options(BuildChoices(extra=extra))
