"""The int8 weight-only GEMV kernel (models/gemv.py) against the same product in float64,
in Triton's interpreter.

The interpreter runs the kernel's arithmetic on the CPU (the magic-number cast, the
masks, the per-row accumulators), so every case is checked here; its speed is
benchmarks/quant_gemv.py's (GPU only).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton", reason="the int8 GEMV kernel is Triton's")

REPO = Path(__file__).resolve().parents[1]
CHILD = Path(__file__).with_name("_gemv_child.py")


def test_the_kernel_matches_the_int8_product_in_every_case():
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": path}
    done = subprocess.run(
        [sys.executable, str(CHILD)], env=env, cwd=REPO, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    # 5 cases in fp32 and bf16, and the refusal of a prompt's rows.
    assert done.stdout.count("ok:") == 11, done.stdout


def test_the_tile_divides_the_work_for_one_and_several_rows():
    from artifactcache.models.gemv import int8_launch

    one = int8_launch(1, 4096, 4096)
    assert (one.block_n, one.block_k) == (4, 1024)
    assert int8_launch(1, 4096, 11008).block_n == 8  # a long k: fewer, longer programs
    # Several rows share the weight tile but each has an accumulator: narrower tiles.
    assert int8_launch(4, 4096, 4096).block_n == 1


def test_a_cpu_int8_model_never_imports_triton():
    """register_ops imports the op for CUDA layers only: a CPU int8 model keeps the
    cast, and building one must not pay Triton's and Dynamo's imports."""
    code = (
        "import sys, torch\n"
        "from artifactcache.models.quant import int8_linear, register_ops\n"
        "m = torch.nn.Sequential(int8_linear(torch.nn.Linear(32, 16)))\n"
        "register_ops(m)\n"
        "y = m(torch.randn(1, 1, 32))\n"
        "assert y.shape == (1, 1, 16)\n"
        "print('gemv' in sys.modules.get('artifactcache.models', object()).__dict__,"
        " 'artifactcache.models.gemv' in sys.modules)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "False"]


def test_a_fresh_process_finds_the_kernel_by_module_and_name():
    """torch's saved compiled functions (the inductor warm path) record a user-defined
    Triton kernel as (module, name) and look it up with getattr in the loading process,
    where nothing has defined the kernel yet: the module's __getattr__ must."""
    types = pytest.importorskip("torch._dynamo.aot_compile_types")
    if not hasattr(types, "_deserialize_triton_kernel"):
        pytest.skip("this torch saves no Triton kernel by module and name")
    from artifactcache.models import gemv

    gemv._define_kernels()
    module, name = types._serialize_triton_kernel(gemv._int8_gemv)
    code = (
        "import sys\n"
        "from torch._dynamo.aot_compile_types import _deserialize_triton_kernel\n"
        f"k = _deserialize_triton_kernel(({module!r}, {name!r}))\n"
        "print(type(k).__name__, k.fn.__name__)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["JITFunction", "_int8_gemv"]
    with pytest.raises(AttributeError):
        gemv.no_such_kernel  # noqa: B018 - the lookup itself is the test
