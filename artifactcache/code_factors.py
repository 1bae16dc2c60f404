"""Key factors from acache's own code and from the compiler settings that change codegen.

``acache_factors(backend)`` names acache's version and digests the source files
that shape that backend's artifacts (``make_factors`` adds it to every key).
``codegen_factors(config)`` is what a torch-compiling backend adds to its options:
the Inductor config its build passes, inherited TORCHINDUCTOR_* variables, and
fp32 matmul precision. Neither imports torch._dynamo or torch._inductor, so a
process that only loads stays cheap; the source digests are read from disk
through import specs, never by importing the modules.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .store._fs import read_memo, write_memo

# ------------------------------------------------------------ acache's code --

# acache's own source that shapes every kind of artifact: model code, the step
# inputs a build compiles, what the backends share. A dotted name is a module, or a
# package standing for all its .py files. An upgrade of acache that changes any of
# them then misses instead of serving an artifact the old code made (most of all
# through a shared remote tier).
SHARED_SOURCES = (
    "artifactcache.models",
    "artifactcache.dtypes",  # which torch dtype a --dtype name builds in
    "artifactcache.kv_buckets",  # the cache slots and decode's read lengths
    "artifactcache.generate.prefill",  # the pass lengths the prefill steps are built for
    "artifactcache.sources.module",  # how any nn.Module is traced and fingerprinted
    "artifactcache.backends.base",
    "artifactcache.backends.shared",
)
BACKENDS_PACKAGE = "artifactcache.backends"
# The folder under backends/ of each kind of artifact. A backend's key covers its
# whole folder (the LLM and the nn.Module paths together) and every other backend
# folder its code imports (trt reads onnx's export), found by reading the imports:
# no hand-kept file list to drift. None: no acache code shapes that kind (TensorRT's
# timing cache holds per-layer timings).
BACKEND_FOLDERS: dict[str, str | None] = {
    "eager": "eager",
    "inductor": "inductor",
    "aoti": "aoti",
    "ort": "onnx",
    "trt": "tensorrt",
    "onnx-export": "onnx",
    "trt-timing-cache": None,
}


def _imported_folders(package: str) -> set[str]:
    """Backend folders (dotted) that ``package``'s files import, itself included."""
    import ast

    found: set[str] = set()
    todo = [package]
    while todo:
        pkg = todo.pop()
        if pkg in found:
            continue
        found.add(pkg)
        for rel, path in _source_files(pkg):
            here = f"{pkg}.{rel.removesuffix('.py').replace('/', '.')}".rpartition(".")[0]
            for node in ast.walk(ast.parse(path.read_bytes())):
                if isinstance(node, ast.ImportFrom):
                    base = here.split(".")
                    if node.level:
                        base = base[: len(base) - node.level + 1]
                        names = [".".join([*base, node.module] if node.module else base)]
                    else:
                        names = [node.module or ""]
                    names += [f"{names[0]}.{a.name}" for a in node.names]
                elif isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                else:
                    continue
                for name in names:
                    parts = name.split(".")
                    if name.startswith(BACKENDS_PACKAGE + ".") and len(parts) > 2:
                        folder = ".".join(parts[:3])
                        if folder not in SHARED_SOURCES and _is_package(folder):
                            todo.append(folder)
    return found


def _is_package(name: str) -> bool:
    spec = importlib.util.find_spec(name)
    return bool(spec and spec.submodule_search_locations)


@functools.cache
def backend_sources(kind: str) -> tuple[str, ...] | None:
    """The packages whose source shapes ``kind``'s artifacts, besides SHARED_SOURCES."""
    if kind not in BACKEND_FOLDERS:
        raise LookupError(f"code_factors.BACKEND_FOLDERS has no folder for backend {kind!r}")
    folder = BACKEND_FOLDERS[kind]
    if folder is None:
        return None
    return tuple(sorted(_imported_folders(f"{BACKENDS_PACKAGE}.{folder}")))


def _source_files(name: str) -> list[tuple[str, Path]]:
    """(name relative to the module or package, path) of every .py file of ``name``.

    Found through import specs, so nothing is imported but parent packages
    (artifactcache itself): no torch.
    """
    spec = importlib.util.find_spec(name)
    if spec is None or (spec.origin is None and not spec.submodule_search_locations):
        raise LookupError(f"code_factors cannot find the source of {name!r}")
    if spec.submodule_search_locations:
        files = []
        for loc in spec.submodule_search_locations:
            root = Path(loc)
            files += [(f.relative_to(root).as_posix(), f) for f in root.rglob("*.py")]
        return sorted(files)
    origin = Path(spec.origin or "")
    return [(origin.name, origin)]


# A key covers what the code does, not how it is written: each file's syntax tree with
# docstrings dropped (comments and layout never reach the tree), so an upgrade that only
# edits comments, docstrings or formatting keeps every key, local and remote. The prefix
# names the method in every key explanation.
DIGEST_METHOD = "ast-sha256"
# Parsing ~30 files costs a warm load ~50 ms, so each file's tree digest is kept by its
# raw bytes' sha256 beside the code itself: whoever can write there can change the code.
DIGEST_MEMO = Path(__file__).parent / "__pycache__" / "acache-source-digests.json"
# ast.dump's text differs between Python versions, and a tree shared by interpreters
# shares the memo: its entries are kept per version and per normalization.
DIGEST_MEMO_SCOPE = f"{DIGEST_METHOD}.1-py{sys.version_info[0]}.{sys.version_info[1]}"
DIGEST_MEMO_MAX = 4096
_memo: dict[str, str] | None = None
_memo_dirty = False


def _without_docstrings(tree: Any) -> Any:
    import ast

    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                if isinstance(body[0].value.value, str):
                    node.body = body[1:] or [ast.Pass()]
    return tree


def source_digest(data: bytes) -> str:
    """sha256 of one file's syntax tree without docstrings (its raw bytes' if it does not
    parse: such a file cannot run, and any edit of it then changes the key)."""
    global _memo, _memo_dirty
    import ast

    raw = f"{DIGEST_MEMO_SCOPE}:{hashlib.sha256(data).hexdigest()}"
    if _memo is None:
        _memo = read_memo(DIGEST_MEMO)
    hit = _memo.get(raw)
    if isinstance(hit, str):
        return hit
    try:
        tree = _without_docstrings(ast.parse(data))
        digest = hashlib.sha256(ast.dump(tree, include_attributes=False).encode()).hexdigest()
    except (SyntaxError, ValueError):
        digest = "raw-" + hashlib.sha256(data).hexdigest()
    _memo[raw] = digest
    _memo_dirty = True
    return digest


def _save_memo() -> None:
    """Best effort: an unwritable install only pays the parse again next process."""
    global _memo_dirty
    if not _memo_dirty or _memo is None:
        return
    with contextlib.suppress(OSError):
        DIGEST_MEMO.parent.mkdir(exist_ok=True)
    # Readable by every user of a shared install, as the bytecode beside it is.
    write_memo(DIGEST_MEMO, dict(list(_memo.items())[-DIGEST_MEMO_MAX:]), mode=0o644)
    _memo_dirty = False


@functools.cache
def module_digest(name: str) -> str:
    """``ast-sha256:<hex>`` over a module's or package's source files (each file's name
    and ``source_digest``), once per process."""
    h = hashlib.sha256()
    for rel, path in _source_files(name):
        h.update(f"{rel}\0{source_digest(path.read_bytes())}\0".encode())
    _save_memo()
    return f"{DIGEST_METHOD}:{h.hexdigest()}"


def acache_factors(backend: str) -> dict[str, Any] | None:
    """acache's version and the digest of each source module that shapes ``backend``."""
    names = backend_sources(backend)
    if names is None:
        return None
    from .version import __version__

    modules = dict.fromkeys((*SHARED_SOURCES, *names))  # ordered, no repeats
    return {
        "version": __version__,
        "source": {n.removeprefix("artifactcache."): module_digest(n) for n in modules},
    }


# ------------------------------------------------------ compiler settings --

# TORCHINDUCTOR_* variables that cannot change generated code: where caches and
# logs go, whether caches are used, and compile parallelism and timeouts. Every
# other TORCHINDUCTOR_* variable is a key factor. Keying on an unknown variable
# costs at worst one rebuild, while missing one that changes codegen would serve
# the wrong artifact, and each torch release adds variables; hence an ignore-list
# rather than a list of the variables that count.
INDUCTOR_ENV_IGNORED = frozenset(
    {
        "TORCHINDUCTOR_CACHE_DIR",
        "TORCHINDUCTOR_FX_GRAPH_CACHE",
        "TORCHINDUCTOR_FX_GRAPH_CACHE_DEFAULT",
        "TORCHINDUCTOR_AUTOGRAD_CACHE",
        "TORCHINDUCTOR_FORCE_DISABLE_CACHES",
        "TORCHINDUCTOR_FX_GRAPH_REMOTE_CACHE",
        "TORCHINDUCTOR_AUTOGRAD_REMOTE_CACHE",
        "TORCHINDUCTOR_AUTOTUNE_REMOTE_CACHE",
        "TORCHINDUCTOR_BUNDLED_AUTOTUNE_REMOTE_CACHE",
        "TORCHINDUCTOR_NON_BLOCKING_REMOTE_CACHE_WRITE",
        "TORCHINDUCTOR_REDIS_HOST",
        "TORCHINDUCTOR_REDIS_PORT",
        "TORCHINDUCTOR_REDIS_URL",
        "TORCHINDUCTOR_COMPILE_THREADS",
        "TORCHINDUCTOR_WORKER_START",
        "TORCHINDUCTOR_WORKER_LOGPATH",
        "TORCHINDUCTOR_WORKER_SUPPRESS_LOGGING",
        "TORCHINDUCTOR_COMPILE_WORKER_WAIT_TIMEOUT",
        "TORCHINDUCTOR_QUIESCE_ASYNC_COMPILE_POOL",
        "TORCHINDUCTOR_FILE_LOCK_TIMEOUT",
        "TORCHINDUCTOR_MM_LOGGING_FILE",
        "TORCHINDUCTOR_CONV_LOGGING_FILE",
        "TORCHINDUCTOR_FLEX_ATTENTION_LOGGING_FILE",
    }
)


def inductor_env() -> dict[str, str]:
    """The inherited TORCHINDUCTOR_* variables that may change generated code."""
    return {
        k: v
        for k, v in sorted(os.environ.items())
        if k.startswith("TORCHINDUCTOR_") and k not in INDUCTOR_ENV_IGNORED
    }


def matmul_precision() -> dict[str, Any]:
    """fp32 matmul precision and TF32 switches: Inductor lowers matmuls by them.

    Plain getters on torch's C state: torch._dynamo/_inductor stay unimported.
    """
    import torch

    return {
        "fp32_precision": torch.get_float32_matmul_precision(),
        "cuda_tf32": bool(torch.backends.cuda.matmul.allow_tf32),
        "cudnn_tf32": bool(torch.backends.cudnn.allow_tf32),
    }


def codegen_factors(inductor_config: Mapping[str, Any]) -> dict[str, Any]:
    """What, besides the model and the backend's options, changes Inductor's code.

    ``inductor_config`` is the config the backend's build passes to Inductor. The
    global ``torch._inductor.config`` is not read: importing it costs a warm load
    seconds, and an eager or aoti load never needs Inductor otherwise. Its defaults
    come from torch (keyed by version) and from TORCHINDUCTOR_* variables (keyed
    here); a Python-level change of that config before a build is not covered
    (docs/cache.md).
    """
    return {
        "inductor_config": dict(inductor_config),
        "inductor_env": inductor_env(),
        "matmul": matmul_precision(),
    }
