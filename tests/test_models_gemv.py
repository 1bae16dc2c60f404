"""acache's row GEMV (models/gemv.py) against the same product in float64, and tiny
models' decode through it against the plain model, in Triton's interpreter.

The interpreter runs the kernel's arithmetic on the CPU (the magic-number cast, the
prologues, the masks), so every case is checked here; its speed is
benchmarks/row_gemv.py's (GPU only).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from _backend_util import found_in_a_fresh_process, skip_if_interpreter_refused

pytest.importorskip("triton", reason="the row GEMV kernel is Triton's")

REPO = Path(__file__).resolve().parents[1]
CHILD = Path(__file__).with_name("_gemv_child.py")


def test_the_kernel_matches_the_product_in_every_case_and_models_decode_through_it():
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": path}
    done = subprocess.run(
        [sys.executable, str(CHILD)], env=env, cwd=REPO, capture_output=True, text=True,
        timeout=600,
    )  # fmt: skip
    if done.returncode:
        skip_if_interpreter_refused(done.stderr)
    assert done.returncode == 0, done.stdout + done.stderr
    # 29 cases in fp32 and bf16, two refusals, 9 tiny models.
    assert done.stdout.count("ok:") == 69, done.stdout


def test_cpu_models_and_building_never_import_triton():
    """register_ops imports the op for CUDA models only, a CPU forward keeps the plain
    modules, and building a model registers nothing (a warm aoti process hands the
    model's tensors to its library and must not pay Triton's and Dynamo's imports): an
    int8 layer and a row-GEMV llama, built and run on the CPU, leave both unimported."""
    code = (
        "import sys, torch\n"
        "print('triton' in sys.modules)\n"  # torch itself did not import it
        "from artifactcache.models import build_model\n"
        "from artifactcache.models.quant import int8_linear\n"
        "from artifactcache.models.rows import register_ops\n"
        "from artifactcache.recipes import load_recipe\n"
        "m = torch.nn.Sequential(int8_linear(torch.nn.Linear(32, 16)))\n"
        "register_ops(m)\n"
        "y = m(torch.randn(1, 1, 32))\n"
        "assert y.shape == (1, 1, 16)\n"
        "llama = build_model(load_recipe('tiny-llama'), fuse_projections=True, row_gemv=True,"
        " quant='int8wo')\n"
        "register_ops(llama)\n"
        "llama(torch.tensor([[1]]), torch.tensor([0]))\n"
        "print('triton' in sys.modules, 'torch._dynamo' in sys.modules,"
        " 'artifactcache.models.gemv' in sys.modules)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    before, *after = done.stdout.split()
    if before == "True":
        pytest.skip("this torch imports Triton itself")
    assert after == ["False", "False", "False"]


class _Traced(Exception):
    """Raised by the recording backend: the graph reached it, nothing is compiled."""


def test_the_two_part_call_traces_whole_and_exports():
    """phi-2's out-projection as its step calls it (fc1's part a split of the
    in-projection's row, passed as x_tail): Dynamo traces it whole, the op one node and
    no concatenation, and torch.export (aoti's way in) keeps the op on the split's view.
    The op is called directly: on the CPU row_linear takes the plain modules."""
    import torch

    from artifactcache.models.rows import register_gemv

    register_gemv()
    out = torch.nn.Linear(32 + 96, 24)

    def out_proj(y, row, skip):
        up = row.split([3 * 32, 96], dim=-1)[1]
        return torch.ops.acache.row_gemv(
            y.reshape(1, 32), out.weight, None, out.bias, None, 0.0, False,
            skip.reshape(-1), None, False, 32, up.reshape(1, 96),
        )  # fmt: skip

    y, skip, row = torch.randn(1, 1, 32), torch.randn(1, 1, 24), torch.randn(1, 1, 3 * 32 + 96)
    seen: list[str] = []

    def backend(gm, example_inputs):
        seen.append(str(gm.graph))
        raise _Traced

    with torch.no_grad(), pytest.raises(Exception, match="_Traced"):
        torch.compile(out_proj, fullgraph=True, backend=backend)(y, row, skip)
    assert len(seen) == 1 and "row_gemv" in seen[0] and "cat" not in seen[0], seen

    class Step(torch.nn.Module):
        def forward(self, y, row, skip):
            return out_proj(y, row, skip)

    with torch.no_grad():
        exported = torch.export.export(Step(), (y, row, skip)).run_decompositions()
    code = str(exported.graph)
    assert "row_gemv" in code and "aten.cat" not in code, code


def test_a_fresh_process_finds_the_kernel_by_module_and_name():
    """torch's saved compiled functions (the inductor warm path) record a user-defined
    Triton kernel as (module, name) and look it up with getattr in the loading process,
    where nothing has defined the kernel yet: the module's __getattr__ must."""
    from artifactcache.models import gemv

    gemv._define_kernels()
    assert found_in_a_fresh_process([gemv._row_gemv]) == [("JITFunction", "_row_gemv")]
    with pytest.raises(AttributeError):
        gemv.no_such_kernel  # noqa: B018 - the lookup itself is the test


def test_without_triton_a_kernel_lookup_is_an_attribute_error():
    """hasattr (and torch's own lookups) get False, not an ImportError."""
    code = (
        "import sys\n"
        "sys.modules['triton'] = None\n"  # Triton missing
        "from artifactcache.models import decode_attention, gemv\n"
        "print(hasattr(gemv, '_row_gemv'), hasattr(decode_attention, '_partial'))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "False"]


def test_on_cuda_the_kernel_matches_the_product_with_each_prologue():
    """The compiled kernel (not the interpreter) on seed-sized shapes, every variant: one
    that divides every tile, and a ragged one (K and N tails masked) with a bias; int8
    through the inline PTX cast; float and int8 with loads pipelined too; a skip's
    rounding, exactly."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("the row GEMV's compiled kernel runs on CUDA")
    from _gemv_reference import reference

    from artifactcache.models import gemv
    from artifactcache.models.quant import (
        INT4_GROUPS,
        dequantize_int4,
        quantize_int4,
        quantize_int8,
    )

    torch.manual_seed(0)
    shapes = ((3072, 3072, False), (4100, 11000, True), (4104, 11008, True), (17920, 2560, True))
    for n, k, with_bias in shapes:
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k**0.5
        forms = [(w, None, w), (*quantize_int8(w), w)]  # (weight, scales, dense)
        group = next((g for g in INT4_GROUPS if k % g == 0), None)
        if group:  # int4: checked against its dequantized weight
            nibbles, sz = quantize_int4(w, group)
            forms.append((nibbles, sz, dequantize_int4(nibbles, sz, torch.float32)))
        g = (1 + torch.rand(k, device="cuda")).to(torch.bfloat16)
        r = torch.randn(n, device="cuda", dtype=torch.bfloat16)
        bias = torch.randn(n, device="cuda", dtype=torch.bfloat16) if with_bias else None
        for weight, scales, dense in forms:
            int4 = weight.dtype == torch.uint8
            for norm, silu, residual in ((g, False, None), (None, True, r), (None, False, r)):
                x = torch.randn(1, 2 * k if silu else k, device="cuda", dtype=torch.bfloat16)
                args = (x, weight, scales, bias, norm, 1e-5, silu, residual)
                got = gemv.row_gemv(*args).double()
                dense_args = (x, dense, None, bias, norm, 1e-5, silu, residual)
                want = reference(*dense_args) if int4 else reference(*args)
                torch.testing.assert_close(got, want, rtol=2e-2, atol=5e-2)
                if not int4:  # three steps' loads in flight (Triton's pipeliner)
                    staged = gemv.launch_gemv(*args, cut=gemv.GemvLaunch(8, 512, 4, 3))
                    torch.testing.assert_close(staged.double(), want, rtol=2e-2, atol=5e-2)
            # phi-2's prologues: a LayerNorm with its bias (x far from 0: it must centre
            # it), GELU on all or part of x (x centred at 0)
            nb = torch.randn(k, device="cuda", dtype=torch.bfloat16)
            for kw in ({"norm_bias": nb, "layer_norm": True}, {"gelu_from": 0},
                       {"gelu_from": k // 5}):  # fmt: skip
                norm = g if kw.get("layer_norm") else None
                x = (3 if norm is not None else 0) + torch.randn(1, k, device="cuda")
                x = x.to(torch.bfloat16)
                args = (x, weight, scales, bias, norm, 1e-5, False, r)
                got = gemv.row_gemv(*args, **kw).double()
                dense_args = (x, dense, None, bias, norm, 1e-5, False, r)
                want = reference(*dense_args, **kw) if int4 else reference(*args, **kw)
                torch.testing.assert_close(got, want, rtol=2e-2, atol=5e-2)
    # Eager rounds the projection to bf16, then adds the skip: the product 1 + 3 * 2**-9
    # rounds to 1 + 2**-7, plus 2**-8 is a tie that rounds to 1 + 2**-6, where adding
    # before rounding gives 1 + 2**-7 (Triton's interpreter truncates to bf16 instead, so
    # this case is the GPU's).
    x = torch.ones(1, 2, device="cuda", dtype=torch.bfloat16)
    w = torch.tensor([[1.0, 3 * 2**-9]], device="cuda", dtype=torch.bfloat16)
    r = torch.tensor([2**-8], device="cuda", dtype=torch.bfloat16)
    got = gemv.row_gemv(x, w, None, None, None, 1e-5, False, r).item()
    assert got == 1 + 2**-6 == (torch.nn.functional.linear(x, w) + r).item(), got
    # Inductor passes a float (the LayerNorm's eps) to a user kernel as fp64: the kernel
    # must keep its loop in fp32 there too (phi-2's build once failed on it). A module that
    # calls row_linear with a LayerNorm, compiled as a build compiles the model.
    from torch._inductor.utils import run_and_get_code

    from artifactcache.models.rows import register_gemv, row_linear

    register_gemv()  # as a backend does before it traces (rows.register_ops)
    lin = torch.nn.Linear(2560, 1024, bias=True, device="cuda", dtype=torch.bfloat16)
    norm = torch.nn.LayerNorm(2560, eps=1e-5, device="cuda", dtype=torch.bfloat16)
    x = (3 + torch.randn(1, 1, 2560, device="cuda")).to(torch.bfloat16)
    # phi-2's in-projection: GELU on the outputs from fc1's first on (here 512)
    compiled = torch.compile(
        lambda x: row_linear(lin, x, norm=norm, gelu_out_from=512), fullgraph=True
    )
    with torch.no_grad():  # as a build traces (the op has no backward)
        got, code = run_and_get_code(compiled, x)
        product = lin(norm(x))
        gelu = torch.nn.functional.gelu(product[..., 512:], approximate="tanh")
        want = torch.cat([product[..., :512], gelu], dim=-1).double()
    assert "_row_gemv" in "".join(code)  # the kernel, not the plain modules
    torch.testing.assert_close(got.double(), want, rtol=2e-2, atol=5e-2)
    # phi-2's out-projection: [attention | GELU(fc1)] read from two tensors, fc1 a view
    # into the in-projection's row (as its split gives it), compiled: no concatenation.
    out = torch.nn.Linear(2560 + 10240, 2560, bias=True, device="cuda", dtype=torch.bfloat16)
    row = torch.randn(1, 1, 3 * 2560 + 10240, device="cuda", dtype=torch.bfloat16)
    y, skip = torch.randn(2, 1, 1, 2560, device="cuda", dtype=torch.bfloat16)

    def out_proj(y, row, skip):
        up = row.split([3 * 2560, 10240], dim=-1)[1]
        return row_linear(out, y, residual=skip, x_tail=up)

    compiled = torch.compile(out_proj, fullgraph=True)
    with torch.no_grad():
        got, code = run_and_get_code(compiled, y, row, skip)
        want = (skip + out(torch.cat([y, row[..., 3 * 2560 :]], dim=-1))).double()
    source = "".join(code)
    assert "_row_gemv" in source and "fused_cat" not in source and "aten.cat" not in source
    torch.testing.assert_close(got.double(), want, rtol=2e-2, atol=5e-2)


def _run_ptx(asm: str, operands: dict[str, int]) -> dict[str, int]:
    """The xor.b32 and prmt.b32 (default mode) statements of ``asm``, run on 32-bit
    values as the PTX ISA defines them: prmt's selector nibble j picks result byte j from
    the eight bytes of {b, a} (its low three bits: 0-3 a's, 4-7 b's), or with the
    nibble's top bit set, that byte's sign bit replicated (0x00 or 0xFF)."""
    regs = dict(operands)

    def value(token: str) -> int:
        token = token.strip()
        return regs[token] if token in regs else int(token, 0)

    for statement in asm.strip("{} ").split(";"):
        op, _, rest = statement.strip().partition(" ")
        if not op or op.startswith(".reg"):
            continue
        dest, *srcs = [t.strip() for t in rest.split(",")]
        if op == "xor.b32":
            regs[dest] = value(srcs[0]) ^ value(srcs[1])
        elif op == "prmt.b32":
            pool = value(srcs[0]) | value(srcs[1]) << 32
            sel = value(srcs[2])
            out = 0
            for j in range(4):
                nibble = sel >> 4 * j & 0xF
                byte = pool >> 8 * (nibble & 7) & 0xFF
                if nibble & 8:  # sign replicate
                    byte = 0xFF if byte & 0x80 else 0
                out |= byte << 8 * j
            regs[dest] = out
        else:
            raise AssertionError(f"the test does not model {op}")
    return regs


def test_the_int8_ptx_cast_gives_each_byte_as_the_magic_float():
    """The inline PTX the GPU runs instead of the interpreter's byte-at-a-time cast: for
    bytes holding q = -128..127, register $i (element i of the four packed in $4, byte i)
    must be the fp32 bits of 2**23 + 128 + q. A wrong selector or mask fails here, not on
    a GPU."""
    import struct

    from artifactcache.models.gemv import INT8_WIDEN_PTX

    for start in range(-128, 128, 4):
        qs = [(start + j * 37) % 256 - 128 for j in range(4)]  # mixed signs, every value
        word = sum((q & 0xFF) << 8 * i for i, q in enumerate(qs))
        regs = _run_ptx(INT8_WIDEN_PTX, {"$4": word})
        floats = [struct.unpack("<f", struct.pack("<I", regs[f"${i}"]))[0] for i in range(4)]
        assert [f - 8388736.0 for f in floats] == qs, (hex(word), floats)
