"""The checkpoint benchmarks/checkpoint_folder.py measures, and the loaders it compares.

- ``write_checkpoint``: random bf16 weights (init_random's scales, so logits are O(1))
  laid out as transformers saves a sharded checkpoint: ``model-0000i-of-0000n``
  shards filled in order up to total/4 each, ``model.safetensors.index.json`` and a
  ``config.json`` (model_type llama) whose derived recipe has the base recipe's
  architecture. A folder that already holds the same one is reused.
- ``loader_sweep``: seconds and GB/s of safetensors' ``safe_open`` per tensor (what
  acache did before) against ``load_checkpoint`` at several threads x chunk sizes;
  ``same_as_safe_open``: whether the two give bit-identical tensors.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from pathlib import Path
from typing import Any

SHARDS = 4
MARKER = "acache-benchmark.json"  # what wrote the folder: reused when it matches


# ----------------------------------------------------------------- checkpoint --


def base_recipe(tiny: bool, layers: int | None = None) -> Any:
    from artifactcache.recipes import load_recipe

    r = load_recipe("tiny-llama" if tiny else "llama-7b")
    if layers is not None:
        r = dataclasses.replace(r, model=dataclasses.replace(r.model, n_layers=layers))
    return r


def hf_config(recipe: Any) -> dict[str, Any]:
    """config.json as transformers' LlamaConfig saves it, for the recipe's dims."""
    m = recipe.model
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": m.dim,
        "intermediate_size": m.intermediate_size,
        "num_hidden_layers": m.n_layers,
        "num_attention_heads": m.n_heads,
        "num_key_value_heads": m.n_kv_heads,
        "vocab_size": m.vocab_size,
        "rms_norm_eps": m.norm_eps,
        "rope_theta": m.rope_theta,
        "rope_scaling": None,
        "max_position_embeddings": m.max_position_embeddings,
        "tie_word_embeddings": m.tie_embeddings,
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "torch_dtype": "bfloat16",
        "bos_token_id": 1,
        "eos_token_id": 2,
    }


def tensor_shapes(recipe: Any) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every tensor the checkpoint holds: acache's names are HF's."""
    import torch

    from artifactcache.models import architecture

    with torch.device("meta"):
        model = architecture(recipe)
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    if recipe.model.tie_embeddings:
        shapes.pop("lm_head.weight")
    return shapes


def shard_plan(shapes: dict[str, tuple[int, ...]], shards: int) -> list[list[str]]:
    """Tensors in order, filled into shards of about total/shards elements each, as
    transformers' max_shard_size does (a larger tensor gets a shard of its own)."""
    target = math.ceil(sum(math.prod(s) for s in shapes.values()) / shards)
    out: list[list[str]] = [[]]
    size = 0
    for name, s in shapes.items():
        n = math.prod(s)
        if out[-1] and size + n > target and len(out) < shards:
            out.append([])
            size = 0
        out[-1].append(name)
        size += n
    return out


def write_checkpoint(folder: Path, recipe: Any, *, seed: int = 0) -> dict[str, Any]:
    """Random bf16 weights (init_random's scales: O(1) logits) as HF-named shards."""
    import torch
    from safetensors.torch import save_file

    from artifactcache.sources.checkpoint import INDEX_NAME

    config = hf_config(recipe)
    marker = {"config": config, "seed": seed, "shards": SHARDS}
    shapes = tensor_shapes(recipe)
    plan = shard_plan(shapes, SHARDS)
    names = [f"model-{i + 1:05d}-of-{len(plan):05d}.safetensors" for i in range(len(plan))]
    mark = folder / MARKER
    if mark.is_file() and json.loads(mark.read_text()) == marker:
        if all((folder / n).is_file() for n in names):
            return {"reused": True, "seconds": 0.0}
    folder.mkdir(parents=True, exist_ok=True)
    mark.unlink(missing_ok=True)
    t0 = time.perf_counter()
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    gen = torch.Generator(device=dev).manual_seed(seed)
    weight_map: dict[str, str] = {}
    total = 0
    for fname, part in zip(names, plan, strict=True):
        tensors = {}
        for name in part:
            shape = shapes[name]
            t = torch.empty(shape, dtype=torch.bfloat16, device=dev)
            if len(shape) == 1:
                t.fill_(1.0)  # norm scales
            else:
                std = 1.0 if name.endswith("embed_tokens.weight") else shape[1] ** -0.5
                t.normal_(0.0, std, generator=gen)
            tensors[name] = t.cpu()
            total += t.numel() * 2
            weight_map[name] = fname
        save_file(tensors, str(folder / fname), metadata={"format": "pt"})
        del tensors
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (folder / INDEX_NAME).write_text(json.dumps(index, indent=2) + "\n")
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    mark.write_text(json.dumps(marker))
    return {"reused": False, "seconds": round(time.perf_counter() - t0, 2), "bytes": total}


def checkpoint_bytes(folder: Path) -> int:
    """The bytes of tensor data the loader reads (headers left out)."""
    from artifactcache.models.safetensors_io import read_header
    from artifactcache.sources.checkpoint import checkpoint_files

    return sum(t.nbytes for f in checkpoint_files(folder).shards for t in read_header(f))


def warm_page_cache(folder: Path) -> dict[str, float]:
    """Read every shard once, so what follows reads from the page cache."""
    from artifactcache.sources.checkpoint import checkpoint_files

    t0, n = time.perf_counter(), 0
    buf = bytearray(64 << 20)
    for f in checkpoint_files(folder).shards:
        with open(f, "rb", buffering=0) as fh:
            while k := fh.readinto(buf):
                n += k
    dt = time.perf_counter() - t0
    return {"bytes": n, "seconds": round(dt, 3), "gbps": round(n / dt / 1e9, 2)}


# ------------------------------------------------------------------- loaders --


def _old_load(recipe: Any, folder: Path, dev: Any, dtype: Any) -> Any:
    """What load_checkpoint did before the threaded reader: safe_open per tensor."""
    import torch
    from safetensors import safe_open

    from artifactcache.models import architecture
    from artifactcache.sources.checkpoint import checkpoint_files

    with torch.device("meta"):
        model = architecture(recipe).to(dtype)
    state = {}
    for f in checkpoint_files(folder).shards:
        with safe_open(str(f), framework="pt", device=str(dev)) as h:
            for name in h.keys():
                state[name] = h.get_tensor(name).to(dtype)
    model.load_state_dict(state, assign=True, strict=True)
    return model


def _new_load(recipe: Any, folder: Path, dev: Any, dtype: Any, threads: int, chunk: int) -> Any:
    import torch

    from artifactcache.models import architecture
    from artifactcache.models.weights import load_checkpoint

    with torch.device("meta"):
        model = architecture(recipe).to(dtype)
    load_checkpoint(model, folder, dev, threads=threads, chunk_bytes=chunk)
    return model


def parse_sweep(text: str) -> list[tuple[int, int]]:
    """'8x16,4x16' -> [(8 threads, 16 MiB), (4, 16)]."""
    out = []
    for item in text.split(","):
        threads, _, mib = item.strip().partition("x")
        out.append((int(threads), int(mib)))
    return out


def _touch(model: Any) -> None:
    """Read one byte of every page of every weight: a CPU map is only read when used."""
    import torch

    for p in model.parameters():
        int(p.detach().reshape(-1).view(torch.uint8)[::4096].sum())


def loader_sweep(
    recipe: Any, folder: Path, device: str, configs: list[tuple[int, int]], repeats: int
) -> list[dict[str, Any]]:
    """Seconds (device synchronized) and GB/s of each loader, ``repeats`` times each.

    On CPU a load maps the files, so its rows include touching every page (what the
    first forward pass pays), and the GPU reader is timed on host destinations
    allocated once: its first repeat also faults those pages in, the later ones not.
    """
    import torch

    from artifactcache.models.safetensors_io import read_header, read_into
    from artifactcache.sources.checkpoint import checkpoint_files

    dev = torch.device(device)
    cuda = dev.type == "cuda"
    dtype = torch.bfloat16
    nbytes = checkpoint_bytes(folder)
    if cuda:
        torch.zeros(1, device=dev)  # the context is not the loader's cost

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize(dev)

    def timed(load: Any) -> float:
        sync()
        t0 = time.perf_counter()
        model = load()
        if model is not None and not cuda:
            _touch(model)
        sync()
        dt = time.perf_counter() - t0
        del model
        if cuda:
            torch.cuda.empty_cache()
        return dt

    candidates: list[tuple[str, Any]] = [
        ("safe_open per tensor (before)", lambda: _old_load(recipe, folder, dev, dtype))
    ]
    if cuda:
        for threads, mib in configs:
            candidates.append(
                (
                    f"load_checkpoint: {threads} threads x {mib} MiB",
                    lambda t=threads, m=mib: _new_load(recipe, folder, dev, dtype, t, m << 20),
                )
            )
    else:
        candidates.append(
            (
                "load_checkpoint (maps the files)",
                lambda: _new_load(recipe, folder, dev, dtype, 1, 1 << 20),
            )
        )
        stored = [t for f in checkpoint_files(folder).shards for t in read_header(f)]
        pairs = [(t, torch.empty(t.shape, dtype=dtype)) for t in stored]  # shared by the rows
        for threads, mib in configs:
            candidates.append(
                (
                    f"GPU reader into host memory: {threads} threads x {mib} MiB",
                    lambda t=threads, m=mib, p=pairs: read_into(p, threads=t, chunk_bytes=m << 20),
                )
            )
    rows = []
    for label, load in candidates:
        try:
            secs = [timed(load) for _ in range(repeats)]
        except Exception as e:  # a loader that fails here is a finding, not the end of the run
            rows.append({"loader": label, "error": f"{type(e).__name__}: {e}"[:300]})
            continue
        rows.append(
            {
                "loader": label,
                "seconds": [round(s, 3) for s in secs],
                "gbps": [round(nbytes / s / 1e9, 2) for s in secs],
                "best_gbps": round(nbytes / min(secs) / 1e9, 2),
            }
        )
    return rows


def same_as_safe_open(recipe: Any, folder: Path, device: str) -> dict[str, Any]:
    """Whether load_checkpoint's tensors are bit-identical to safe_open's, on ``device``."""
    import torch

    from artifactcache.models.safetensors_io import resolve_chunk_bytes, resolve_threads

    dev, dtype = torch.device(device), torch.bfloat16
    want = dict(_old_load(recipe, folder, dev, dtype).state_dict())
    got = _new_load(recipe, folder, dev, dtype, resolve_threads(None), resolve_chunk_bytes(None))
    differ = [
        name
        for name, t in got.state_dict().items()
        if not torch.equal(
            t.reshape(-1).view(torch.uint8), want[name].reshape(-1).view(torch.uint8)
        )
    ]
    n = len(want)
    del want, got
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    return {"identical": not differ, "differing": differ[:5], "tensors": n}
