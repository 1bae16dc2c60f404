"""Cache keys: factors -> canonical JSON -> sha256.

A key names everything that shapes an artifact. The factors are a plain JSON
object with these top-level fields (see docs/cache.md):

``schema``     KEY_SCHEMA, bumped when the meaning of any factor changes;
``recipe``     the recipe's normalized config (``Recipe.normalized()``);
``weights``    ``"blake3:<hex>"`` of the checkpoint, or ``"random:<seed>"``;
``backend``    ``{"name": ..., "options": {...}}`` (dtype, mode, shapes, flags);
``toolchain``  versions of python / torch / triton / onnx / ... that apply;
``hardware``   device type, GPU name, compute capability, driver, CPU arch/ISA;
``acache``     acache's version and a digest of its source that shapes the artifact
               (``code_factors.backend_sources``), filled in by ``make_factors``.

Compiler settings that change generated code (Inductor config and environment,
fp32 matmul precision, the C++ compiler) are backend options: see
``code_factors.codegen_factors`` and each backend's ``factors()``.

The key itself is the format in ``store/keyformat.py``: ``compute_key`` hashes
the canonical JSON of that object (floats as their ``repr``, dict order never
matters). This module must not import torch at module level: the CLI's cache
commands stay torch-free.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import platform
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from .code_factors import acache_factors
from .devices import device_index, device_type
from .store._fs import read_memo, stat_sig, write_memo
from .store.keyformat import canonical_value

KEY_SCHEMA = 3


def make_factors(
    *,
    recipe: Mapping[str, Any],
    weights: str,
    backend: str,
    options: Mapping[str, Any],
    toolchain: Mapping[str, Any],
    hardware: Mapping[str, Any],
) -> dict[str, Any]:
    """Assemble the factor object in its one documented shape.

    The ``acache`` factor comes from ``backend`` through backend_sources, so no
    caller can leave acache's own code out of a key.
    """
    return {
        "schema": KEY_SCHEMA,
        "recipe": dict(recipe),
        "weights": weights,
        "backend": {"name": backend, "options": dict(options)},
        "toolchain": dict(toolchain),
        "hardware": dict(hardware),
        "acache": acache_factors(backend),
    }


def architecture_factors(factors: Mapping[str, Any]) -> dict[str, Any]:
    """The same factors without the weights: one build serves every fine-tune."""
    arch = dict(factors)
    arch["weights"] = "stripped"
    return arch


# --------------------------------------------------------------------- diff --


@dataclass(frozen=True)
class FactorDiff:
    path: str  # dotted path, e.g. "backend.options.dtype"
    a: Any
    b: Any


_MISSING = "<absent>"


def diff_factors(a: Mapping[str, Any], b: Mapping[str, Any], prefix: str = "") -> list[FactorDiff]:
    """Name every leaf factor that differs between two factor objects."""
    out: list[FactorDiff] = []
    for k in sorted(set(a) | set(b)):
        path = f"{prefix}{k}"
        va, vb = a.get(k, _MISSING), b.get(k, _MISSING)
        if isinstance(va, Mapping) and isinstance(vb, Mapping):
            out.extend(diff_factors(va, vb, prefix=path + "."))
        elif canonical_value(va) != canonical_value(vb):
            out.append(FactorDiff(path, va, vb))
    return out


def flatten(factors: Mapping[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    """(dotted path, leaf value) pairs, sorted: what `acache key --explain` prints."""
    rows: list[tuple[str, Any]] = []
    for k in sorted(factors):
        v = factors[k]
        if isinstance(v, Mapping) and v:
            rows.extend(flatten(v, prefix=f"{prefix}{k}."))
        else:
            rows.append((f"{prefix}{k}", v))
    return rows


# ------------------------------------------------------------ weights digest --

_MEMO_NAME = "weights-digests.json"
_memo_lock = threading.Lock()
_CHUNK = 8 << 20


def _hash_file(path: Path) -> str:
    import blake3  # fast, multi-threaded; a 13 GB checkpoint hashes at disk speed

    h = blake3.blake3(max_threads=blake3.blake3.AUTO)
    with open(path, "rb", buffering=0) as f:
        buf = bytearray(_CHUNK)
        view = memoryview(buf)
        while n := f.readinto(buf):
            h.update(view[:n])
    return h.hexdigest()


def _weight_files(path: Path) -> list[Path]:
    """The files the loader reads (sources/checkpoint.py's rule): shards and their index."""
    from .sources.checkpoint import checkpoint_files

    return checkpoint_files(path).hashed


def weights_digest(path: str | os.PathLike[str], memo_dir: Path | None = None) -> str:
    """``blake3:<hex>`` over a checkpoint file or folder, memoized on stat.

    The memo maps the resolved path and the stat signature (``store._fs.stat_sig``:
    size, mtime_ns, ctime_ns, inode, device) of each file to its digest, so a repeat
    lookup on a 13 GB checkpoint costs a few ``stat`` calls. ctime is what catches a
    rewrite whose mtime was put back with ``os.utime``: no user-space call can set it
    (git and ccache rely on the same). A file whose stat changed while it was hashed
    is not memoized.
    """
    from .errors import WeightsError

    root = Path(path)
    if not root.exists():
        raise WeightsError(f"weights not found: {root} (pass a safetensors file or HF folder)")
    files = _weight_files(root)  # raises WeightsError when there are none
    memo_path = (memo_dir / _MEMO_NAME) if memo_dir else None
    # Bounded, and a FIFO or a symlink there is refused: absent or damaged, only a lost
    # speed-up.
    memo: dict[str, Any] = read_memo(memo_path) if memo_path else {}
    outer = hashlib.sha256()
    changed = False
    for f in files:
        st = f.stat()
        memo_key = "|".join([str(f.resolve()), *map(str, stat_sig(st))])
        digest = memo.get(memo_key)
        if digest is None:
            digest = _hash_file(f)
            # Changed while it was read: the digest is not memoized (the next call hashes
            # it again; this one's key says the file was not a stable input).
            if stat_sig(f.stat()) == stat_sig(st):
                memo[memo_key] = digest
                changed = True
        outer.update(f"{f.name}\0{st.st_size}\0{digest}\n".encode())
    if changed and memo_path:
        with _memo_lock, contextlib.suppress(OSError):
            memo_path.parent.mkdir(parents=True, exist_ok=True)
            write_memo(memo_path, memo)  # read-only cache: the digest is still right
    # One file of tensors is the same weights whether named by its folder or by itself:
    # its own digest either way. Several are a set, named by their file names.
    return "blake3:" + (outer.hexdigest() if len(files) > 1 else digest)


# ------------------------------------------------- toolchain and hardware --

# Distribution names, in the order `key --explain` shows them.
TOOLCHAIN_PACKAGES = {
    "torch": "torch",
    "triton": "triton",
    "onnx": "onnx",
    "onnxruntime": "onnxruntime",
    "onnxruntime-gpu": "onnxruntime-gpu",
    "tensorrt": "tensorrt",
    "tensorrt_llm": "tensorrt-llm",
}


def package_version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def toolchain_fingerprint(packages: Iterable[str] = ("torch",)) -> dict[str, Any]:
    """Python and the named packages' versions (``None`` when absent).

    torch's CUDA version is added when torch is named: a cu121 and a cu124 build
    of the same torch version generate different kernels.
    """
    out: dict[str, Any] = {"python": platform.python_version()}
    for name in packages:
        out[name] = package_version(TOOLCHAIN_PACKAGES.get(name, name))
    if "torch" in packages:
        try:
            import torch

            out["torch"] = torch.__version__
            out["cuda"] = torch.version.cuda
        except ImportError:
            pass
    return out


def _cpu_isa() -> list[str]:
    """CPU features that change generated code (Inductor's C++ picks ISA by these)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return []
    for line in text.splitlines():
        if line.startswith(("flags", "Features")):
            flags = set(line.split(":", 1)[1].split())
            wanted = [
                "avx2",
                "avx512f",
                "avx512bw",
                "avx512_bf16",
                "amx_bf16",
                "amx_tile",
                "asimd",
                "sve",
            ]
            return [f for f in wanted if f in flags]
    return []


def hardware_fingerprint(device: str, *, with_driver: bool = False) -> dict[str, Any]:
    """What about the machine shapes the artifact.

    CPU artifacts depend on arch and ISA; CUDA artifacts on the GPU model and its
    compute capability, and TensorRT engines also on the driver.
    """
    # The device *type*: cuda:0 and cuda:1 of one GPU model build the same artifact.
    out: dict[str, Any] = {"device": device_type(device), "machine": platform.machine()}
    if device == "cpu":
        out["cpu_isa"] = _cpu_isa()
        return out
    import torch

    if not torch.cuda.is_available():
        from .errors import BackendError

        raise BackendError(
            f"device {device!r} requested but torch sees no CUDA GPU; use --device cpu"
        )
    idx = device_index(device)
    props = torch.cuda.get_device_properties(idx)
    out["gpu"] = props.name
    out["compute_capability"] = f"{props.major}.{props.minor}"
    if with_driver:
        out["driver"] = cuda_driver_version()
    return out


def cuda_driver_version() -> str | None:
    """The NVIDIA driver version via NVML (no subprocess), or None."""
    try:
        import ctypes

        nvml = ctypes.CDLL("libnvidia-ml.so.1")
        if nvml.nvmlInit_v2() != 0:
            return None
        buf = ctypes.create_string_buffer(80)
        rc = nvml.nvmlSystemGetDriverVersion(buf, 80)
        return buf.value.decode() if rc == 0 else None
    except OSError:
        return None
