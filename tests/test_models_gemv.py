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
from _backend_util import found_in_a_fresh_process

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
    # 6 cases in fp32 and bf16, and the refusal of a prompt's rows.
    assert done.stdout.count("ok:") == 13, done.stdout


def test_the_tile_divides_the_work_for_one_and_several_rows():
    from artifactcache.models.gemv import int8_launch

    one = int8_launch(1, 4096, 4096)
    assert (one.block_n, one.block_k) == (4, 1024)
    assert int8_launch(1, 4096, 11008).block_n == 8  # a long k: fewer, longer programs
    # Several rows share the weight tile but each has an accumulator: narrower tiles.
    assert int8_launch(4, 4096, 4096).block_n == 1


def test_a_cpu_int8_model_never_imports_triton():
    """register_ops imports the op for CUDA layers only, and a CPU forward keeps the
    cast: building and running a CPU int8 model must not pay Triton's and Dynamo's
    imports (nor this module's)."""
    code = (
        "import sys, torch\n"
        "print('triton' in sys.modules)\n"  # torch itself did not import it
        "from artifactcache.models.quant import int8_linear, register_ops\n"
        "m = torch.nn.Sequential(int8_linear(torch.nn.Linear(32, 16)))\n"
        "register_ops(m)\n"
        "y = m(torch.randn(1, 1, 32))\n"
        "assert y.shape == (1, 1, 16)\n"
        "print('triton' in sys.modules, 'artifactcache.models.gemv' in sys.modules)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    before, *after = done.stdout.split()
    if before == "True":
        pytest.skip("this torch imports Triton itself")
    assert after == ["False", "False"]


def test_the_op_refuses_what_the_kernel_cannot_read_before_any_launch():
    """Checked on the host first, so a CPU tensor reaches no Triton launch here."""
    import torch

    from artifactcache.models import gemv
    from artifactcache.models.quant import quantize_int8

    weight, scales = quantize_int8(torch.randn(8, 64))
    x = torch.randn(1, 64)
    refused = {
        "no rows": (torch.randn(0, 64), weight, scales, None),
        "too many rows": (torch.randn(gemv.MAX_ROWS + 1, 64), weight, scales, None),
        "one-dimensional x": (torch.randn(64), weight, scales, None),
        "a strided weight": (x, torch.cat([weight, weight], 1)[:, ::2], scales, None),
        "a transposed weight": (torch.randn(1, 8), weight.T, scales, None),
        "a float weight": (x, weight.float(), scales, None),
        "another K": (torch.randn(1, 32), weight, scales, None),
        "scales of another N": (x, weight, scales[:4], None),
        "bias of another N": (x, weight, scales, torch.zeros(9)),
    }
    messages = {
        "no rows": "rows", "too many rows": "rows", "one-dimensional x": "rows",
        "a strided weight": "contiguous weight", "a transposed weight": "contiguous weight",
    }  # fmt: skip
    for case, args in refused.items():
        for call in (gemv.int8_gemv, lambda *a: gemv.launch_int8(*a, gemv.GemvLaunch(4, 64))):
            with pytest.raises(ValueError, match=messages.get(case, "weight-only GEMV")) as e:
                call(*args)
            assert "\n" not in str(e.value), case


def test_a_fresh_process_finds_the_kernel_by_module_and_name():
    """torch's saved compiled functions (the inductor warm path) record a user-defined
    Triton kernel as (module, name) and look it up with getattr in the loading process,
    where nothing has defined the kernel yet: the module's __getattr__ must."""
    from artifactcache.models import gemv

    gemv._define_kernels()
    assert found_in_a_fresh_process([gemv._int8_gemv]) == [("JITFunction", "_int8_gemv")]
    with pytest.raises(AttributeError):
        gemv.no_such_kernel  # noqa: B018 - the lookup itself is the test


def test_without_triton_a_kernel_lookup_is_an_attribute_error():
    """hasattr (and torch's own lookups) get False, not an ImportError."""
    code = (
        "import sys\n"
        "sys.modules['triton'] = None\n"  # Triton missing
        "from artifactcache.models import decode_attention, gemv\n"
        "print(hasattr(gemv, '_int8_gemv'), hasattr(decode_attention, '_partial'))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "False"]
