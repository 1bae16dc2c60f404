"""Keys: the factors (each documented one changes the key), their diff, the weights
digest memo. The key format itself: tests/test_store_keyformat.py."""

from __future__ import annotations

import functools
import os
import time
from pathlib import Path
from typing import Any

from _factor_trees import changed, changed_leaf, factor_objs, leaf_paths, reorder, replace
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from artifactcache import keys
from artifactcache.keys import diff_factors, flatten, make_factors
from artifactcache.store.keyformat import compute_key


@given(factor_objs, st.data())
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_diff_names_exactly_the_single_factor_that_changed(factors, data):
    edit = changed_leaf(factors, data)
    assume(edit is not None)
    path, other = edit
    if path and all(isinstance(p, str) for p in path):  # a leaf reached through dicts only
        assert [d.path for d in diff_factors(factors, other)] == [".".join(path)]
    else:  # a leaf inside a list: the diff names the list
        assert diff_factors(factors, other) != []


@given(factor_objs, st.randoms(use_true_random=False))
@settings(max_examples=100, deadline=None)
def test_reordering_dict_entries_leaves_no_diff(factors, rng):
    assert diff_factors(factors, reorder(factors, rng)) == []


def test_each_documented_factor_changes_the_key():
    base = dict(
        recipe={"family": "llama", "model": {"dim": 64}},
        weights="random:0",
        backend="eager",
        options={"dtype": "fp32"},
        toolchain={"python": "3.11.7", "torch": "2.13.0"},
        hardware={"device": "cpu", "machine": "x86_64"},
    )
    key = compute_key(make_factors(**base))
    variants = {
        "recipe": {"family": "llama", "model": {"dim": 128}},
        "weights": "random:1",
        "backend": "inductor",
        "options": {"dtype": "bf16"},
        "toolchain": {"python": "3.11.7", "torch": "2.14.0"},
        "hardware": {"device": "cuda", "machine": "x86_64"},
    }
    for name, value in variants.items():
        assert compute_key(make_factors(**{**base, name: value})) != key, name
    rows = dict(flatten(make_factors(**base)))
    assert rows["backend.options.dtype"] == "fp32" and rows["schema"] == keys.KEY_SCHEMA


def test_weights_digest_memo_and_invalidation(tmp_path, monkeypatch):
    ckpt = tmp_path / "model.safetensors"
    ckpt.write_bytes(os.urandom(1 << 16))
    memo = tmp_path / "memo"
    calls: list[Path] = []
    real = keys._hash_file
    monkeypatch.setattr(keys, "_hash_file", lambda p: calls.append(p) or real(p))

    first = keys.weights_digest(ckpt, memo_dir=memo)
    assert first.startswith("blake3:") and len(calls) == 1
    assert keys.weights_digest(ckpt, memo_dir=memo) == first and len(calls) == 1  # memoized

    st0 = ckpt.stat()
    data = bytearray(ckpt.read_bytes())
    data[0] ^= 0xFF
    ckpt.write_bytes(bytes(data))  # same size, new content
    os.utime(ckpt, ns=(st0.st_atime_ns, st0.st_mtime_ns + 1_000_000_000))
    second = keys.weights_digest(ckpt, memo_dir=memo)
    assert second != first and len(calls) == 2  # the memo line no longer matched


def test_weights_digest_sees_a_rewrite_whose_mtime_was_restored(tmp_path):
    # Same size, same inode, mtime put back: only ctime shows that the values changed.
    ckpt = tmp_path / "model.safetensors"
    ckpt.write_bytes(b"\x00" * 4096)
    memo = tmp_path / "memo"
    st0 = ckpt.stat()
    first = keys.weights_digest(ckpt, memo_dir=memo)
    with open(ckpt, "r+b") as f:
        f.write(b"\x01" * 4096)
    # utime itself stamps ctime with the kernel's (coarse) clock: put the mtime back until
    # that clock has moved past the memoized ctime, however coarse this filesystem's is.
    deadline = time.monotonic() + 10
    while True:
        os.utime(ckpt, ns=(st0.st_atime_ns, st0.st_mtime_ns))
        if ckpt.stat().st_ctime_ns != st0.st_ctime_ns:
            break
        assert time.monotonic() < deadline, "ctime never moved"
        time.sleep(0.005)
    st1 = ckpt.stat()
    assert (st1.st_size, st1.st_mtime_ns, st1.st_ino) == (st0.st_size, st0.st_mtime_ns, st0.st_ino)
    assert keys.weights_digest(ckpt, memo_dir=memo) != first


def test_weights_digest_shares_the_stores_stat_signature_and_skips_a_moving_file(
    tmp_path, monkeypatch
):
    """The memo keys on store._fs.stat_sig (one definition of "unchanged"); a file whose
    stat changed while it was hashed is not memoized (what was read may be a mix)."""
    import json

    from artifactcache.store import _fs

    ckpt = tmp_path / "model.safetensors"
    ckpt.write_bytes(b"\x00" * 4096)
    memo = tmp_path / "memo"
    keys.weights_digest(ckpt, memo_dir=memo)
    (line,) = json.loads((memo / keys._MEMO_NAME).read_text())
    assert line == "|".join([str(ckpt.resolve()), *map(str, _fs.stat_sig(ckpt.stat()))])

    moving = tmp_path / "moving.safetensors"
    moving.write_bytes(b"\x00" * 4096)
    real = keys._hash_file

    def hash_while_written(p: Path) -> str:
        digest = real(p)
        with open(p, "ab") as f:  # a writer still at work
            f.write(b"\x01")
        return digest

    monkeypatch.setattr(keys, "_hash_file", hash_while_written)
    keys.weights_digest(moving, memo_dir=memo)
    assert not [k for k in json.loads((memo / keys._MEMO_NAME).read_text()) if "moving" in k]


def test_weights_digest_of_a_folder(tmp_path):
    d = tmp_path / "hf"
    d.mkdir()
    (d / "model.safetensors").write_bytes(b"w" * 100)
    (d / "config.json").write_text("{}")
    (d / "README.md").write_text("ignored")
    a = keys.weights_digest(d)
    (d / "README.md").write_text("still ignored")
    assert keys.weights_digest(d) == a
    # config.json reaches the key through the parsed recipe, not as raw bytes
    # (tests/test_sources_checkpoint.py); the tensors do.
    (d / "config.json").write_text('{"dim": 1}')
    assert keys.weights_digest(d) == a
    (d / "model.safetensors").write_bytes(b"v" * 100)
    assert keys.weights_digest(d) != a
    # The folder of one file and that file are the same weights: the same digest.
    assert keys.weights_digest(d) == keys.weights_digest(d / "model.safetensors")


def test_a_sharded_folders_digest_covers_every_shard_and_its_name(tmp_path):
    d = tmp_path / "sharded"
    d.mkdir()
    for i in (1, 2):
        (d / f"model-0000{i}-of-00002.safetensors").write_bytes(bytes([i]) * 100)
    both = keys.weights_digest(d)
    assert both not in {keys.weights_digest(f) for f in d.glob("*.safetensors")}
    (d / "model-00001-of-00002.safetensors").rename(d / "model-00003-of-00002.safetensors")
    assert keys.weights_digest(d) != both  # the same bytes under other names


# ------------------------------------- acache's code and compiler settings --


def real_factors(backend: str, **env: str) -> dict[str, Any]:
    """The factors api.key_for computes here for tiny-llama on CPU, under ``env``."""
    from unittest import mock

    from artifactcache.api import key_for, make_context

    with mock.patch.dict(os.environ, env):
        b, ctx = make_context("tiny-llama", backend)
        return key_for(b, ctx).factors


CODEGEN = ("backend", "options", "codegen")
CODEGEN_ENV = {"TORCHINDUCTOR_MAX_AUTOTUNE_GEMM": "1"}
# Each new factor's leaf path, per backend (under CODEGEN_ENV, so inductor_env has a leaf).
NEW_FACTORS = {
    "inductor": [
        ("acache", "version"),
        ("acache", "source", "models"),
        ("acache", "source", "backends.base"),
        ("acache", "source", "backends.shared"),
        ("acache", "source", "backends.inductor"),
        (*CODEGEN, "inductor_env", "TORCHINDUCTOR_MAX_AUTOTUNE_GEMM"),
        (*CODEGEN, "matmul", "fp32_precision"),
        (*CODEGEN, "matmul", "cuda_tf32"),
        (*CODEGEN, "matmul", "cudnn_tf32"),
        (*CODEGEN, "cxx", "path"),
        (*CODEGEN, "cxx", "version"),
    ],
    "aoti": [
        ("acache", "source", "backends.aoti"),
        ("acache", "source", "backends.shared"),
        (*CODEGEN, "inductor_config", "aot_inductor.package_constants_in_so"),
        (*CODEGEN, "inductor_env", "TORCHINDUCTOR_MAX_AUTOTUNE_GEMM"),
        (*CODEGEN, "matmul", "fp32_precision"),
    ],
}


@functools.cache
def _real_factors_once(backend: str) -> dict[str, Any]:
    return real_factors(backend, **CODEGEN_ENV)


def test_each_new_factor_is_there_and_changes_the_key():
    for backend, wanted in NEW_FACTORS.items():
        factors = _real_factors_once(backend)
        paths = leaf_paths(factors)
        for want in wanted:
            assert want in paths, (backend, want)
            leaf = factors
            for p in want:
                leaf = leaf[p]
            other = replace(factors, want, changed(leaf))
            assert compute_key(other) != compute_key(factors), want
            assert [d.path for d in diff_factors(factors, other)] == [".".join(want)]
    assert real_factors("eager")["schema"] == keys.KEY_SCHEMA == 3


@given(st.sampled_from(sorted(NEW_FACTORS)), st.randoms(use_true_random=False))
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_reordering_real_factors_keeps_the_key(backend, rng):
    factors = _real_factors_once(backend)
    assert compute_key(reorder(factors, rng)) == compute_key(factors)
    assert diff_factors(factors, reorder(factors, rng)) == []


def key_of(backend: str, **env: str) -> str:
    return compute_key(real_factors(backend, **env))


def test_an_inductor_codegen_variable_changes_the_key_and_cache_dirs_do_not(tmp_path):
    for backend in ("inductor", "aoti"):
        base = key_of(backend)
        assert key_of(backend, TORCHINDUCTOR_FREEZING="1") != base
        assert key_of(backend, TORCHINDUCTOR_CPP_WRAPPER="1") != base
        # Where caches go and how many compile workers run change no code; the
        # measurement children point TORCHINDUCTOR_CACHE_DIR at fresh dirs.
        assert (
            key_of(
                backend,
                TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "x"),
                TORCHINDUCTOR_COMPILE_THREADS="1",
                TORCHINDUCTOR_FX_GRAPH_CACHE="0",
            )
            == base
        )
    # Eager compiles nothing.
    assert key_of("eager", TORCHINDUCTOR_FREEZING="1") == key_of("eager")


def test_fp32_matmul_precision_and_tf32_change_the_key():
    import torch
    from _backend_util import matmul_precision_kept

    before = {b: key_of(b) for b in ("inductor", "aoti")}
    with matmul_precision_kept():
        saved = torch.get_float32_matmul_precision()
        torch.set_float32_matmul_precision("high" if saved != "high" else "highest")
        assert all(key_of(b) != k for b, k in before.items())
    assert {b: key_of(b) for b in before} == before
    with matmul_precision_kept():
        torch.backends.cudnn.allow_tf32 = not torch.backends.cudnn.allow_tf32
        assert all(key_of(b) != k for b, k in before.items())
    assert {b: key_of(b) for b in before} == before


def test_the_cpu_compiler_is_a_factor_of_inductor_cpu(tmp_path):
    import shutil

    import pytest

    gxx = shutil.which("g++")
    if gxx is None:
        pytest.skip("no g++ on this machine")
    other = tmp_path / "my-g++"
    other.write_text(f'#!/bin/sh\nexec {gxx} "$@"\n')
    other.chmod(0o755)
    base = real_factors("inductor")
    mine = real_factors("inductor", CXX=str(other))
    assert mine["backend"]["options"]["codegen"]["cxx"]["path"] == str(other)
    assert [d.path for d in diff_factors(base, mine)] == ["backend.options.codegen.cxx.path"]


def test_acache_version_changes_the_key(monkeypatch):
    from artifactcache import version

    base = key_of("eager")
    monkeypatch.setattr(version, "__version__", "99.0.0")
    assert key_of("eager") != base


def test_a_change_to_model_source_changes_the_key(tmp_path, monkeypatch):
    """A copy of artifactcache/models stands in for the real one in the file list."""
    import importlib
    import shutil

    from artifactcache import code_factors

    real = Path(code_factors.__file__).parent / "models"
    shutil.copytree(real, tmp_path / "models_copy", ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    shared = ("models_copy", *code_factors.SHARED_SOURCES[1:])
    monkeypatch.setattr(code_factors, "SHARED_SOURCES", shared)
    code_factors.module_digest.cache_clear()
    # The digest depends on the files' contents, not on where they are installed.
    assert code_factors.module_digest("models_copy") == code_factors.module_digest(
        "artifactcache.models"
    )
    before = real_factors("eager")
    llama = tmp_path / "models_copy" / "llama.py"
    text = llama.read_text()
    # Comments, docstrings and layout are not behaviour: the key stays.
    cosmetic = text.replace("def ", "def  ", 1).replace('"""', '"""Reworded. ', 1)
    llama.write_text("# a new comment\n\n" + cosmetic.replace("\n\n", "\n\n\n", 3))
    code_factors.module_digest.cache_clear()
    assert real_factors("eager") == before
    # One constant changed is: the key moves, and the explanation says which module.
    changed = text.replace("return ", "return 0 + ", 1)
    assert changed != text
    llama.write_text(changed)
    code_factors.module_digest.cache_clear()
    try:
        after = real_factors("eager")
    finally:
        code_factors.module_digest.cache_clear()
    assert [d.path for d in diff_factors(before, after)] == ["acache.source.models_copy"]
    assert after["acache"]["source"]["models_copy"].startswith("ast-sha256:")
    # A file added to the package counts too.
    (tmp_path / "models_copy" / "extra.py").write_text("X = 1\n")
    assert code_factors.module_digest("models_copy") != after["acache"]["source"]["models_copy"]
    code_factors.module_digest.cache_clear()


# acache modules a backend may import without them shaping its artifact: errors,
# key code, what reaches the key as factors of its own (recipe, weights), and the
# decoding loop run around a loaded artifact (generate: chunking, sampling, EOS).
NOT_SHAPING = ("artifactcache.errors", "artifactcache.keys", "artifactcache.code_factors",
               # a recipe's fields are key factors themselves (Recipe.normalized()); so are
               # the user's choices, through each backend's factors (BuildChoices is data)
               "artifactcache.config", "artifactcache.choices", "artifactcache.recipes",
               "artifactcache.sources", "artifactcache.store",
               "artifactcache.generate",
               # the device type is a factor of its own; install hints are messages
               "artifactcache.devices", "artifactcache.extras",
               # CUDA graphs are captured at load, from an artifact already built
               "artifactcache.backends.shared.cuda_graph",
               # shape rules and memory fit: what they decide is the recipe's shapes (key
               # factors themselves), a refusal, or whether aoti's steps build concurrently
               "artifactcache.sizing",
               # the host's CPU and memory limits: thread counts and refusals
               "artifactcache.host",
               # the ACACHE_* declarations; a value that shapes an artifact is a key factor
               # where it is read (warm_path, cuda graphs are captured at load)
               "artifactcache.settings",
               # bounds on user input and env parsing: what passes is unchanged, or refused
               "artifactcache.limits")  # fmt: skip


def _acache_imports(path: Path, module: str) -> set[str]:
    """artifactcache modules a file imports, anywhere in it (lazy imports too)."""
    import ast
    import importlib.util

    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            if base.startswith("artifactcache"):
                # `from .. import x` of a submodule x imports x, not the package's own code
                # (its __init__, which the key need not cover); anything else imports base.
                subs = {f"{base}.{a.name}" for a in node.names}
                is_package = importlib.util.find_spec(base).submodule_search_locations
                subs = {s for s in subs if is_package and importlib.util.find_spec(s)}
                out.update(subs)
                if len(subs) < len(node.names):
                    out.add(base)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("artifactcache"))
    return out


def test_every_backend_names_the_sources_it_imports():
    """Each module a backend's code imports is in its source list (or shapes no
    artifact): a new helper module or package cannot slip out of the key."""
    import importlib.util

    import pytest

    from artifactcache import code_factors
    from artifactcache.backends.base import BACKEND_NAMES

    def is_module(name: str) -> bool:
        try:
            return importlib.util.find_spec(name) is not None
        except ModuleNotFoundError:  # a.b.c where a.b is a module
            return False

    def covered(name: str, listed: tuple[str, ...]) -> bool:
        return any(name == m or name.startswith(m + ".") for m in (*listed, *NOT_SHAPING))

    for backend in (*BACKEND_NAMES, "onnx-export"):
        listed = (*code_factors.SHARED_SOURCES, *code_factors.backend_sources(backend))
        own = "artifactcache.backends." + code_factors.BACKEND_FOLDERS[backend]
        assert covered(own, listed), backend
        for name in listed:
            is_package = bool(importlib.util.find_spec(name).submodule_search_locations)
            for rel, path in code_factors._source_files(name):
                mod = name
                if is_package:
                    mod = f"{name}.{rel.removesuffix('.py').replace('/', '.')}"
                    mod = mod.removesuffix(".__init__")
                for imported in _acache_imports(path, mod):
                    if is_module(imported):  # not a name imported from a module
                        assert covered(imported, listed), (backend, mod, imported)
        assert code_factors.acache_factors(backend) is not None
    assert code_factors.acache_factors("trt-timing-cache") is None
    with pytest.raises(LookupError, match="no folder"):
        code_factors.acache_factors("no-such-backend")


def test_aoti_keys_exactly_the_config_its_build_passes(monkeypatch):
    from artifactcache.backends.aoti import backend as aoti
    from artifactcache.choices import BuildChoices
    from artifactcache.recipes import load_recipe

    monkeypatch.setattr(aoti, "choose_cxx", lambda memo_dir=None: "/usr/bin/g++")
    for mode in ("default", "max-autotune"):
        opts = BuildChoices(mode=mode)
        keyed = aoti.BACKEND.factors(load_recipe("tiny-llama"), opts)["codegen"]["inductor_config"]
        passed = aoti.inductor_configs(opts, None)
        assert passed.pop("cpp.cxx") == "/usr/bin/g++"
        assert passed == keyed


def test_computing_keys_imports_no_compiler_stack():
    """A process that only loads (eager, a warm aoti load) must stay cheap."""
    import subprocess
    import sys

    code = (
        "import sys; from artifactcache.api import make_context, key_for\n"
        "for b in ('eager', 'aoti'):\n"
        "    key_for(*make_context('tiny-llama', b))\n"
        "heavy = ('torch._dynamo', 'torch._inductor', 'sympy')\n"
        "print(sorted(m for m in heavy if m in sys.modules))"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_key_explain_prints_the_new_factors(monkeypatch):
    from typer.testing import CliRunner

    from artifactcache.cli.app import app

    monkeypatch.setenv("COLUMNS", "250")
    res = CliRunner().invoke(app, ["key", "tiny-llama", "--backend", "aoti", "--explain"])
    assert res.exit_code == 0, res.output
    for row in (
        "acache.version",
        "acache.source.models",
        "acache.source.backends.aoti",
        "backend.options.codegen.inductor_config.aot_inductor.package_constants_in_so",
        "backend.options.codegen.inductor_env",
        "backend.options.codegen.matmul.fp32_precision",
        "toolchain.libstdcxx",
    ):
        assert row in res.output, row


def test_a_backend_key_covers_its_folder_and_the_folders_it_imports(tmp_path, monkeypatch):
    """backend_sources reads the folder's imports: a new file or a new cross-folder import
    reaches the key without anyone editing a list."""
    import importlib

    from artifactcache import code_factors

    root = tmp_path / "fakepkg" / "backends"
    for folder in ("a", "b", "c", "shared"):
        (root / folder).mkdir(parents=True)
        (root / folder / "__init__.py").write_text("")
    (root.parent / "__init__.py").write_text("")
    (root / "__init__.py").write_text("")
    (root / "a" / "backend.py").write_text("from ..b import thing\nfrom ..shared import x\n")
    (root / "b" / "thing.py").write_text("X = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    monkeypatch.setattr(code_factors, "BACKENDS_PACKAGE", "fakepkg.backends")
    monkeypatch.setattr(code_factors, "SHARED_SOURCES", ("fakepkg.backends.shared",))
    monkeypatch.setattr(code_factors, "BACKEND_FOLDERS", {"a": "a", "c": "c"})
    code_factors.backend_sources.cache_clear()
    code_factors.module_digest.cache_clear()
    try:
        assert code_factors.backend_sources("a") == ("fakepkg.backends.a", "fakepkg.backends.b")
        assert code_factors.backend_sources("c") == ("fakepkg.backends.c",)
        before = code_factors.module_digest("fakepkg.backends.a")
        (root / "a" / "new_helper.py").write_text("Y = 2\n")
        code_factors.module_digest.cache_clear()
        assert code_factors.module_digest("fakepkg.backends.a") != before
    finally:
        code_factors.backend_sources.cache_clear()
        code_factors.module_digest.cache_clear()


def test_source_digests_ignore_comments_docstrings_and_layout_only():
    from artifactcache.code_factors import source_digest

    base = source_digest(b'"""Doc."""\ndef f(x):\n    """Say."""\n    return x + 1\n')
    same = b'# c\ndef f( x ):  # why\n    """Other words."""\n\n    return (x + 1)\n'
    assert source_digest(same) == base
    assert source_digest(b"def f(x):\n    return x + 2\n") != base
    assert source_digest(b"def f(x):\n    'kept: not first'\n    return x + 1\n") == base
    # A string that is the only statement is still behaviour-free; a bare body stays valid.
    assert source_digest(b"class A:\n    'doc'\n") == source_digest(b"class A:\n    pass\n")
    # A file that does not parse is keyed by its bytes: any edit of it moves the key.
    broken = source_digest(b"def f(:\n")
    assert broken.startswith("raw-") and source_digest(b"def f(: \n") != broken


def test_source_digests_are_kept_beside_the_code_by_raw_hash(tmp_path, monkeypatch):
    import hashlib
    import json
    import sys

    from artifactcache import code_factors

    memo = tmp_path / "__pycache__" / "digests.json"
    monkeypatch.setattr(code_factors, "DIGEST_MEMO", memo)
    monkeypatch.setattr(code_factors, "_memo", None)
    src = b"X = 1\n"
    digest = code_factors.source_digest(src)
    code_factors._save_memo()
    kept = json.loads(memo.read_text())
    name = f"{code_factors.DIGEST_MEMO_SCOPE}:{hashlib.sha256(src).hexdigest()}"
    assert kept[name] == digest and f"py{sys.version_info[0]}" in name  # per interpreter
    # A new process reads it: no parse needed (a stand-in digest proves it was read).
    kept[name] = "from-the-memo"
    memo.write_text(json.dumps(kept))
    monkeypatch.setattr(code_factors, "_memo", None)
    assert code_factors.source_digest(src) == "from-the-memo"
    monkeypatch.setattr(code_factors, "_memo", None)
    memo.write_text("{broken")
    assert code_factors.source_digest(src) == digest  # a bad memo is parsed over
