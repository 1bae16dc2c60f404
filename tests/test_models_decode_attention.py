"""The split-KV decode kernel against SDPA under the causal mask, in Triton's interpreter.

The interpreter runs the kernel's arithmetic on the CPU, masks and tiles included, so
every case is checked here (tests/_decode_attention_child.py lists them); its speed
is the benchmarks' (GPU only).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton", reason="the split-KV kernel is Triton's")

CHILD = Path(__file__).with_name("_decode_attention_child.py")


def test_the_kernel_matches_sdpa_in_every_case():
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run(
        [sys.executable, str(CHILD)], env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("ok:") == 10, done.stdout
