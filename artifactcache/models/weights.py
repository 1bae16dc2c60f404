"""Weights: a Hugging Face checkpoint (folder or .safetensors file) or seeded random init.

Which files of a folder are read is sources/checkpoint.py's rule, shared with the
weights digest, so the key covers exactly what is loaded.

Checkpoints are read with safetensors' ``safe_open``, which memory-maps the
file and materializes each tensor straight on the target device; the model is
built on the ``meta`` device first, so no host copy of the weights is ever made.
Any mismatch with the recipe (missing tensor, unknown tensor, wrong shape,
non-float dtype) is a one-line :class:`WeightsError` naming the tensor.
"""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path

import torch
from torch import nn

from ..errors import WeightsError
from ..sources.checkpoint import checkpoint_files

# Tensors some transformers versions save that carry nothing we need.
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


def load_checkpoint(
    model: nn.Module, path: Path, device: torch.device, dtype: torch.dtype, tied: bool
) -> None:
    """Fill a meta-device model from safetensors files, checking every tensor."""
    from safetensors import safe_open

    expected = {k: v for k, v in model.state_dict().items()}
    state: dict[str, torch.Tensor] = {}
    for f in checkpoint_files(path).shards:
        try:
            handle = safe_open(str(f), framework="pt", device=str(device))
        except Exception as e:  # safetensors raises its own error types for corrupt headers
            raise WeightsError(f"{f}: not a readable safetensors file ({e})") from None
        with handle:
            for name in handle.keys():
                if name.endswith(_IGNORED_SUFFIXES):
                    continue
                if name not in expected:
                    raise WeightsError(
                        f"{f}: unexpected tensor '{name}': "
                        "the checkpoint does not match this recipe"
                    )
                t = handle.get_tensor(name)
                want = expected[name]
                if tuple(t.shape) != tuple(want.shape):
                    raise WeightsError(
                        f"{f}: tensor '{name}' has shape {tuple(t.shape)}, "
                        f"the recipe needs {tuple(want.shape)}"
                    )
                if not t.is_floating_point():
                    raise WeightsError(
                        f"{f}: tensor '{name}' has dtype {t.dtype}, expected a float dtype"
                    )
                state[name] = t.to(dtype)
    if tied and "lm_head.weight" not in state and "model.embed_tokens.weight" in state:
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    missing = [k for k in expected if k not in state]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise WeightsError(
            f"{path}: tensor '{missing[0]}' is missing{more}: "
            "the checkpoint does not match this recipe"
        )
    model.load_state_dict(state, assign=True, strict=True)


def materialize(model: nn.Module, device: torch.device) -> None:
    """Give a meta-device model uninitialized storage on ``device``, in place.

    What ``model.to_empty`` does, without its cost: to_empty calls
    ``torch.empty_like`` on meta tensors, which runs a Python reference that imports
    sympy (~480 modules, 0.5-0.7 s) into a process that only runs a model.
    ``torch.empty`` with explicit shape/dtype/device stays in C++. Tied parameters
    (the same Parameter in two modules) stay tied.
    """
    made: dict[int, torch.Tensor] = {}
    originals: list[torch.Tensor] = []  # alive until we are done, so no id() is reused

    def fresh(t: torch.Tensor) -> torch.Tensor:
        if id(t) not in made:
            originals.append(t)
            new = torch.empty(t.shape, dtype=t.dtype, device=device)
            if isinstance(t, nn.Parameter):
                new = nn.Parameter(new, requires_grad=t.requires_grad)
            made[id(t)] = new
        return made[id(t)]

    for mod in model.modules():
        for tensors in (mod._parameters, mod._buffers):
            for name, t in tensors.items():
                if t is not None:
                    tensors[name] = fresh(t)


@torch.no_grad()
def init_random(model: nn.Module, seed: int, device: torch.device, dtype: torch.dtype) -> None:
    """Seeded init on the target device; deterministic for a (seed, device type).

    Linear weights get std 1/sqrt(fan_in) and embeddings std 1, so activations
    and logits stay O(1): greedy decoding then has clear winners, which keeps
    token-for-token comparisons between backends meaningful. An embedding tied to
    the LM head (tie_embeddings) is also the head's weight, so it gets the head's
    1/sqrt(dim): std 1 there would make the logits sqrt(dim) times larger.
    """
    materialize(model, device)  # the model is already in `dtype` on meta: no fp32 detour
    gen = torch.Generator(device=device).manual_seed(seed)
    uses = Counter(id(p) for _, p in model.named_parameters(remove_duplicate=False))
    for name, p in model.named_parameters():
        if name.endswith("embed_tokens.weight") and uses[id(p)] == 1:
            p.normal_(0.0, 1.0, generator=gen)
        elif p.ndim == 2:
            p.normal_(0.0, 1.0 / math.sqrt(p.shape[1]), generator=gen)
        elif name.endswith("bias"):
            p.normal_(0.0, 0.02, generator=gen)
        else:  # norm scales
            p.fill_(1.0)
