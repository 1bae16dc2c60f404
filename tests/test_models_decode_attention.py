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
from typing import Any

import pytest
from _backend_util import found_in_a_fresh_process, skip_if_interpreter_refused

triton = pytest.importorskip("triton", reason="the split-KV kernel is Triton's")

# Triton 3.6's interpreter turns a loop bound loaded from memory into a Python int with
# int() of a one-element array, which NumPy 2 refuses; 3.8 and later take it. The
# compiled kernel is not affected (the sm_90 compile test runs on every version).
interprets_loaded_bounds = pytest.mark.skipif(
    tuple(int(x) for x in triton.__version__.split(".")[:2]) < (3, 8),
    reason=f"Triton {triton.__version__}'s interpreter cannot take a loop bound loaded "
    "from memory (the kernel's tile loop); 3.8 or later runs these cases",
)

REPO = Path(__file__).resolve().parents[1]
CHILD = Path(__file__).with_name("_decode_attention_child.py")
MODEL_CHILD = Path(__file__).with_name("_split_kv_model_child.py")
TINY = ("tiny-llama", "tiny-mistral", "tiny-phi-2", "tiny-qwen3", "tiny-phi-3")


def _child_env() -> dict[str, str]:
    """The interpreter on, and this checkout's artifactcache first: a child started as
    ``python tests/x.py`` has tests/ on its path, not the repository."""
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": path}


@interprets_loaded_bounds
def test_the_kernel_matches_sdpa_in_every_case():
    env = _child_env()
    done = subprocess.run(
        [sys.executable, str(CHILD)],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if done.returncode:
        skip_if_interpreter_refused(done.stderr)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("ok:") == 36, done.stdout


@interprets_loaded_bounds
def test_a_split_kv_model_decodes_as_the_bucketed_sdpa_one():
    """Every family, a batch of three prompts of different lengths (tiny-mistral's
    window included): the same greedy tokens, and one decode step's logits within
    1e-4, from the whole static cache as from the length buckets."""
    env = _child_env()
    done = subprocess.run(
        [sys.executable, str(MODEL_CHILD), *TINY],
        env=env, cwd=REPO, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    if done.returncode:
        skip_if_interpreter_refused(done.stderr)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("ok:") == len(TINY), done.stdout


# (rows, kv heads, query heads a kv head, head_dim, slots): llama-7b at 4096 and at
# 256, its batch 32, llama-3's GQA, phi-2, phi-3 at 32k, and a cache of 2 slots (a split
# of 16, the fewest positions tl.dot takes); each with the launch the op chooses for it.
SM90_SHAPES = [(1, 32, 1, 128, 4096), (1, 32, 1, 128, 256), (32, 32, 1, 128, 256),
               (1, 8, 4, 128, 4096), (1, 32, 1, 80, 2048), (1, 32, 1, 96, 32768),
               (1, 4, 1, 64, 2)]  # fmt: skip
H100_SHARED = 232448  # bytes a program may use (shared_memory_per_block_optin)
CONSUMER_SHARED = 101376  # sm_86/89/120


def _partial_pointers(dtype: str) -> dict[str, str]:
    """The partial kernel's pointer arguments as Triton types them, for a ``dtype`` model."""
    return {"Q": f"*{dtype}", "K": f"*{dtype}", "V": f"*{dtype}", "LO": "*i64", "POS": "*i64",
            "M_OUT": "*fp32", "L_OUT": "*fp32", "ACC_OUT": "*fp32", "OUT": f"*{dtype}",
            "K_NEW": f"*{dtype}", "V_NEW": f"*{dtype}", "COS": "*fp32", "SIN": "*fp32",
            "PF": f"*{dtype}"}  # fmt: skip


def _compiled_for_sm90(fn: Any, pointers: dict[str, str], consts: dict[str, Any], warps: int):
    """``fn`` compiled by Triton to an sm_90 cubin (no GPU needed), its integers i32 as
    Triton passes them at run time, pointers and strides marked 16-divisible as Triton
    marks them, so a loop compiles with its asynchronous copies, as it runs. A skip where
    this Triton's ASTSource takes other arguments (its internal API moves between
    releases)."""
    from triton import compile as triton_compile
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    names = fn.arg_names
    sig = {n: pointers.get(n, "constexpr" if n in consts else "i32") for n in names}
    aligned = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names)
               if n in pointers or n.startswith("stride_")}  # fmt: skip
    try:
        src = ASTSource(fn=fn, signature=sig, attrs=aligned,
                        constexprs={(names.index(k),): v for k, v in consts.items()})  # fmt: skip
    except (TypeError, AttributeError) as e:
        pytest.skip(f"this Triton's ASTSource takes other arguments ({e})")
    return triton_compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps})


@pytest.mark.parametrize("rope", [False, True], ids=["plain", "rope"])
@pytest.mark.parametrize(("rows", "kv_heads", "rep", "head_dim", "slots"), SM90_SHAPES)
@pytest.mark.parametrize(("dtype", "limit"), [("bf16", H100_SHARED), ("fp32", H100_SHARED),
                                              ("fp32", CONSUMER_SHARED)])  # fmt: skip
def test_the_kernels_compile_for_an_h100_class_gpu(
    rows: int, kv_heads: int, rep: int, head_dim: int, slots: int, dtype: str, limit: int,
    rope: bool,
):  # fmt: skip
    """Triton's compiler (to a cubin, no GPU needed) checks what the interpreter does not:
    that every value keeps one type, the tensor-core products of bf16 tiles, and the
    shared memory of the pipelined loop, against the GPU's limit and staged_bytes'
    estimate. Pointers and strides are marked 16-divisible, as Triton marks them at run
    time, so the loop compiles with its asynchronous copies, as it runs."""

    from artifactcache.models import decode_attention as da

    partial, combine = da._kernels()
    d_p2 = da._next_pow2(head_dim)
    elem = 4 if dtype == "fp32" else 2
    qb = da.q_rows(rep)
    cut = da.fit_shared_memory(da.launch_config(rows, kv_heads, slots), elem, d_p2, limit, qb)
    rot = (32 if head_dim == 80 else head_dim) if rope else None  # phi-2 rotates 32 of 80
    partial_consts, combine_consts = da.kernel_constants(
        rep, head_dim, slots, cut, dtype == "fp32", rot=rot
    )
    kernels = [
        (partial, _partial_pointers(dtype), partial_consts, cut.num_warps),
        (combine, {"OUT": f"*{dtype}", "M_IN": "*fp32", "L_IN": "*fp32", "ACC_IN": "*fp32",
                   "LO": "*i64", "POS": "*i64"}, combine_consts, 4),
    ]  # fmt: skip
    shared = []
    for fn, pointers, consts, num_warps in kernels:
        compiled = _compiled_for_sm90(fn, pointers, consts, num_warps)
        assert compiled.asm["cubin"]
        shared.append(compiled.metadata.shared)
    assert shared[0] <= da.staged_bytes(cut, elem, d_p2, qb) <= limit, (cut, shared)


@pytest.mark.parametrize("rope", [False, True], ids=["plain", "rope"])
def test_the_prefetch_compiles_to_one_bulk_prefetch_a_thread(rope: bool):
    """The partial kernel with PREFETCH 1 for an sm_90 GPU (phi-2's heads, bf16): the
    inline PTX assembles (ptxas runs), each thread holds one predicated bulk prefetch
    (the pure asm kept alive by the never-taken store), and the kernel's shared memory
    is what it is without it."""
    from artifactcache.models import decode_attention as da

    partial, _ = da._kernels()
    cut = da.launch_config(1, 32, 256)
    compiled = {}
    for mode in (0, 1):
        consts, _ = da.kernel_constants(1, 80, 256, cut, False, rot=32 if rope else None,
                                        prefetch=mode)  # fmt: skip
        compiled[mode] = _compiled_for_sm90(partial, _partial_pointers("bf16"), consts,
                                            cut.num_warps)  # fmt: skip
    ptx = compiled[1].asm["ptx"]
    assert ptx.count("@p cp.async.bulk.prefetch.L2.global [%rd") == 1, ptx[-2000:]
    assert "cp.async.bulk.prefetch" not in compiled[0].asm["ptx"]
    assert compiled[1].metadata.shared == compiled[0].metadata.shared


def test_torch_finds_the_prefetched_weight_never_written(monkeypatch):
    """torch's analysis of a user kernel (what Inductor and aoti run before they lower
    the op) lists the tensors the kernel writes, and the compiled step copies each of
    them first. The prefetch's pure inline PTX and its never-taken store to M_OUT (the
    op's scratch or its partial sums) must leave the weight (PF) off that list, or every
    layer would copy its o_proj. On the CPU the analysis is given an sm_90 target."""
    import torch
    from triton.backends.compiler import GPUTarget

    tkw = pytest.importorskip("torch._higher_order_ops.triton_kernel_wrap")
    from artifactcache.models import decode_attention as da

    class Sm90:
        def get_current_target(self):
            return GPUTarget("cuda", 90, 32)

    if not torch.cuda.is_available():
        if not hasattr(triton.runtime.driver, "_active"):
            pytest.skip("this Triton's driver cannot be given a target")
        monkeypatch.setattr(triton.runtime.driver, "_active", Sm90())
    partial, _ = da._kernels()
    cut = da.launch_config(1, 32, 256)

    def bf16(*shape):
        return torch.empty(*shape, dtype=torch.bfloat16)

    tensors = dict(Q=bf16(1, 32, 1, 80), K=bf16(1, 32, 256, 80), V=bf16(1, 32, 256, 80),
                   LO=torch.zeros(1, dtype=torch.int64), POS=torch.zeros(1, dtype=torch.int64),
                   M_OUT=torch.empty(1), L_OUT=torch.empty(1), ACC_OUT=torch.empty(1),
                   OUT=bf16(1, 32, 1, 80), K_NEW=bf16(1, 32, 1, 80), V_NEW=bf16(1, 32, 1, 80),
                   COS=torch.empty(1, 32), SIN=torch.empty(1, 32), PF=bf16(64, 4096))  # fmt: skip
    ints = {n: 80 for n in partial.arg_names if n.startswith("stride_")}
    ints.update(n_kv_heads=32, n_heads=32, n_pairs=32, pf_chunks=128)
    written = {}
    for mode in (0, 1):
        consts, _ = da.kernel_constants(1, 80, 256, cut, False, rot=32, prefetch=mode)
        found = tkw.identify_accessed_tensors(partial, {**tensors, **ints, **consts}, {})
        written[mode] = {d.name for d in found.read_writes.writes}
    assert written[0] == {"K", "V", "OUT"}, written  # the rope op's cache writes, the output
    assert written[1] == written[0] | {"M_OUT"}, written


def test_a_short_cache_is_one_split_and_needs_no_combine():
    """Up to ONE_SPLIT_SLOTS positions one program a (row, kv head) reads the whole cache
    and writes the output (FINAL); a longer cache is cut by the rows' count."""
    from artifactcache.models import decode_attention as da

    for slots, split in ((8, 16), (64, 64), (100, 128), (da.ONE_SPLIT_SLOTS, da.ONE_SPLIT_SLOTS)):
        cut = da.launch_config(1, 32, slots)
        partial, _ = da.kernel_constants(1, 80, slots, cut, fp32=False)
        assert (cut.split, partial["N_SPLITS"], partial["FINAL"]) == (split, 1, True)
    longer = da.ONE_SPLIT_SLOTS + 1
    for rows, split in ((1, 128), (8, 256), (32, 512)):
        cut = da.launch_config(rows, 32, longer)
        partial, _ = da.kernel_constants(1, 80, longer, cut, fp32=False)
        assert cut.split == split
        assert partial["FINAL"] == (split >= longer)


def test_fit_shared_memory_drops_stages_then_tiles():
    from artifactcache.models.decode_attention import Launch, fit_shared_memory, staged_bytes

    three = Launch(split=128, block_n=64, stages=3)
    assert fit_shared_memory(three, 2, 128, H100_SHARED) == three  # bf16 fits as measured
    fp32 = fit_shared_memory(three, 4, 128, CONSUMER_SHARED)
    assert fp32 == Launch(split=128, block_n=64, stages=2)
    assert staged_bytes(fp32, 4, 128) <= CONSUMER_SHARED < staged_bytes(three, 4, 128)
    tiny = fit_shared_memory(three, 4, 128, 48 * 1024)
    assert tiny.stages == 1 and tiny.block_n == 32


class _Traced(Exception):
    """Raised by the recording backend: the graph reached it, nothing is compiled."""


@pytest.mark.parametrize("rope", [False, True], ids=["plain", "rope"])
def test_dynamo_traces_a_split_kv_model_whole(rope: bool):
    """inductor's build and warm load run torch.compile(fullgraph=True) over the model;
    the op must be one node of that graph, not something Dynamo refuses to trace."""
    import torch

    from artifactcache.backends.inductor.backend import register_model_ops
    from artifactcache.backends.shared.steps import example_inputs
    from artifactcache.models import build_model
    from artifactcache.recipes import load_recipe

    recipe = load_recipe("tiny-llama")
    model = build_model(recipe, split_kv_decode=True, split_kv_rope=rope)
    register_model_ops(model)
    seen: list[str] = []

    def backend(gm, example_inputs):
        seen.append(str(gm.graph))
        raise _Traced

    compiled = torch.compile(model, fullgraph=True, dynamic=False, backend=backend)
    inputs = example_inputs(recipe, torch.device("cpu"), "decode", kv_buckets=False)
    with torch.no_grad(), pytest.raises(Exception, match="_Traced") as caught:
        compiled(*inputs)  # Dynamo wraps the backend's exception
    assert seen, caught.value  # the whole graph reached the backend
    assert ("decode_attention_rope" in seen[0]) is rope
    assert "decode_attention" in seen[0]


def test_an_export_keeps_the_rope_ops_cache_writes():
    """aoti exports the decode step and decomposes it: the kernel's writes must come out
    as the caches' buffer mutations (what AOTInductor writes back in place), one op a
    layer, with no index_put of torch's own write left beside it."""
    import torch

    from artifactcache.backends.inductor.backend import register_model_ops
    from artifactcache.backends.shared.steps import example_inputs
    from artifactcache.models import build_model
    from artifactcache.recipes import load_recipe

    recipe = load_recipe("tiny-llama")
    model = build_model(recipe, split_kv_decode=True, split_kv_rope=True)
    register_model_ops(model)
    inputs = example_inputs(recipe, torch.device("cpu"), "decode", kv_buckets=False)
    with torch.no_grad():
        ep = torch.export.export(model, tuple(inputs), strict=False).run_decompositions()
    caches = {
        f"model.layers.{i}.self_attn.kv_cache.{c}_cache"
        for i in range(recipe.model.n_layers)
        for c in "kv"
    }
    assert set(ep.graph_signature.buffers_to_mutate.values()) == caches
    targets = [str(n.target) for n in ep.graph.nodes if n.op == "call_function"]
    assert targets.count("auto_functionalized_v2") == recipe.model.n_layers, targets
    assert not any("index_put" in t or "index_copy" in t for t in targets), targets


def test_a_cache_without_a_contiguous_last_dim_is_refused():
    """The kernel steps through head_dim one element at a time."""
    import torch

    from artifactcache.models.decode_attention import decode_attention

    q = torch.zeros(1, 2, 1, 16)
    strided = torch.zeros(1, 2, 16, 32)[..., ::2]
    with pytest.raises(ValueError, match="last dimension is contiguous"):
        decode_attention(q, strided, strided, torch.zeros(1, dtype=torch.long), torch.tensor([3]))


def test_a_fresh_process_finds_the_kernels_by_module_and_name():
    """A saved compiled function (inductor's warm path, with split-KV on by default)
    records each user-defined kernel as (module, name) and the
    loading process looks it up with getattr before anything has defined it."""
    from artifactcache.models import decode_attention as da

    assert found_in_a_fresh_process(da._kernels()) == [
        ("JITFunction", "_partial"),
        ("JITFunction", "_combine"),
    ]


# (batch, heads, kv heads, head_dim, rotated dims, slots, position): llama-7b, phi-3-mini
# and phi-2 at the seed's context, llama-3's GQA past one split.
ROPE_GPU_CASES = [(1, 32, 32, 128, 128, 256, 200), (1, 32, 32, 96, 96, 256, 5),
                  (1, 32, 32, 80, 32, 256, 128), (2, 32, 8, 128, 128, 4096, 1000)]  # fmt: skip


def _rope_case(case, device):
    import torch

    B, H, Hkv, D, rot, S, p = case
    gen = torch.Generator(device="cpu").manual_seed(4)

    def rand(*shape):
        return torch.randn(*shape, generator=gen).to(device=device, dtype=torch.bfloat16)

    qkv = rand(B, 1, (H + 2 * Hkv) * D)
    q, k, v = qkv.split([H * D, Hkv * D, Hkv * D], dim=-1)
    q, k, v = (t.view(B, 1, -1, D).transpose(1, 2) for t in (q, k, v))
    angles = torch.rand(1, rot // 2, generator=gen).to(device) * 6.28
    cos = torch.cat([angles.cos()] * 2, dim=-1)
    sin = torch.cat([angles.sin()] * 2, dim=-1)
    caches = rand(B, Hkv, S, D), rand(B, Hkv, S, D)
    pos = torch.tensor([p], device=device)
    lo = torch.zeros(B, dtype=torch.int64, device=device)
    return q, k, v, cos, sin, caches, lo, pos


@pytest.mark.parametrize("prefetch_mib", [0, 16])
@pytest.mark.parametrize("case", ROPE_GPU_CASES)
def test_on_cuda_the_rope_op_matches_torch_eager_and_compiled(case, prefetch_mib: int):
    """decode_attention_rope compiled for the GPU (bf16) against apply_rope, the cache
    written by index_copy_ and the plain op; then under torch.compile (Inductor), in a
    module whose caches are buffers as the models' are: the same output and caches, so
    Inductor keeps the op's writes to the buffers. With ``prefetch_mib``, the op pulls
    that much of a 32 MiB weight buffer into L2 (the bulk prefetch): the same results,
    and Inductor copies no weight before the kernel."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU (the compiled kernel; the interpreter cases run on CPU)")
    from artifactcache.models.decode_attention import decode_attention, decode_attention_rope
    from artifactcache.models.rope import apply_rope

    q, k, v, cos, sin, (k_cache, v_cache), lo, pos = _rope_case(case, "cuda")
    rot = cos.shape[-1]
    want_k, want_v = k_cache.clone(), v_cache.clone()
    want_k.index_copy_(2, pos, apply_rope(k, cos, sin, rot))
    want_v.index_copy_(2, pos, v)
    want = decode_attention(apply_rope(q, cos, sin, rot), want_k, want_v, lo, pos)

    weight = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    weight_before = weight.clone()  # the modules below hold ``weight`` itself

    class Step(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("k_cache", k_cache.clone())
            self.register_buffer("v_cache", v_cache.clone())
            self.register_buffer("after", weight)

        def forward(self, q, k, v, cos, sin, lo, pos):
            return decode_attention_rope(q, k, v, cos, sin, self.k_cache, self.v_cache, lo, pos,
                                         self.after, prefetch_mib << 20)  # fmt: skip

    from torch._inductor.utils import run_and_get_code

    compiled = torch.compile(Step(), fullgraph=True)
    _, code = run_and_get_code(compiled, q, k, v, cos, sin, lo, pos)
    # Written in place: no copy of a cache before the kernel or back into the buffer after.
    assert not any("clone" in c or ".copy_(" in c for c in code), code
    compiled = torch.compile(Step(), fullgraph=True)
    for run in (Step(), compiled):
        got = run(q, k, v, cos, sin, lo, pos)
        # p's score is summed in another order than tl.dot's and its weight rounded to
        # bf16 against the final max, not a tile's: a bf16 output may round the other way.
        torch.testing.assert_close(got, want, rtol=1.6e-2, atol=2e-3)
        step = getattr(run, "_orig_mod", run)
        torch.testing.assert_close(step.k_cache, want_k)
        assert torch.equal(step.v_cache, want_v)
        assert torch.equal(step.after, weight_before)


# (rows, query heads, kv heads, head_dim, slots, position, row starts; a start past the
# position is a padding row): a cache of up to ONE_SPLIT_SLOTS is one split whose program
# writes the output (no combine); longer ones are cut and combined. The interpreter cases
# check this arithmetic in fp32 on the CPU; here the compiled kernel, bf16 on the tensor
# cores, is held to SDPA.
SDPA_GPU_CASES = [(1, 32, 32, 128, 256, 200, None), (1, 32, 8, 128, 256, 5, None),
                  (3, 32, 32, 80, 200, 150, [0, 7, 149]),
                  (2, 32, 8, 128, 4096, 1000, [0, 1200])]  # fmt: skip


@pytest.mark.parametrize("case", SDPA_GPU_CASES)
def test_on_cuda_the_kernel_matches_sdpa(case):
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU (the compiled kernel; the interpreter cases run on CPU)")
    from artifactcache.models.common import attention_mask, decode_lo, sdpa
    from artifactcache.models.decode_attention import (
        ONE_SPLIT_SLOTS,
        decode_attention,
        launch_config,
    )

    B, H, Hkv, D, S, p, rows = case
    # Each case takes the path it is here for: one split up to ONE_SPLIT_SLOTS, else several.
    assert (launch_config(B, Hkv, S).split >= S) == (S <= ONE_SPLIT_SLOTS)
    gen = torch.Generator(device="cpu").manual_seed(5)
    q = torch.randn(B, H, 1, D, generator=gen).cuda().bfloat16()
    k = torch.randn(B, Hkv, S, D, generator=gen).cuda().bfloat16()
    v = torch.randn(B, Hkv, S, D, generator=gen).cuda().bfloat16()
    pos = torch.tensor([p], device="cuda")
    row_start = torch.tensor(rows, device="cuda") if rows else None
    got = decode_attention(q, k, v, decode_lo(pos, row_start, None, B), pos)
    mask = attention_mask(pos, torch.arange(S, device="cuda"), None, row_start)
    want = sdpa(q.float(), k.float(), v.float(), mask, H // Hkv)
    # bf16 products and a bf16 output against fp32 SDPA: one bf16 rounding of the output
    # and of each weight's probability.
    torch.testing.assert_close(got.float(), want, rtol=1.6e-2, atol=4e-3)
