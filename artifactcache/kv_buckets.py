"""The KV-length buckets decode reads by, as plain arithmetic (no torch): the model
(models/common.py), the runner, the exports and the CLI's option checks share it.

A step given ``kv_pos`` of length L reads cache positions 0 .. L-1; decode passes the
filled length rounded up to a bucket, so one compiled step (L dynamic) serves every
bucket. A split-KV model (``bucketed=False``) is given the whole cache instead.
"""

from __future__ import annotations

# The smallest bucket, and how many buckets each doubling of the length is split into
# past 8 x KV_BUCKET_MIN. Fixed steps of 256 would read at most 255 extra positions
# but need a CUDA graph per 256 positions (128 of them at 32k); powers of two would
# need few graphs but read up to twice the filled KV. Eight per doubling bounds
# both: steps of 256 up to 4096, then 512 up to 8192, and so on, so a step reads at
# most 1/8 more positions than are filled past 2048, and a 32k context has 40
# buckets (inductor's CUDA-graph trees warn past 50 distinct shapes).
KV_BUCKET_MIN = 256
KV_BUCKETS_PER_DOUBLING = 8


def kv_bucket(filled: int, max_seq_len: int, bucketed: bool = True) -> int:
    """How many cache positions a step attending to ``filled`` positions reads.

    ``bucketed=False``: a model whose decode attention reads only the filled part
    itself (the split-KV kernel, models/decode_attention.py) is given the whole cache.
    """
    if not bucketed:
        return max_seq_len
    below = 1 << max((filled - 1).bit_length() - 1, 0)  # the power of two under filled
    granule = max(KV_BUCKET_MIN, below // KV_BUCKETS_PER_DOUBLING)
    return min(-(-filled // granule) * granule, max_seq_len)


def kv_buckets(max_seq_len: int, bucketed: bool = True) -> list[int]:
    """Every length :func:`kv_bucket` returns for a cache of ``max_seq_len``, ascending."""
    out = [kv_bucket(1, max_seq_len, bucketed)]
    while out[-1] < max_seq_len:
        out.append(kv_bucket(out[-1] + 1, max_seq_len))
    return out


def kv_len_range(max_seq_len: int, bucketed: bool = True) -> tuple[int, int] | None:
    """(shortest, longest) read of decode's dynamic length; None with one bucket only
    (max_seq_len <= KV_BUCKET_MIN, or not ``bucketed``), where decode is given the
    whole cache, statically."""
    lo = kv_bucket(1, max_seq_len, bucketed)
    return (lo, max_seq_len) if lo < max_seq_len else None


def cache_slots(max_seq_len: int, bucketed: bool = True) -> int:
    """Positions the KV buffers hold: one spare past max_seq_len when the read varies.

    With the spare slot the view ``k_cache[:, :, :L]`` is non-contiguous for every L
    the steps pass (L <= max_seq_len). Without it, L == max_seq_len would make the
    view contiguous, and torch.export and Dynamo guard on that (SDPA's meta checks
    contiguity), so a dynamic L could not reach the last bucket. It is never written.
    """
    return max_seq_len + 1 if kv_len_range(max_seq_len, bucketed) else max_seq_len
