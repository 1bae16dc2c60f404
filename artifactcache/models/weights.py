"""Weights: a Hugging Face checkpoint (folder or .safetensors file) or seeded random init.

Which files of a folder are read is sources/checkpoint.py's rule, shared with the
weights digest, so the key covers exactly what is loaded.

A checkpoint is checked from its headers alone (missing tensor, unknown tensor,
wrong shape, non-float dtype: a one-line :class:`WeightsError` naming the tensor),
before any memory is allocated. Then:

- on CUDA, the meta-device model gets its storage on the GPU and safetensors_io.py
  reads the bytes into it on several threads through pinned staging buffers;
- on CPU, each tensor is safetensors' memory map of the file (``safe_open``), so
  loading copies nothing and the weights share the page cache. Reading them into
  fresh memory instead ran at 0.4 GB/s on a 2-core VM, where every destination page
  is faulted in and zeroed first, against 4-10 GB/s for the map including the first
  touch of every page.

A checkpoint stored in another float dtype than the model's is converted tensor by
tensor; no whole-model host copy is made.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

import torch
from torch import nn

from ..errors import WeightsError
from ..sources.checkpoint import checkpoint_files
from .safetensors_io import (
    StoredTensor,
    read_header,
    read_into,
    resolve_chunk_bytes,
    resolve_threads,
)

# Tensors some transformers versions save that carry nothing we need.
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


def load_checkpoint(
    model: nn.Module,
    path: Path,
    device: torch.device,
    *,
    threads: int | None = None,
    chunk_bytes: int | None = None,
    stamps: dict[str, float] | None = None,
) -> None:
    """Fill a meta-device model from safetensors files, checking every tensor first.

    ``threads`` and ``chunk_bytes`` (default: $ACACHE_LOAD_THREADS, else min(8, CPUs);
    $ACACHE_LOAD_CHUNK_MB, else 16 MiB) tune the GPU reader; they never change the
    result. Tied parameters (one Parameter under two names) are filled once and stay
    one Parameter: a tied LM head saved beside its embedding is checked, not read.
    ``stamps`` gets ``weights_checked`` (headers read and checked) and, on the GPU,
    ``weights_allocated`` (storage made; the read follows), on the perf_counter clock.
    """
    stamps = {} if stamps is None else stamps
    threads = resolve_threads(threads)
    chunk_bytes = resolve_chunk_bytes(chunk_bytes)
    expected = _expected(model)
    sources, groups = _checked_sources(expected, path)
    stamps["weights_checked"] = time.perf_counter()
    if maps_files(device):
        _map_on_cpu(model, sources, expected)
    else:
        materialize(model, device)
        stamps["weights_allocated"] = time.perf_counter()
        dests = _tensors(model, persistent=sources)
        with torch.no_grad():
            read_into(
                [(src, dests[name]) for name, src in sources.items()],
                threads=threads,
                chunk_bytes=chunk_bytes,
            )
    for names in groups.values():
        _tie(model, names)


def check_checkpoint(model: nn.Module, path: Path) -> None:
    """The checks load_checkpoint makes first, alone: every tensor of ``path``'s headers
    against ``model`` (on the meta device), a one-line WeightsError for the first misfit.
    Reads a few KiB a shard; the CLI calls it before it opens the cache."""
    _checked_sources(_expected(model), path)


def _expected(model: nn.Module) -> dict[str, torch.Tensor]:
    """What a checkpoint must hold: the model's state, by name (on meta: names, shapes)."""
    return _tensors(model, persistent=model.state_dict().keys())


def _checked_sources(
    expected: dict[str, torch.Tensor], path: Path
) -> tuple[dict[str, StoredTensor], dict[int, list[str]]]:
    """({first name of each tied group: its stored tensor}, {id: the group's names}),
    once every header tensor fits ``expected`` and none is missing."""
    found: dict[str, StoredTensor] = {}
    for f in checkpoint_files(path).shards:
        for t in read_header(f):
            if t.name.endswith(_IGNORED_SUFFIXES):
                continue
            _check(t, expected, found)
            found[t.name] = t
    # Names that share one tensor (tied embeddings), each group filled from one source.
    groups: dict[int, list[str]] = {}
    for name, t in expected.items():
        groups.setdefault(id(t), []).append(name)
    missing = [k for k in expected if not any(n in found for n in groups[id(expected[k])])]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise WeightsError(
            f"{path}: tensor '{missing[0]}' is missing{more}: "
            "the checkpoint does not match this recipe"
        )
    sources = {names[0]: next(found[n] for n in names if n in found) for names in groups.values()}
    return sources, groups


def maps_files(device: torch.device) -> bool:
    """Whether a load on ``device`` maps the files (CPU) or reads them (the GPU reader)."""
    return device.type == "cpu"


def _map_on_cpu(
    model: nn.Module, sources: dict[str, StoredTensor], expected: dict[str, torch.Tensor]
) -> None:
    """Assign each parameter safetensors' memory-mapped tensor (converted if need be)."""
    from safetensors import safe_open

    by_file: dict[Path, list[str]] = {}
    for name, src in sources.items():
        by_file.setdefault(src.path, []).append(name)
    state: dict[str, torch.Tensor] = {}
    for f, names in by_file.items():
        try:
            handle = safe_open(str(f), framework="pt", device="cpu")
        except Exception as e:  # safetensors raises its own error types for corrupt files
            raise WeightsError(f"{f}: not a readable safetensors file ({e})") from None
        with handle:
            for name in names:
                state[name] = handle.get_tensor(sources[name].name).to(expected[name].dtype)
    model.load_state_dict(state, assign=True, strict=False)


def _tie(model: nn.Module, names: list[str]) -> None:
    """Make every name of a tied group the first name's Parameter again."""
    first = model.get_parameter(names[0]) if len(names) > 1 else None
    for name in names[1:]:
        owner, _, attr = name.rpartition(".")
        setattr(model.get_submodule(owner), attr, first)


def _tensors(model: nn.Module, persistent: Iterable[str]) -> dict[str, torch.Tensor]:
    """The model's parameters and persistent buffers by name; tied ones are one object."""
    every = dict(model.named_parameters(remove_duplicate=False))
    every.update(model.named_buffers(remove_duplicate=False))
    return {name: every[name] for name in persistent}


def _check(
    t: StoredTensor, expected: dict[str, torch.Tensor], found: dict[str, StoredTensor]
) -> None:
    """The refusals, in the order a user fixes them: wrong model, then wrong tensor."""
    if t.name not in expected:
        raise WeightsError(
            f"{t.path}: unexpected tensor '{t.name}': the checkpoint does not match this recipe"
        )
    if t.name in found:
        raise WeightsError(
            f"{t.path}: tensor '{t.name}' is also in {found[t.name].path}: a checkpoint holds "
            "each tensor once"
        )
    want = tuple(expected[t.name].shape)
    if t.shape != want:
        raise WeightsError(
            f"{t.path}: tensor '{t.name}' has shape {t.shape}, the recipe needs {want}"
        )
    if not t.is_float:
        raise WeightsError(
            f"{t.path}: tensor '{t.name}' has dtype {t.describe_dtype()}, expected a float dtype"
        )


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
