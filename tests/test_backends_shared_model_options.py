"""backends/model_options.py: which builds fuse and quantize, the one-line refusals, and
the key factors that say so."""

from __future__ import annotations

import dataclasses

import pytest

from artifactcache import api
from artifactcache.backends.base import get_backend
from artifactcache.backends.shared.model_options import (
    ATTENTION_PREFETCH_MAX_MIB,
    MODEL_BACKENDS,
    PREFETCH_DEFAULT_MIB,
    attention_prefetch_mib,
    check_quant,
    cudnn_prefill,
    fuse_projections,
    model_build_args,
    model_factors,
    parse_flag,
    row_gemv,
    split_kv_decode,
    split_kv_rope,
)
from artifactcache.choices import BuildChoices
from artifactcache.errors import BackendError
from artifactcache.recipes import load_recipe


@pytest.mark.parametrize(
    ("backend", "device", "recipe", "fused"),
    [
        ("aoti", "cuda", "tiny-llama", True),  # the default of the CUDA compiled builds
        ("inductor", "cuda:1", "tiny-qwen3", True),
        ("eager", "cuda", "tiny-llama", False),  # eager keeps the checkpoint's layout
        ("inductor", "cpu", "tiny-mistral", False),
        ("aoti", "cuda", "tiny-phi-2", True),  # in_proj and out_proj (models/phi2.py)
        ("eager", "cpu", "tiny-phi-2", False),
        ("eager", "cpu", "tiny-phi-3", True),  # fused in the checkpoint
    ],
)
def test_fused_by_default(backend: str, device: str, recipe: str, fused: bool):
    opts = BuildChoices(device=device)
    assert fuse_projections(backend, load_recipe(recipe), opts) is fused


def test_the_flag_overrides_the_default():
    llama = load_recipe("tiny-llama")
    on = BuildChoices(extra={"fuse_projections": 1})
    off = BuildChoices(device="cuda", extra={"fuse_projections": "0"})
    assert fuse_projections("eager", llama, on) is True
    assert fuse_projections("aoti", llama, off) is False
    assert fuse_projections("eager", load_recipe("tiny-phi-3"), on) is True


@pytest.mark.parametrize(
    ("recipe", "value", "says"),
    [
        ("tiny-phi-3", 0, "cannot split them"),
        ("tiny-llama", "maybe", "expected 0 or 1"),
    ],
)
def test_impossible_fusion_is_one_line(recipe: str, value: object, says: str):
    opts = BuildChoices(extra={"fuse_projections": value})
    with pytest.raises(BackendError, match=says):
        fuse_projections("eager", load_recipe(recipe), opts)


def test_parse_flag():
    assert [parse_flag("x", v) for v in (True, 0, "on", " YES ", "false")] == [
        True, False, True, True, False]  # fmt: skip
    with pytest.raises(BackendError, match="expected 0 or 1"):
        parse_flag("x", 2)


@pytest.mark.parametrize(
    ("backend", "quant", "says"),
    [
        ("eager", "int4", "unknown --quant 'int4'"),
        ("ort", "int8wo", "constant folding"),
        ("trt", "int8wo", "Q/DQ"),
    ],
)
def test_quant_refusals_are_one_line(backend: str, quant: str, says: str):
    with pytest.raises(BackendError, match=says):
        check_quant(backend, BuildChoices(quant=quant))
    # The backend's own option check refuses it too (compare validates through it).
    with pytest.raises(BackendError, match=says):
        get_backend(backend).check_options(BuildChoices(quant=quant))


def test_int4wo_on_cuda_takes_bf16_only():
    for backend in ("eager", "inductor", "aoti"):
        with pytest.raises(BackendError, match="tinygemm.*--dtype bf16"):
            check_quant(backend, BuildChoices(quant="int4wo", device="cuda", dtype="fp16"))
        check_quant(backend, BuildChoices(quant="int4wo", device="cuda", dtype="bf16"))
        check_quant(backend, BuildChoices(quant="int4wo", device="cpu", dtype="fp32"))


def test_ort_refuses_the_fusion_flag():
    with pytest.raises(BackendError, match="fuse_projections"):
        get_backend("ort").check_options(BuildChoices(extra={"fuse_projections": 1}))


@pytest.mark.parametrize("backend", ["eager", "inductor", "aoti"])
def test_the_factors_name_the_model_as_built(backend: str):
    b, rec = get_backend(backend), load_recipe("tiny-llama")
    plain = b.factors(rec, BuildChoices())
    assert (plain["fused_projections"], plain["quant"]) == (False, "none")
    opts = BuildChoices(quant="int8wo", extra={"fuse_projections": 1})
    want = {**plain, "fused_projections": True, "quant": "int8wo"}  # int8wo keeps regions
    assert b.factors(rec, opts) == want
    assert model_factors(backend, rec, opts) == {
        "fused_projections": True,
        "quant": "int8wo",
        "decode_attention": "sdpa",
        "row_gemv": False,  # a CPU build
        "cudnn_prefill": True,  # a CPU build: torch's own choice, which has no cuDNN
        "attention_prefetch_mib": 0,  # no split-KV decode on a CPU
    }


def _long(name: str = "tiny-llama", max_seq_len: int = 1024, max_batch: int = 1):
    """A tiny recipe with a context long enough for several KV-length buckets."""
    rec = load_recipe(name)
    rec = dataclasses.replace(
        rec, model=dataclasses.replace(rec.model, max_position_embeddings=4096)
    )
    return rec.with_shapes(max_seq_len=max_seq_len, max_batch=max_batch)


@pytest.mark.parametrize(
    ("backend", "device", "expected"),
    [("aoti", "cuda", True), ("inductor", "cuda", True), ("eager", "cuda", False),
     ("aoti", "cpu", False), ("inductor", "cpu", False)],
)  # fmt: skip
def test_split_kv_decode_is_the_cuda_default_of_the_compiled_backends(
    backend: str, device: str, expected: bool
):
    opts, rec = BuildChoices(device=device), _long()
    assert split_kv_decode(backend, opts, rec) is expected
    factors = model_factors(backend, rec, opts)
    assert factors["decode_attention"] == ("split_kv" if expected else "sdpa")
    off = BuildChoices(device=device, extra={"split_kv_decode": 0})
    assert split_kv_decode(backend, off, rec) is False


def test_split_kv_decode_on_cpu_or_an_onnx_backend_is_refused():
    with pytest.raises(BackendError, match="needs --device cuda"):
        get_backend("aoti").check_options(BuildChoices(extra={"split_kv_decode": 1}))
    with pytest.raises(BackendError, match="expected 0 or 1"):
        get_backend("inductor").check_options(BuildChoices(extra={"split_kv_decode": "maybe"}))
    with pytest.raises(BackendError, match="ONNX export"):
        split_kv_decode("ort", BuildChoices(device="cuda", extra={"split_kv_decode": 1}))
    # What a user meets: ort's own option check refuses the flag in one line.
    with pytest.raises(BackendError, match="split_kv_decode"):
        get_backend("ort").check_options(BuildChoices(extra={"split_kv_decode": 1}))


@pytest.mark.parametrize(
    ("backend", "device", "expected"),
    [("aoti", "cuda", False), ("inductor", "cuda", False), ("eager", "cuda", False),
     ("aoti", "cpu", True), ("ort", "cuda", True), ("trt", "cuda", True)],
)  # fmt: skip
def test_prefill_attention_is_off_cudnn_by_default_on_cuda(
    backend: str, device: str, expected: bool
):
    opts, rec = BuildChoices(device=device), load_recipe("tiny-llama")
    assert cudnn_prefill(backend, opts) is expected
    if backend in MODEL_BACKENDS:
        assert model_factors(backend, rec, opts)["cudnn_prefill"] is expected
        assert model_build_args(backend, rec, opts)["cudnn_prefill"] is expected
    if device == "cuda" and backend in MODEL_BACKENDS:
        on = BuildChoices(device="cuda", extra={"cudnn_prefill": "yes"})
        assert model_factors(backend, rec, on)["cudnn_prefill"] is True


def test_cudnn_prefill_on_cpu_or_an_onnx_backend_is_refused():
    with pytest.raises(BackendError, match="needs --device cuda"):
        get_backend("aoti").check_options(BuildChoices(extra={"cudnn_prefill": 1}))
    with pytest.raises(BackendError, match="expected 0 or 1"):
        get_backend("eager").check_options(BuildChoices(extra={"cudnn_prefill": "maybe"}))
    with pytest.raises(BackendError, match="ONNX export"):
        cudnn_prefill("ort", BuildChoices(device="cuda", extra={"cudnn_prefill": 0}))
    # Off on CPU is what CPU does anyway: accepted, and the same key factor as no flag.
    assert cudnn_prefill("aoti", BuildChoices(extra={"cudnn_prefill": 0})) is True


def _key(backend: str, **kw: object) -> api.KeyInfo:
    b, ctx = api.make_context("tiny-llama", backend, check_memory=False, **kw)
    return api.key_for(b, ctx)


@pytest.mark.parametrize("backend", ["eager", "aoti"])
def test_quant_and_fusion_change_the_key_but_not_the_weights_factor(backend: str):
    pytest.importorskip("torch._inductor")
    plain = _key(backend)
    quant = _key(backend, quant="int8wo")
    fused = _key(backend, extra={"fuse_projections": 1})
    assert len({plain.key, quant.key, fused.key}) == 3
    assert len({plain.full_key, quant.full_key, fused.full_key}) == 3
    assert plain.factors["weights"] == quant.factors["weights"] == fused.factors["weights"]
    if backend == "aoti":  # weight-stripped: an architecture key, which the options split too
        assert len({plain.arch_key, quant.arch_key, fused.arch_key}) == 3


@pytest.mark.parametrize(("max_seq_len", "max_batch"), [(257, 1), (4096, 1), (4096, 32)])
def test_split_kv_decode_is_the_default_for_long_contexts_at_any_batch(
    max_seq_len: int, max_batch: int
):
    """Several KV buckets, one row or 32: split-KV's static step is the default."""
    rec = _long(max_seq_len=max_seq_len, max_batch=max_batch)
    cuda = BuildChoices(device="cuda")
    assert model_factors("aoti", rec, cuda)["decode_attention"] == "split_kv"
    assert model_build_args("inductor", rec, cuda)["split_kv_decode"] is True
    off = BuildChoices(device="cuda", extra={"split_kv_decode": 0})
    assert model_factors("aoti", rec, off)["decode_attention"] == "sdpa"


@pytest.mark.parametrize("max_seq_len", [256, 64])
def test_split_kv_decode_is_the_default_where_decode_is_static_already(max_seq_len: int):
    """One KV bucket (max_seq_len <= 256): SDPA's step is static too, but split-KV measured
    faster at the seed context; SDPA stays one flag away."""
    cuda = BuildChoices(device="cuda")
    rec = _long(max_seq_len=max_seq_len, max_batch=32)
    assert split_kv_decode("aoti", cuda, rec) is True
    assert model_factors("inductor", rec, cuda)["decode_attention"] == "split_kv"
    assert model_build_args("aoti", rec, cuda)["split_kv_decode"] is True
    off = BuildChoices(device="cuda", extra={"split_kv_decode": 0})
    assert split_kv_decode("aoti", off, rec) is False
    assert model_factors("inductor", rec, off)["decode_attention"] == "sdpa"
    assert model_build_args("inductor", rec, off)["split_kv_decode"] is False


@pytest.mark.parametrize("max_seq_len", [256, 2048])
def test_phi_2_decodes_through_split_kv_with_the_rope_by_default(max_seq_len: int):
    """phi-2's split-KV step with the rope inside decoded 1.049x its SDPA step (attempt
    67): the default for its one-row CUDA builds of inductor and aoti at every context,
    keyed; not on CPU, not on eager (even with split-KV asked) or ort, not batched, not
    once split-KV is turned off, and either flag given is the answer."""
    rec = _long("tiny-phi-2", max_seq_len=max_seq_len)
    cuda = BuildChoices(device="cuda")
    for backend in ("inductor", "aoti"):
        assert split_kv_decode(backend, cuda, rec) is True
        assert split_kv_rope(backend, cuda, rec) is True
        assert model_factors(backend, rec, cuda)["decode_attention"] == "split_kv_rope"
        assert model_build_args(backend, rec, cuda)["split_kv_rope"] is True
    for backend, opts in [
        ("inductor", BuildChoices(device="cpu")),
        ("eager", cuda),
        ("ort", cuda),
        ("aoti", BuildChoices(device="cuda", extra={"split_kv_decode": 0})),
        ("inductor", BuildChoices(device="cuda", extra={"split_kv_rope": 0})),
        ("eager", BuildChoices(device="cuda", extra={"split_kv_decode": 1})),
    ]:
        assert split_kv_rope(backend, opts, rec) is False, (backend, opts.extra)
    batched = _long("tiny-phi-2", max_seq_len=max_seq_len, max_batch=8)
    assert split_kv_rope("aoti", cuda, batched) is False
    assert model_factors("aoti", batched, cuda)["decode_attention"] == "split_kv"
    no_rope = BuildChoices(device="cuda", extra={"split_kv_rope": "off"})
    assert model_factors("aoti", rec, no_rope)["decode_attention"] == "split_kv"
    # Whatever the weights, only phi-2's: a llama family's rope stays off unless asked.
    assert split_kv_rope("inductor", cuda, _long("tiny-llama", max_seq_len=256)) is False
    int8 = BuildChoices(device="cuda", quant="int8wo")
    assert split_kv_rope("aoti", int8, rec) is True


def test_phi_3_prefetches_with_the_rope_inside_split_kv_on_inductor_by_default():
    """phi-3-mini's unquantized one-row inductor build with the rope inside the split-KV
    kernel and 4 MiB prefetched decoded 1.0105x its default of before (attempt 73): both
    are its default there, and nowhere it was not measured (aoti, quantized, batched).
    The default prefetch rides with the rope: a build without it prefetches nothing (the
    plain kernel lost under it), phi-2's as well; asking for no prefetch keeps the rope."""
    rec = _long("tiny-phi-3", max_seq_len=256)
    cuda = BuildChoices(device="cuda")
    assert split_kv_rope("inductor", cuda, rec) is True
    assert attention_prefetch_mib("inductor", cuda, rec) == PREFETCH_DEFAULT_MIB
    assert model_factors("inductor", rec, cuda)["decode_attention"] == "split_kv_rope"
    assert model_build_args("inductor", rec, cuda)["attention_prefetch"] == 4 << 20
    assert model_factors("aoti", rec, cuda)["decode_attention"] == "split_kv"
    sdpa = BuildChoices(device="cuda", extra={"split_kv_decode": 0})
    assert split_kv_rope("inductor", sdpa, rec) is False
    assert attention_prefetch_mib("inductor", sdpa, rec) == 0
    for backend, opts, recipe in [
        ("aoti", cuda, rec),
        ("inductor", BuildChoices(device="cuda", quant="int8wo"), rec),
        ("inductor", cuda, _long("tiny-phi-3", max_seq_len=256, max_batch=8)),
        ("inductor", BuildChoices(device="cpu"), rec),
    ]:
        assert split_kv_rope(backend, opts, recipe) is False, (backend, opts)
        assert attention_prefetch_mib(backend, opts, recipe) == 0, (backend, opts)
    plain = BuildChoices(device="cuda", extra={"split_kv_rope": 0})
    assert attention_prefetch_mib("inductor", plain, rec) == 0
    phi2 = _long("tiny-phi-2", max_seq_len=256)
    assert attention_prefetch_mib("inductor", plain, phi2) == 0
    no_prefetch = BuildChoices(device="cuda", extra={"attention_prefetch": 0})
    assert split_kv_rope("inductor", no_prefetch, rec) is True
    assert attention_prefetch_mib("inductor", no_prefetch, rec) == 0


def test_split_kv_rope_is_asked_for_and_keyed():
    """Off unless asked; asked, it is its own key and build argument; asked where decode
    does not run the split-KV kernel, one line that says what to add."""
    rec = _long(max_seq_len=256)
    cuda = BuildChoices(device="cuda")
    assert split_kv_rope("inductor", cuda, rec) is False
    assert model_build_args("inductor", rec, cuda)["split_kv_rope"] is False
    asked = BuildChoices(device="cuda", extra={"split_kv_rope": 1})
    assert split_kv_rope("aoti", asked, rec) is True
    assert model_factors("aoti", rec, asked)["decode_attention"] == "split_kv_rope"
    assert model_factors("aoti", rec, cuda)["decode_attention"] == "split_kv"
    assert model_build_args("inductor", rec, asked)["split_kv_rope"] is True
    sdpa = BuildChoices(device="cuda", extra={"split_kv_rope": 1, "split_kv_decode": 0})
    with pytest.raises(BackendError, match="add --extra split_kv_decode=1"):
        split_kv_rope("inductor", sdpa, rec)
    with pytest.raises(BackendError, match="split_kv_rope=1 is for eager, inductor, aoti"):
        split_kv_rope("ort", asked)  # one refusal, not a hint to add split_kv_decode
    no_split = BuildChoices(device="cuda", extra={"split_kv_rope": 1, "split_kv_decode": 0})
    with pytest.raises(BackendError, match="split_kv_rope=1 runs inside the split-KV"):
        get_backend("inductor").check_options(no_split)  # the options alone tell


@pytest.mark.parametrize(
    ("backend", "device", "recipe", "quant", "expected"),
    [
        ("aoti", "cuda", "tiny-phi-3", None, True),  # the CUDA compiled builds' default
        ("inductor", "cuda", "tiny-phi-3", "int8wo", True),  # int8 weights through it too
        ("aoti", "cuda", "tiny-llama", "int8wo", True),  # int8wo: every llama family
        ("aoti", "cuda", "tiny-llama", None, True),  # bf16 llama: faster (attempt 73)
        ("inductor", "cuda", "tiny-llama", None, True),
        ("inductor", "cuda", "tiny-mistral", None, True),  # llama-3-8b's shapes
        ("inductor", "cuda", "tiny-qwen3", None, False),  # not measured
        ("aoti", "cuda", "tiny-qwen2", None, False),
        ("eager", "cuda", "tiny-llama", None, False),  # eager is the reference
        ("aoti", "cpu", "tiny-llama", None, False),
        ("aoti", "cuda", "tiny-phi-2", None, True),  # bf16 phi-2: faster on both backends
        ("inductor", "cuda", "tiny-phi-2", None, True),
        ("eager", "cuda", "tiny-phi-2", None, False),
        ("inductor", "cuda", "tiny-phi-2", "int8wo", False),  # phi-2's int8wo: unmeasured
        ("aoti", "cuda", "tiny-phi-2", "int4wo", False),
        ("aoti", "cuda", "tiny-llama", "int4wo", False),  # tinygemm measured faster
        ("inductor", "cuda", "tiny-phi-3", "int4wo", False),  # not even where bf16's is on
    ],
)
def test_row_gemv_is_the_default_where_the_kernel_runs(
    backend: str, device: str, recipe: str, quant: str | None, expected: bool
):
    rec = load_recipe(recipe)
    opts = BuildChoices(device=device, quant=quant, dtype="bf16")
    assert row_gemv(backend, rec, opts) is expected
    assert model_build_args(backend, rec, opts)["row_gemv"] is expected
    assert model_factors(backend, rec, opts)["row_gemv"] is expected


@pytest.mark.parametrize(
    ("backend", "device", "recipe", "extra", "quant", "says"),
    [
        ("aoti", "cpu", "tiny-llama", {}, None, "needs --device cuda"),
        ("aoti", "cuda", "tiny-llama", {"fuse_projections": 0}, None, "fused projections"),
        ("ort", "cuda", "tiny-llama", {}, None, "ONNX export"),
        ("eager", "cuda", "tiny-llama", {}, None, "add --extra fuse_projections=1"),
    ],
)
def test_an_impossible_row_gemv_is_one_line(
    backend: str, device: str, recipe: str, extra: dict, quant: str | None, says: str
):
    opts = BuildChoices(device=device, quant=quant, dtype="bf16", extra={"row_gemv": 1, **extra})
    with pytest.raises(BackendError, match=says) as e:
        row_gemv(backend, load_recipe(recipe), opts)
    assert "\n" not in str(e.value)


def test_row_gemv_asked_for_where_it_runs_is_taken():
    eager = BuildChoices(device="cuda", extra={"row_gemv": 1, "fuse_projections": 1})
    assert row_gemv("eager", load_recipe("tiny-llama"), eager) is True  # not eager's default
    int4 = BuildChoices(device="cuda", dtype="bf16", quant="int4wo", extra={"row_gemv": 1})
    assert row_gemv("inductor", load_recipe("tiny-llama"), int4) is True
    assert model_factors("inductor", load_recipe("tiny-llama"), int4)["row_gemv"] is True
    phi2 = BuildChoices(device="cuda", dtype="bf16", extra={"row_gemv": 1})
    assert row_gemv("aoti", load_recipe("tiny-phi-2"), phi2) is True


def test_a_batched_build_has_no_one_row_step():
    rec = load_recipe("tiny-llama").with_shapes(max_batch=4)
    assert row_gemv("aoti", rec, BuildChoices(device="cuda")) is False
    with pytest.raises(BackendError, match="--max-batch 4") as e:
        row_gemv("aoti", rec, BuildChoices(device="cuda", extra={"row_gemv": 1}))
    assert "\n" not in str(e.value)


def test_row_gemv_is_a_key_factor():
    on = BuildChoices(device="cuda")
    off = BuildChoices(device="cuda", extra={"row_gemv": 0})
    rec = load_recipe("tiny-phi-3")
    assert model_factors("aoti", rec, on) != model_factors("aoti", rec, off)


def test_the_attention_prefetch_is_whole_mib_inside_split_kv_decode_and_keyed():
    """--extra attention_prefetch=MiB: by default 4 MiB where it measured faster (phi-2's
    and phi-3's one-row CUDA inductor builds), 0 elsewhere; asked for, its value is the
    key's and the model's (in bytes); out of range, not a whole number, or asked for
    without split-KV decode, one line, from the options alone (before any build)."""
    rec = _long("tiny-phi-2", max_seq_len=256)
    cuda = BuildChoices(device="cuda")
    assert PREFETCH_DEFAULT_MIB == 4
    assert attention_prefetch_mib("inductor", cuda, rec) == 4
    assert model_factors("inductor", rec, cuda)["attention_prefetch_mib"] == 4
    assert model_build_args("inductor", rec, cuda)["attention_prefetch"] == 4 << 20
    assert attention_prefetch_mib("inductor", BuildChoices(device="cpu"), rec) == 0
    off = BuildChoices(device="cuda", extra={"split_kv_decode": 0})
    assert attention_prefetch_mib("inductor", off, rec) == 0
    assert attention_prefetch_mib("aoti", cuda, rec) == 0  # not measured there
    assert attention_prefetch_mib("inductor", cuda, _long("tiny-llama", max_seq_len=256)) == 0
    batched = _long("tiny-phi-2", max_seq_len=256, max_batch=8)
    assert attention_prefetch_mib("inductor", cuda, batched) == 0
    int8 = BuildChoices(device="cuda", quant="int8wo")  # measured on bf16 weights only
    assert attention_prefetch_mib("inductor", int8, rec) == 0
    asked = BuildChoices(device="cuda", extra={"attention_prefetch": "12"})
    for backend in ("inductor", "aoti"):
        assert model_factors(backend, rec, asked)["attention_prefetch_mib"] == 12
    with pytest.raises(BackendError, match="split_kv_decode=1"):  # eager's default: SDPA
        model_factors("eager", rec, asked)
    assert model_build_args("inductor", rec, asked)["attention_prefetch"] == 12 << 20
    factors = [
        get_backend("aoti").factors(
            rec, BuildChoices(device="cuda", extra={"attention_prefetch": m})
        )
        for m in (0, 8)
    ]
    assert factors[0] != factors[1]  # the key is a hash of the factors
    for value, why in [
        ("-1", "whole MiB"), ("1.5", "whole MiB"), ("lots", "whole MiB"), ("\u00b2", "whole MiB"),
        ("\u0663", "whole MiB"),  # digits to isdigit(), not to a MiB count
        (str(ATTENTION_PREFETCH_MAX_MIB + 1), "whole MiB"),
    ]:  # fmt: skip
        bad = BuildChoices(device="cuda", extra={"attention_prefetch": value})
        with pytest.raises(BackendError, match=why):
            get_backend("inductor").check_options(bad)
    no_split = BuildChoices(device="cuda", extra={"split_kv_decode": 0, "attention_prefetch": 8})
    with pytest.raises(BackendError, match="add --extra split_kv_decode=1"):
        get_backend("aoti").check_options(no_split)
    on_cpu = BuildChoices(device="cpu", extra={"attention_prefetch": 8})
    with pytest.raises(BackendError, match="needs --device cuda"):
        get_backend("eager").check_options(on_cpu)
    with pytest.raises(BackendError, match="attention_prefetch"):
        get_backend("ort").check_options(
            BuildChoices(device="cuda", extra={"attention_prefetch": 8})
        )
