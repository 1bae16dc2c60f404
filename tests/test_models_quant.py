"""Weight-only int8 and int4 (models/quant.py): the rounding bound, which layers, the old
weights freed, a loose sanity bound against the float model, and the compiled backends
held to eager on the quantized model. int4's CUDA kernel (tinygemm) runs on a GPU only:
here its CPU twin stands in as the reference of the scheme, and the layer's own
dequantization (the plain nibbles, what CPU and CUDA prompt passes compute with) is
held to it.

How far int8wo is from the float model on a real checkpoint is not asserted here:
benchmarks/quant_agreement.py prints it (max relative logits error, first differing
greedy token).
"""

from __future__ import annotations

import gc
import weakref

import pytest
import torch
from _backend_util import private_dir, rel_err, skip_if_interpreter_refused
from torch import nn

from artifactcache import api
from artifactcache.models import build_model
from artifactcache.models.quant import (
    QUANTIZERS,
    Int4WeightOnlyLinear,
    Int8WeightOnlyLinear,
    check_int4_device,
    int4_layout,
    int4_linear,
    pack_nibbles,
    quantize,
    quantize_int4,
    quantize_int8,
    unpack_nibbles,
)
from artifactcache.recipes import load_recipe


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_each_row_is_rounded_against_its_own_scale(dtype: torch.dtype):
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(300, 70, generator=gen) * torch.logspace(-3, 2, 300)[:, None]
    w[5] = 0.0  # an all-zero row must not divide by zero
    w = w.to(dtype)
    q, s = quantize_int8(w)
    assert q.dtype == torch.int8 and s.dtype == dtype and s.shape == (300,)
    assert q.abs().max() <= 127 and torch.all(q[5] == 0)
    assert torch.all(q.abs().amax(dim=1)[torch.arange(300) != 5] >= 126)  # the range is used
    err = (q.float() * s.float()[:, None] - w.float()).abs()
    assert torch.all(err <= s.float()[:, None] / 2 * (1 + 1e-6))


def test_every_block_linear_is_quantized_and_the_lm_head_is_not():
    rec = load_recipe("tiny-llama")
    model = build_model(rec)
    old = [m.weight for m in model.model.modules() if isinstance(m, nn.Linear)]
    refs = [weakref.ref(t) for t in old]
    del old
    assert quantize(model, "int8wo") == 7 * rec.model.n_layers  # q, k, v, o, gate, up, down
    gc.collect()
    assert all(r() is None for r in refs), "a float weight is still alive"
    assert not any(isinstance(m, nn.Linear) for m in model.model.modules())
    assert type(model.lm_head) is nn.Linear and model.lm_head.weight.dtype == torch.float32
    q = model.model.layers[0].self_attn.q_proj
    assert isinstance(q, Int8WeightOnlyLinear) and q.weight.dtype == torch.int8


@pytest.mark.parametrize(("dtype", "fused"), [("fp32", False), ("bf16", True)])
def test_int8wo_stays_close_to_the_float_model(dtype: str, fused: bool):
    """A loose sanity bound (tiny random models sit near 1-3%): a scale applied to the
    wrong rows, or a transposed weight, is off by far more."""
    rec = load_recipe("tiny-qwen2")  # biases on q/k/v: added after the scales
    ids = [(31 * i + 7) % rec.model.vocab_size for i in range(16)]
    pos = torch.arange(len(ids))
    with torch.no_grad():
        want = build_model(rec, dtype=dtype)(torch.tensor([ids]), pos)[0]
        model = build_model(rec, dtype=dtype, fuse_projections=fused, quant="int8wo")
        got = model(torch.tensor([ids]), pos)[0]
    assert 0 < rel_err(got, want) < 0.1


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["inductor", "aoti"])
@pytest.mark.parametrize("quant", ["int8wo", "int4wo"])
def test_compiled_quant_matches_eager_quant(backend: str, quant: str, tmp_path_factory):
    """Quantized constants reach the compiled graphs (aoti: as user-managed constants)
    and compute what eager computes on the same quantized, fused model (int4wo on CPU:
    the dequantization from nibbles, compiled)."""
    root = private_dir(tmp_path_factory, f"{quant}-{backend}")
    opts = dict(quant=quant, extra={"fuse_projections": 1}, cache_dir=root)
    rec = load_recipe("tiny-llama")
    ids = [(31 * i + 7) % rec.model.vocab_size for i in range(16)]
    prompt = list(rec.bench.prompt_ids)
    eager = api.load("tiny-llama", "eager", **opts)
    runner = api.load("tiny-llama", backend, **opts)
    assert rel_err(runner.logits(ids), eager.logits(ids)) <= 1e-4
    assert runner.generate(prompt, 8) == eager.generate(prompt, 8)


def test_int4_groups_round_against_their_own_scale_and_zero():
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(24, 256, generator=gen) * torch.logspace(-3, 1, 24)[:, None]
    w[3, :128] = 0.5  # a constant group: scale 0 must not divide by zero
    nibbles, sz = quantize_int4(w, 128)
    assert nibbles.dtype == torch.uint8 and nibbles.shape == (24, 128) and sz.shape == (2, 24, 2)
    q = unpack_nibbles(nibbles)
    assert q.max() <= 15
    scale, zero = sz[..., 0].t(), sz[..., 1].t()  # [24, 2]
    deq = (q.reshape(24, 2, 128).float() - 8) * scale[..., None] + zero[..., None]
    err = (deq.reshape(24, 256) - w).abs().reshape(24, 2, 128)
    assert torch.all(err <= scale[..., None] / 2 * (1 + 1e-5) + 1e-7)
    assert torch.all(deq.reshape(24, 256)[3, :128] == 0.5)


def test_nibbles_round_trip():
    q = torch.randint(0, 16, (8, 64), dtype=torch.int32)
    packed = pack_nibbles(q)
    assert packed.shape == (8, 32) and packed.dtype == torch.uint8
    assert torch.equal(unpack_nibbles(packed).to(torch.int32), q)


def test_int4_layout_fits_the_width_or_refuses():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert int4_layout(4096, 4096, cuda) == (128, 8)
    assert int4_layout(11008, 4096, cuda) == (128, 8)  # 11008 = 86 x 128
    assert int4_layout(64, 64, cpu) == (64, 0)  # no tinygemm layout off CUDA
    assert int4_layout(96, 64, cuda) == (32, 2)
    assert int4_layout(100, 64, cpu) is None  # no group divides it
    assert int4_layout(64, 60, cuda) is None  # tinygemm tiles N by 8


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_int4_dequantization_is_tinygemms(dtype: torch.dtype):
    """The layer's own dequantization (nibbles, ``(q - 8) * scale + zero`` from
    scales_zeros [groups, out, 2]) computes what PyTorch's int4 kernel computes from the
    same q and scales_zeros: its CPU twin here, the CUDA one on a GPU
    (test_int4wo_decode_rows_run_tinygemm_on_cuda)."""
    torch.manual_seed(0)
    lin = nn.Linear(256, 48, bias=True).to(dtype)
    layer = int4_linear(lin)
    assert isinstance(layer, Int4WeightOnlyLinear) and layer.packed is None  # CPU
    nibbles, sz = quantize_int4(lin.weight, 128)
    q = unpack_nibbles(nibbles).to(torch.int32)
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1)
    x = torch.randn(3, 5, 256).to(dtype)
    kernel = torch.ops.aten._weight_int4pack_mm_for_cpu(x.reshape(15, 256), packed, 128, sz)
    want = kernel.reshape(3, 5, 48).float() + lin.bias.float()
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    assert rel_err(layer(x).float(), want) <= tol
    assert rel_err(layer(x[:, :1]).float(), want[:, :1]) <= tol
    w = layer.dequantized(torch.float32)
    assert (w - lin.weight.float()).abs().max() <= sz[..., 0].float().max() / 2 + 1e-2


@pytest.mark.skipif(not torch.cuda.is_available(), reason="tinygemm's CUDA kernel needs a GPU")
def test_int4wo_decode_rows_run_tinygemm_on_cuda():
    """On CUDA a decode row (one token, few sequences) runs tinygemm on its packed layout
    and a prompt pass the dequantized GEMM: the two agree."""
    torch.manual_seed(0)
    lin = nn.Linear(4096, 1024, bias=False, device="cuda", dtype=torch.bfloat16)
    layer = int4_linear(lin)
    assert layer is not None and layer.packed is not None
    x = torch.randn(2, 16, 4096, device="cuda", dtype=torch.bfloat16)
    prompt = layer(x)  # dequantized GEMM
    for t in range(0, 16, 5):
        decode = layer(x[:, t : t + 1].contiguous())  # tinygemm
        assert rel_err(decode.float(), prompt[:, t : t + 1].float()) <= 2e-2


def test_int4wo_quantizes_every_block_linear_that_fits_and_stays_close():
    rec = load_recipe("tiny-qwen2")  # biases on q/k/v
    ids = [(31 * i + 7) % rec.model.vocab_size for i in range(16)]
    pos = torch.arange(len(ids))
    with torch.no_grad():
        want = build_model(rec)(torch.tensor([ids]), pos)[0]
        model = build_model(rec, quant="int4wo")
        got = model(torch.tensor([ids]), pos)[0]
    layers = [m for m in model.model.modules() if isinstance(m, Int4WeightOnlyLinear)]
    assert len(layers) == 4 * rec.model.n_layers  # q, k, v, o
    # intermediate_size 172: gate/up's 172 rows are not a multiple of 8, and no group
    # divides down's 172 inputs, so the MLP keeps its float weights.
    kept = {
        n.rsplit(".", 1)[-1] for n, m in model.model.named_modules() if isinstance(m, nn.Linear)
    }
    assert kept == {"gate_proj", "up_proj", "down_proj"}
    # 16 levels a group on random weights: ~0.37 here (int8: 0.01-0.03); a wrong scale
    # or a transposed weight is off by more than 1.
    assert 0 < rel_err(got, want) < 0.6


def test_int4wo_sizes_half_a_byte_a_weight_on_meta():
    """The roofline's bytes (sizing.weight_bytes) count what a decode step reads: half a
    byte a weight plus a bf16 scale and zero per 128 (llama-7b: every layer fits)."""
    from artifactcache import sizing

    rec = load_recipe("llama-7b")
    full, _ = sizing.weight_bytes(rec, "bf16")
    int4, _ = sizing.weight_bytes(rec, "bf16", "int4wo")
    head = rec.model.vocab_size * rec.model.dim * 2
    per_weight = (0.5 + 2 * 2 / 128) / 2  # of a bf16 weight's two bytes
    assert (int4 - head) / (full - head) == pytest.approx(per_weight, rel=1e-3)


def test_every_quant_mode_the_cli_takes_has_a_quantizer():
    from artifactcache.backends.shared.model_options import QUANT_MODES

    assert tuple(QUANTIZERS) == QUANT_MODES


def test_int4wo_on_a_gpu_older_than_sm80_is_one_line(monkeypatch):
    """tinygemm needs compute capability 8.0; the GPU is faked (its name, its capability)."""
    from artifactcache.errors import BackendError

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 5))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Tesla T4")
    with pytest.raises(BackendError) as err:
        check_int4_device(torch.device("cuda"))
    assert "\n" not in str(err.value) and "Tesla T4" in str(err.value)
    assert "8.0" in str(err.value) and "--quant int8wo" in str(err.value)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    check_int4_device(torch.device("cuda"))  # an H100/H200 passes
    check_int4_device(torch.device("cpu"))  # no GPU asked: nothing to check


# A CPU tensor that says it is on CUDA: Int8WeightOnlyLinear takes its GEMV branch, and
# Triton's interpreter (TRITON_INTERPRET=1) runs the kernel on the CPU.
_MOVED_LAYER = """
import sys, torch
from artifactcache.models import quant, rows

class OnCuda(torch.Tensor):
    @property
    def is_cuda(self):
        return True

lin = quant.int8_linear(torch.nn.Linear(64, 16))  # quantized on the CPU: nothing registered
x = torch.randn(1, 1, 64)
want = lin(x)
print(rows._gemv_registered, "artifactcache.models.gemv" in sys.modules)
got = lin(x.as_subclass(OnCuda)).as_subclass(torch.Tensor)
torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
rows.register_gemv()  # idempotent
rows.register_ops(torch.nn.Sequential(lin))
print(rows._gemv_registered, hasattr(torch.ops.acache, "row_gemv"))
"""


def test_an_int8_layer_moved_to_cuda_registers_its_op_on_first_call():
    """A layer quantized on the CPU (quantize() registered nothing) then moved to CUDA:
    its first decode row registers acache::row_gemv rather than failing to find it."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    pytest.importorskip("triton", reason="the int8 GEMV kernel is Triton's")
    repo = Path(__file__).resolve().parents[1]
    path = os.pathsep.join(p for p in (str(repo), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": path}
    done = subprocess.run(
        [sys.executable, "-c", _MOVED_LAYER], env=env, cwd=repo, capture_output=True,
        text=True, timeout=300,
    )  # fmt: skip
    if done.returncode:
        skip_if_interpreter_refused(done.stderr)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "False", "True", "True"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the int8 GEMV runs on CUDA")
def test_an_int8_layer_moved_to_cuda_decodes_eager_and_compiled():
    """Compiled before any eager call, the op is not registered (Dynamo cannot register
    it mid-trace): the layer keeps the cast. After an eager call registered it, a new
    compile runs the op. Both agree with the cast."""
    from artifactcache.models import quant, rows

    torch.manual_seed(0)
    layer = quant.int8_linear(nn.Linear(256, 64)).to("cuda")
    x = torch.randn(1, 1, 256, device="cuda")
    want = torch.nn.functional.linear(x, layer.weight.float()) * layer.scales + layer.bias
    graphs: list[str] = []

    def backend(gm, example_inputs):
        graphs.append(str(gm.graph))
        return gm

    registered = rows._gemv_registered
    got = torch.compile(layer, backend=backend, fullgraph=True)(x)
    assert rel_err(got, want) <= 1e-5
    assert ("row_gemv" in graphs[-1]) == registered
    assert rel_err(layer(x), want) <= 1e-5  # eager: registers the op
    assert rows._gemv_registered
    torch._dynamo.reset()
    got = torch.compile(layer, backend=backend, fullgraph=True)(x)
    assert rel_err(got, want) <= 1e-5 and "row_gemv" in graphs[-1]
