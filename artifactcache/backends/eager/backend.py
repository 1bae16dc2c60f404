"""eager: the baseline, plain PyTorch with no compilation.

There is nothing to compile, but the entry still exists so every backend goes
through the same build -> store -> load path (and `acache ls` shows the
baseline). build() builds the model once, which validates the weights against
the recipe before anything is cached, and writes a small JSON record.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from ...choices import BuildChoices
from ...devices import device_type, is_cuda
from ...errors import BackendError
from ...keys import toolchain_fingerprint
from ..base import BuildContext
from ..shared.model_options import (
    backend_extra,
    check_model_options,
    check_recipe_options,
    model_factors,
)
from ..shared.runner import (
    StepRunner,
    build_model_for,
    check_device_dtype,
    device_of,
)
from ..shared.steps import (
    kv_buckets_of,
)

RECORD = "eager.json"
# Bumped when what build() writes or what load() expects changes.
FORMAT = 1


class EagerBackend:
    name = "eager"
    weights_external = False

    def available(self, opts: BuildChoices) -> tuple[bool, str]:
        if is_cuda(opts.device):
            import torch

            if not torch.cuda.is_available():
                return False, "torch sees no CUDA GPU; use --device cpu"
        return True, ""

    def check_options(self, opts: BuildChoices) -> None:
        check_device_dtype(opts)
        if opts.mode not in (None, "default"):
            raise BackendError(f"backend 'eager' has no modes (got --mode {opts.mode}): drop it")
        if own := backend_extra(opts):
            raise BackendError(
                "backend 'eager' takes no extra options but fuse_projections, "
                f"split_kv_decode, split_kv_rope, row_gemv, cudnn_prefill and attention_prefetch "
                f"(got {sorted(own)})"
            )
        check_model_options(self.name, opts)

    def check_recipe(self, recipe: Any, opts: BuildChoices) -> None:
        check_recipe_options(self.name, recipe, opts)

    def factors(self, recipe: Any, opts: BuildChoices) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "dtype": opts.dtype,
            "device": device_type(opts.device),
            **model_factors(self.name, recipe, opts),
        }

    def toolchain(self, opts: BuildChoices) -> dict[str, Any]:
        return toolchain_fingerprint(("torch",))

    def build(self, ctx: BuildContext, workdir: Path) -> dict[str, Any]:
        dev = device_of(ctx.opts)
        model = build_model_for(ctx, dev, self.name)  # a WeightsError before anything is cached
        n_params = sum(p.numel() for p in model.parameters())
        # int8 weights (--quant) are buffers; the other buffers are the caches and scales.
        n_params += sum(b.numel() for n, b in model.named_buffers() if n.endswith(".weight"))
        record = {
            "backend": self.name,
            "format": FORMAT,
            "weights": ctx.weights.describe(),
            "parameters": n_params,
        }
        (workdir / RECORD).write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
        return {"format": FORMAT, "parameters": n_params}

    def load(self, ctx: BuildContext, entry_dir: Path, meta: dict[str, Any]) -> StepRunner:
        if not (entry_dir / RECORD).is_file():
            raise BackendError(f"entry {entry_dir} has no {RECORD}: rebuild it with --force")
        dev = device_of(ctx.opts)
        model = build_model_for(ctx, dev, self.name)
        ctx.phases["artifact_ready"] = time.perf_counter()
        # The model is every step: its forward picks the path from the inputs it is given.
        return StepRunner(
            ctx.recipe, model, model, dev, fresh=model, keepalive=model, kv_len_hint=True,
            kv_buckets=kv_buckets_of(model),
        )  # fmt: skip


BACKEND = EagerBackend()
