"""Pieces every family shares: the static KV cache, the attention mask, the forward.

The KV cache is static (gpt-fast style): fixed [max_batch, n_kv_heads, slots,
head_dim] buffers written in place at ``input_pos``, so a compiled step never
reallocates. Positions beyond the current one may hold stale values from an earlier
request; the causal mask hides them, so the cache never needs clearing between
requests.

A batch shares ``input_pos``: prompts of different lengths are left-padded to the
longest, and ``row_start[b]`` is the first real slot of row b. The mask hides the
slots before it, so a row sees only its own tokens, shifted to later positions;
RoPE scores depend only on the distance between positions, so the row's logits
are those of the prompt run alone (up to rounding).

A step reads the cache up to a length it is told by the *shape* of one input,
``kv_pos`` (the key positions 0 .. L-1, a view of one arange): decode and a later
prefill chunk pass the filled length rounded up to a bucket (artifactcache/kv_buckets.py),
so their cost follows the used length, not the allocated one, while one compiled step
(L a dynamic dimension) serves every bucket; the ONNX graph takes ``kv_pos`` as an input
the same way. Given ``row_start`` but no ``kv_pos`` a step reads all ``max_seq_len``
positions. Given neither, the step is a
prompt's first chunk (positions 0 .. T-1, every row starting at slot 0): it writes the
cache and attends causally to its own keys only, which SDPA runs through its flash
kernel (``Reads.own``). A split-KV model (``setup_caches(..., split_kv_decode=True)``)
decodes through models/decode_attention.py instead, which reads the filled positions
of the whole static cache, and ignores ``kv_pos``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from ..config import ModelConfig
from ..kv_buckets import cache_slots
from .rope import apply_rope, rope_cache
from .rows import row_linear, streamed_weight


def embedding(num: int, dim: int) -> nn.Embedding:
    """An nn.Embedding without its random init: our weights are always filled later.

    Why not plain ``nn.Embedding``: models are built on the meta device, and there
    Embedding's init (``normal_``) runs through a Python reference wrapped in
    ``torch._disable_dynamo``, which imports all of torch._dynamo (1.5-2.5 s) into
    a process that never compiles: a warm aoti start paid it inside "weights".
    Handing it an (uninitialized) weight skips reset_parameters(). Meant for the
    meta device only (build_model): elsewhere it would leave uninitialized memory.
    """
    return nn.Embedding(num, dim, _weight=torch.empty(num, dim))


def key_positions(max_seq_len: int, device: torch.device | str | None = None) -> torch.Tensor:
    """The buffer decode's ``kv_pos`` inputs are views of: arange(max_seq_len), int64."""
    return torch.arange(max_seq_len, dtype=torch.int64, device=device)


class KVCache(nn.Module):
    def __init__(
        self,
        max_batch: int,
        n_kv_heads: int,
        max_seq_len: int,
        head_dim: int,
        dtype,
        device,
        bucketed: bool = True,
        kernel_writes: bool = False,
    ):
        super().__init__()
        # Whether a split-KV decode step rotates and writes through the kernel
        # (rope_and_attend); the passes write with index_copy_ either way.
        self.kernel_writes = kernel_writes
        shape = (max_batch, n_kv_heads, cache_slots(max_seq_len, bucketed), head_dim)
        self.register_buffer(
            "k_cache", torch.zeros(shape, dtype=dtype, device=device), persistent=False
        )
        self.register_buffer(
            "v_cache", torch.zeros(shape, dtype=dtype, device=device), persistent=False
        )

    def write(self, input_pos: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Write k/v [B, Hkv, T, D] at input_pos."""
        # index_copy_ keeps the write in place and traceable (export sees a buffer mutation).
        self.k_cache.index_copy_(2, input_pos, k)
        self.v_cache.index_copy_(2, input_pos, v)

    def update(self, input_pos: torch.Tensor, k: torch.Tensor, v: torch.Tensor, length: int):
        """Write k/v at input_pos; the first ``length`` positions of the cache, as views."""
        self.write(input_pos, k, v)
        return self.k_cache[:, :, :length], self.v_cache[:, :, :length]


@dataclass
class Reads:
    """What a step's attention reads of the cache.

    ``mask`` [B or 1, 1, T, L] bool: SDPA over the first L positions (a later prefill
    chunk, a batch of left-padded prompts, and decode that takes its length from
    kv_pos's bucket). ``lo`` [B] int64: a decode step (T = 1) through the split-KV
    kernel, over positions lo[b] .. input_pos. ``own``: a prompt's first chunk, which
    reads nothing of the cache: causal attention over its own T keys, through SDPA's
    flash kernel, or with ``mask`` [1, 1, T, T] when a sliding window is shorter than
    the context.
    """

    mask: torch.Tensor | None = None
    lo: torch.Tensor | None = None
    own: bool = False
    # Whether SDPA may run cuDNN's kernel (torch's first choice on Hopper); see sdpa().
    # A Python bool, or a SymBool decided by the token dimension's range (forward).
    cudnn: bool = True
    # ``mask`` as an additive bias (attention_bias), for a call kept off cuDNN.
    bias: torch.Tensor | None = None
    # Bytes of the projection after attention that a split-KV decode step pulls into L2
    # while it attends (models/decode_attention.py; CausalLM.attention_prefetch).
    prefetch: int = 0


def decode_lo(
    input_pos: torch.Tensor,
    row_start: torch.Tensor | None,
    sliding_window: int | None,
    rows: int,
) -> torch.Tensor:
    """[rows] int64: the first position each row's one query attends to, p = input_pos.

    The terms of :func:`attention_mask` for one query: s >= row_start[b], s > p -
    window, and s == p for a padding row (row_start[b] > p), which sees itself only.
    """
    p = input_pos[-1]
    if row_start is None:
        lo = torch.zeros(rows, dtype=torch.int64, device=input_pos.device)
    else:
        lo = row_start
    if sliding_window is not None:
        lo = torch.maximum(lo, p - sliding_window + 1)
    return torch.minimum(lo, p)


def rope_and_attend(
    cache: KVCache | None,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    rotary_dim: int,
    input_pos: torch.Tensor,
    reads: Reads,
    after: nn.Module | None = None,
) -> torch.Tensor:
    """q and k rotated (apply_rope), then :func:`cached_attention`. A split-KV decode step
    on a cache the kernel writes does the three in one kernel (models/decode_attention.py,
    ``decode_attention_rope``), where Inductor fuses torch's rotations and writes into
    two more kernels a layer. ``after``: the projection that follows, of whose weight a
    split-KV decode step prefetches ``reads.prefetch`` bytes."""
    if reads.lo is not None and cache is not None and cache.kernel_writes:
        from .decode_attention import decode_attention_rope

        return decode_attention_rope(
            q, k, v, cos, sin, cache.k_cache, cache.v_cache, reads.lo, input_pos,
            *_prefetched(after, reads),
        )  # fmt: skip
    q = apply_rope(q, cos, sin, rotary_dim)
    k = apply_rope(k, cos, sin, rotary_dim)
    return cached_attention(cache, q, k, v, input_pos, reads, after)


def _prefetched(after: nn.Module | None, reads: Reads) -> tuple[torch.Tensor | None, int]:
    """The split-KV ops' (after, after_bytes): the weight ``after`` streams and the bytes
    to prefetch of it, or none (no prefetch asked, or a layer whose weight is unknown)."""
    weight = streamed_weight(after) if after is not None and reads.prefetch > 0 else None
    return (weight, reads.prefetch) if weight is not None else (None, 0)


def cached_attention(
    cache: KVCache | None,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    input_pos: torch.Tensor,
    reads: Reads,
    after: nn.Module | None = None,
) -> torch.Tensor:
    """Write k/v [B, Hkv, T, D] at input_pos, then attend q [B, H, T, D] to the cache
    (``after``: rope_and_attend's)."""
    assert cache is not None, "call setup_caches() first"
    n_rep = q.shape[1] // k.shape[1]
    if reads.own:
        cache.write(input_pos, k, v)
        return sdpa(
            q, k, v, reads.mask, n_rep, causal=reads.mask is None, cudnn=reads.cudnn,
            bias=reads.bias,
        )  # fmt: skip
    if reads.lo is not None:
        # Imported here: it imports Triton, which only a split-KV build needs.
        from .decode_attention import decode_attention

        k_all, v_all = cache.update(input_pos, k, v, cache.k_cache.shape[2])
        return decode_attention(q, k_all, v_all, reads.lo, input_pos, *_prefetched(after, reads))
    assert reads.mask is not None
    k_seen, v_seen = cache.update(input_pos, k, v, reads.mask.shape[-1])
    return sdpa(q, k_seen, v_seen, reads.mask, n_rep, cudnn=reads.cudnn, bias=reads.bias)


def attention_mask(
    input_pos: torch.Tensor,
    kv_pos: torch.Tensor,
    sliding_window: int | None,
    row_start: torch.Tensor | None = None,
) -> torch.Tensor:
    """[B, 1, T, L] bool (B = 1 without ``row_start``; L = len(kv_pos)): query at
    position p of row b sees key s iff s <= p (and p - s < window) and s >= row_start[b],
    or s == p.

    The ``s == p`` term only matters for a left-padding query (p < row_start[b]):
    it keeps that softmax row from being fully masked. Kernels disagree on a fully
    masked row (torch's SDPA returns zeros, a plain softmax NaN), and a NaN written
    into the KV cache would poison P @ V even where P is 0, so no backend may be
    left to decide.
    """
    s = kv_pos
    p = input_pos[:, None]
    mask = s[None, :] <= p
    if sliding_window is not None:
        mask = mask & (s[None, :] > p - sliding_window)
    if row_start is None:
        return mask[None, None]
    own = s[None, None, :] >= row_start[:, None, None]
    return ((mask[None] & own) | (s[None, :] == p)[None])[:, None]


def keeps_off_cudnn(cudnn: bool, t: torch.Tensor) -> bool:
    """Whether a call on ``t`` runs SDPA's kernels but cuDNN's: asked so, on CUDA (CPU has
    no cuDNN kernel). One place, so a CPU test can trace the CUDA path."""
    return not cudnn and t.is_cuda


def sdpa(
    q, k, v, mask, n_rep: int, causal: bool = False, cudnn: bool = True,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:  # fmt: skip
    """q: [B, H, T, D]; k/v: [B, Hkv, S, D]; mask [B or 1, 1, T, S] or None; GQA repeats
    kv heads. ``causal`` (no mask, S == T): query t sees keys 0..t, SDPA's flash path.

    ``cudnn=False`` keeps a CUDA call off cuDNN's kernel, which torch picks first on
    Hopper: cuDNN builds an execution graph on the host for each call shape it has not
    seen (per thread), so a pass of every new prompt length would pay one
    (docs/perf-notes.md, attempt 51). Such a call takes ``bias``, the mask as
    :func:`attention_bias` makes it, and names its kernel in the traced step
    (``sdpa_without_cudnn``): an exported step keeps SDPA whole until Inductor
    decomposes it, when a context such as ``sdpa_kernel`` around this call is gone.
    """
    if n_rep > 1:
        k = k.repeat_interleave(n_rep, dim=1)
        v = v.repeat_interleave(n_rep, dim=1)
    if not keeps_off_cudnn(cudnn, q):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal)
    # A None check, no guard: without it a mask would be dropped in silence.
    assert mask is None or bias is not None, "a call kept off cuDNN takes attention_bias"
    return sdpa_without_cudnn(q, k, v, bias, causal)


def attention_bias(mask: torch.Tensor, dtype: torch.dtype, max_seq_len: int) -> torch.Tensor:
    """``mask`` [B or 1, 1, T, S] as SDPA's memory-efficient kernel takes it: additive (0
    where True, -inf where False) in ``dtype``, each row's stride a multiple of 8.

    Like torch's own SDPA, the rows are padded and sliced back, but always and to a width
    fixed by ``max_seq_len`` (past every S), not to the next multiple of 8 of S: that
    needs S % 8, and a guard on it that a dynamic token count cannot satisfy (a first
    pass's square windowed mask, S = T). Built once per step, for every layer: B x T x
    (max_seq_len + 8) elements, transient (a 4096-token pass of a 32k-slot build: 268 MB
    of bf16).
    """
    cols = mask.shape[-1]
    width = (max_seq_len // 8 + 1) * 8
    bias = torch.zeros(mask.shape, dtype=dtype, device=mask.device)
    bias = bias.masked_fill(mask.logical_not(), float("-inf"))
    return F.pad(bias, (0, width - cols))[..., :cols]


def sdpa_without_cudnn(q, k, v, bias: torch.Tensor | None, causal: bool) -> torch.Tensor:
    """SDPA on CUDA through the kernel torch picks after cuDNN: flash for a half-precision
    call without a mask, else the memory-efficient one with ``bias`` (attention_bias)
    broadcast to [B, H, T, S], as torch's own SDPA passes it."""
    aten = torch.ops.aten
    if bias is None and q.dtype in (torch.float16, torch.bfloat16):
        return aten._scaled_dot_product_flash_attention(q, k, v, 0.0, causal)[0]
    if bias is not None:
        bias = bias.expand(q.shape[0], q.shape[1], q.shape[2], k.shape[2])
    return aten._scaled_dot_product_efficient_attention(q, k, v, bias, False, 0.0, causal)[0]


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # fp32 statistics like transformers' LlamaRMSNorm, then back to the input dtype.
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


class CausalLM(nn.Module):
    """What every family shares: the static caches and the forward over ``self.model``.

    A subclass builds ``self.model`` (with ``embed_tokens`` and ``layers``) and an
    ``lm_head``, and names the final norm inside ``self.model`` (transformers calls it
    ``norm`` for Llama and ``final_layernorm`` for Phi-2).
    """

    FINAL_NORM = "norm"
    cfg: ModelConfig
    lm_head: nn.Linear
    max_seq_len: int

    # Decode through the split-KV kernel (setup_caches), whose cost follows the filled
    # length by itself: the steps are then given the whole cache (no length buckets).
    split_kv_decode = False
    # Serving (backends.shared.runner.build_model_for): a first pass returns the logits
    # of its last position only, the one its first token is picked from. The LM head over
    # every position is ~2-6% of a 7B prompt's FLOPs, and far more of a small model's
    # (vocab x dim per position), plus [T, vocab] fp32 logits written. Read as a constant
    # when a step is compiled or exported.
    first_pass_last_logits = False
    # One-row steps through acache's GEMV (models/rows.py; use_row_gemv).
    row_gemv = False
    # Whether a pass's attention (T > 1) may run cuDNN's SDPA kernel (sdpa()); decode's
    # one query keeps torch's choice: its steps are captured at load, one shape each.
    cudnn_prefill = True
    # A one-query step (decode) calls each block as one nested compile region, traced
    # and lowered once for every layer (layer_call): set by a backend that compiles the
    # model with torch.compile. Passes call the blocks plainly; no effect in eager.
    layer_regions = False
    # Bytes of each block's projection after attention that a split-KV decode step
    # prefetches into L2 while it attends (models/decode_attention.py; 0: none).
    attention_prefetch = 0

    @property
    def kv_buckets(self) -> bool:
        """Whether decode reads the cache by length bucket (kv_pos's length)."""
        return not self.split_kv_decode

    def use_row_gemv(self) -> None:
        """Run one-row steps (decode at batch 1, a first pass's last row) through acache's
        GEMV with the norms, activations and skips folded in (models/rows.py; a tracer
        registers the op first: rows.register_ops). Every block's projections must be
        fused (its ``fused``: models/fuse.py)."""
        if not all(layer.fused for layer in self.model.layers):
            raise ValueError("the row GEMV runs fused projections: fuse_projections first")
        self.row_gemv = True
        for layer in self.model.layers:
            layer.row_gemv = True

    def setup_caches(
        self,
        max_batch: int,
        max_seq_len: int,
        split_kv_decode: bool = False,
        split_kv_rope: bool = False,
    ) -> None:
        """Static KV caches and the rotary table. ``split_kv_rope`` (with
        ``split_kv_decode``): the decode kernel rotates q and k and writes the cache."""
        p = self.lm_head.weight
        self.split_kv_decode = split_kv_decode
        for layer in self.model.layers:
            layer.self_attn.kv_cache = KVCache(
                max_batch, self.cfg.n_kv_heads, max_seq_len, self.cfg.head_dim, p.dtype,
                p.device, bucketed=not split_kv_decode,
                kernel_writes=split_kv_decode and split_kv_rope,
            )  # fmt: skip
        rope = rope_cache(self.cfg, max_seq_len).to(p.device)
        self.register_buffer("rope", rope, persistent=False)
        self.max_seq_len = max_seq_len

    def forward(
        self,
        idx: torch.Tensor,
        input_pos: torch.Tensor,
        row_start: torch.Tensor | None = None,
        kv_pos: torch.Tensor | None = None,
        logit_rows: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """idx [B, T], input_pos [T], row_start [B] (None: every row starts at slot 0).

        Attention reads ``len(kv_pos)`` cache positions: ``kv_pos`` must be 0 .. L-1
        with L > every input position; None with a ``row_start`` reads the whole cache.
        With neither, the step is a prompt's first chunk: input_pos must be 0 .. T-1,
        and attention sees the chunk's own keys, causally (the module docstring); with
        ``first_pass_last_logits`` it returns [B, 1, vocab], the last position's. Layers
        take the read length from the mask's last dimension. A split-KV decode step
        ignores kv_pos: its kernel reads the filled positions only. ``logit_rows`` [R]
        (positions within the pass) keeps those positions' logits only, [B, R, vocab]:
        the ONNX step graph's way to a first pass's last row (onnx/export.py).
        """
        cos, sin = self.rope[0][input_pos], self.rope[1][input_pos]
        window = self.cfg.sliding_window
        if self.split_kv_decode and idx.shape[1] == 1:
            reads = Reads(
                lo=decode_lo(input_pos, row_start, window, idx.shape[0]),
                prefetch=self.attention_prefetch,
            )
        elif row_start is None and kv_pos is None:
            if not torch.compiler.is_compiling() and int(input_pos[0]) != 0:
                # Eager only (one host read a request); a compiled step is the runner's.
                raise ValueError(
                    "a first pass (no row_start, no kv_pos) starts at position 0; pass "
                    "row_start (and kv_pos) to continue a sequence"
                )
            # A window no shorter than the context hides nothing: plain causal (flash).
            short = window is not None and window < self.max_seq_len
            own = attention_mask(input_pos, input_pos, window) if short else None
            reads = Reads(mask=own, own=True, cudnn=self.cudnn_prefill)
        else:
            if kv_pos is None:
                kv_pos = key_positions(self.max_seq_len, input_pos.device)
            # Decided by the token dimension's range, which starts at 16 for a pass
            # (generate/prefill.py): no guard, no specialization.
            one_query = idx.shape[1] == 1
            reads = Reads(
                mask=attention_mask(input_pos, kv_pos, window, row_start),
                cudnn=self.cudnn_prefill or one_query,
            )
        x = self.model.embed_tokens(idx)
        if reads.mask is not None and keeps_off_cudnn(reads.cudnn, x):
            reads.bias = attention_bias(reads.mask, x.dtype, self.max_seq_len)
        # Only where the token count is one: a region's call costs host time in every
        # layer, which a pass (run without a CUDA graph) pays per request, and a pass's
        # symbolic cuDNN choice is no region operand (docs/perf-notes.md, attempt 53).
        call = layer_call(self.layer_regions and _one_token(idx))
        for layer in self.model.layers:
            x = call(layer, x, cos, sin, reads, input_pos)
        if reads.own and self.first_pass_last_logits:
            x = x[:, -1:]
        elif logit_rows is not None:
            x = x.index_select(1, logit_rows)
        norm = getattr(self.model, self.FINAL_NORM)
        if self.row_gemv and x.shape[0] == 1 and x.shape[1] == 1:
            return row_linear(self.lm_head, x, norm=norm).float()
        return self.lm_head(norm(x)).float()


def _one_token(idx: torch.Tensor) -> bool:
    """Whether the step has one token per row for every input it takes: a static 1, not
    a dynamic count that holds 1 now (no guard added to the step)."""
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    return statically_known_true(idx.shape[1] == 1)


def _run_layer(layer: nn.Module, x, cos, sin, reads: Reads, input_pos) -> torch.Tensor:
    return layer(x, cos, sin, reads, input_pos)


def _run_layer_flat(
    layer: nn.Module, x, cos, sin, input_pos, mask, lo, bias, own, cudnn, prefetch=0
):  # fmt: skip
    """_run_layer with ``reads`` taken apart: Dynamo reuses a region's trace only for
    inputs of tensors, ints, bools and modules, not a dataclass."""
    reads = Reads(mask=mask, lo=lo, own=own, cudnn=cudnn, bias=bias, prefetch=prefetch)
    return layer(x, cos, sin, reads, input_pos)


# torch.compile traces and lowers a nested compile region once and calls the compiled
# region again wherever the same code meets inputs of the same metadata: every layer
# of a model, which otherwise costs Inductor one copy of the block's graph per layer
# (docs/perf-notes.md, attempt 53). Eager calls it as a plain function.
_LAYER_REGION = torch.compiler.nested_compile_region(_run_layer_flat)


def _run_layer_region(layer: nn.Module, x, cos, sin, reads: Reads, input_pos) -> torch.Tensor:
    r = reads
    return _LAYER_REGION(
        layer, x, cos, sin, input_pos, r.mask, r.lo, r.bias, r.own, r.cudnn, r.prefetch
    )


def layer_call(regions: bool):
    """How forward calls each layer: as one nested compile region, or plainly."""
    return _run_layer_region if regions else _run_layer
