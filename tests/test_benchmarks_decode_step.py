"""benchmarks/decode_step.py's profile child, run on the CPU with a stand-in runner."""

from __future__ import annotations

import contextlib
import io
import json
import sys

import pytest
import torch
from _bench_scripts import load_script

import artifactcache


@pytest.mark.parametrize(
    ("batch", "max_seq_len", "dtype"), [(1, 0, "bf16"), (8, 0, "bf16"), (8, 128, "fp16")]
)
def test_the_profile_child_counts_the_bytes_of_the_rows_it_profiles(
    batch, max_seq_len, dtype, monkeypatch
):
    """A batched variant's profile counts its rows' KV against the recipe built for that
    batch (it refused a batch over the recipe's max_batch of 1 on the GPU, 2026-12-06)."""
    from artifactcache.measure.bench import bytes_per_token
    from artifactcache.recipes import load_recipe

    ds = load_script("decode_step")
    calls, loaded = [], []

    class Runner:
        def generate(self, prompt, new):
            calls.append((1, new))

        def generate_batch(self, prompts, new):
            calls.append((len(prompts), new))

    class Profile(contextlib.nullcontext):  # the CPU build of torch profiles no CUDA
        def __init__(self, **kw):
            super().__init__(self)

        def events(self):
            return []

    monkeypatch.setattr(artifactcache, "load", lambda *a, **k: loaded.append(k) or Runner())
    monkeypatch.setattr(torch.profiler, "profile", Profile)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    argv = ["child", "tiny-llama", "inductor", "", "{}", "", "/nowhere", "4", str(batch),
            str(max_seq_len), dtype]  # fmt: skip
    monkeypatch.setattr(sys, "argv", argv)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(ds.PROFILE_CHILD, "profile_child", "exec"), {"__name__": "__main__"})
    report = json.loads(out.getvalue().strip().splitlines()[-1])
    shapes = dict(max_batch=batch if batch > 1 else None, max_seq_len=max_seq_len or None)
    (kw,) = loaded  # the artifact loaded is the one built for these shapes...
    assert {k: kw[k] for k in shapes} == shapes and kw["dtype"] == dtype
    rec = load_recipe("tiny-llama").with_shapes(**shapes)  # ...and its bytes are counted
    assert report["bytes"] == bytes_per_token(rec, dtype, batch=batch)
    assert calls and {rows for rows, _ in calls} == {batch}
