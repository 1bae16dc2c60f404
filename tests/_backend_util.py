"""Helpers shared by the backend tests (not a test module)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

TINY = ["tiny-llama", "tiny-mistral", "tiny-phi-2", "tiny-phi-3"]
CHILD = Path(__file__).with_name("_load_child.py")
# Set for a _load_child.py process: its torch then lacks torch.compiler.load_compiled_function,
# as a torch without the API would (inductor takes the Mega-Cache path).
NO_AOT_COMPILE_ENV = "ACACHE_TEST_WITHOUT_AOT_COMPILE"


def found_in_a_fresh_process(kernels: Any) -> list[tuple[str, str]]:
    """(type, function name) of each Triton kernel of ``kernels`` as a fresh interpreter
    finds it from the (module, name) torch's saved compiled functions (the inductor warm
    path) record it as: looked up with getattr before anything there defined it. Skips
    where this torch saves no Triton kernel that way."""
    import pytest

    types = pytest.importorskip("torch._dynamo.aot_compile_types")
    if not hasattr(types, "_deserialize_triton_kernel"):
        pytest.skip("this torch saves no Triton kernel by module and name")
    infos = [types._serialize_triton_kernel(k) for k in kernels]
    code = (
        "from torch._dynamo.aot_compile_types import _deserialize_triton_kernel\n"
        f"for info in {infos!r}:\n"
        "    k = _deserialize_triton_kernel(info)\n"
        "    print(type(k).__name__, k.fn.__name__)\n"
    )
    repo = Path(__file__).resolve().parents[1]
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=repo, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return [tuple(line.split()) for line in done.stdout.splitlines()]


# torch 2.11's wrap_triton refuses the kernels Triton's interpreter makes; 2.13 takes them.
INTERPRETER_REFUSED = "wrap_triton only works on functions annotated with triton.jit"


def skip_if_interpreter_refused(output: str) -> None:
    """Skip (with the reason) a Triton-interpreter child that failed only because this
    torch cannot run user kernels under the interpreter."""
    import pytest

    if INTERPRETER_REFUSED in output:
        pytest.skip("this torch's wrap_triton refuses Triton's interpreter (torch 2.11); "
                    "the interpreter cases run on torch 2.13 and later")  # fmt: skip


def private_dir(tmp_path_factory: Any, name: str) -> Path:
    d = tmp_path_factory.mktemp(name)
    os.chmod(d, 0o700)  # LocalStore refuses group/world-writable roots
    return d


def runner_cache(root: Path) -> Any:
    """get(recipe, backend, weights=None) -> Runner from ``root``, loaded (or built) once."""
    from artifactcache import api

    cache: dict = {}

    def get(name: str, backend: str, weights: Path | None = None) -> Any:
        k = (name, backend, weights)
        if k not in cache:
            cache[k] = api.load(name, backend, weights=weights, cache_dir=root)
        return cache[k]

    return get


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got - want).abs().max() / want.abs().max()).item()


def tree_digest(path: Path) -> dict[str, str]:
    return {
        str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(path.rglob("*"))
        if p.is_file()
    }


def load_in_child(
    root: Path, recipe: str, backend: str, prompt: list[int], n: int, env: dict[str, str]
) -> dict[str, Any]:
    """api.load(build_on_miss=False) + generate in a fresh interpreter; what it saw."""
    full_env = {**os.environ, **env, "ACACHE_DIR": str(root)}
    out = subprocess.run(
        [sys.executable, str(CHILD), str(root), recipe, backend, json.dumps(prompt), str(n)],
        env=full_env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def kernel_compiles(report: dict[str, Any]) -> list[str]:
    """C++ compiles that produced code (.so/.o); header preprocessing runs (.i) excluded."""
    return [t for t in report["compiles"] if not t.endswith(".i")]


# A probe body whose "regex check" segfaults: what the GPU image's $CXX produced.
CRASHING_PROBE = (
    '#include <signal.h>\nextern "C" int acache_regex_probe(void){raise(SIGSEGV);return 0;}'
)


def fake_cxx(tmp_path: Path, name: str, body: str) -> str:
    """A compiler wrapper: g++ building ``body`` instead of its input (-o kept)."""
    src = tmp_path / f"{name}.cpp"
    src.write_text(body)
    script = tmp_path / name
    script.write_text(
        "#!/bin/sh\n"
        'out=""; prev=""; for a in "$@"; do [ "$prev" = "-o" ] && out="$a"; prev="$a"; done\n'
        f'exec g++ -shared -fPIC -o "$out" {src}\n'
    )
    script.chmod(0o755)
    return str(script)


# Prompts of different lengths for the batch tests: one past tiny recipes' prefill_len (8),
# so its rows run in chunks, and one of a single token.
BATCH_PROMPTS = (
    [1, 15043, 29892, 590, 1024, 338],
    [1, 2],
    [(7 * i + 11) % 1000 for i in range(19)],
    [5],
)


def assert_rows_match_alone(batched: Any, alone: Any, prompts: Any, new_tokens: int) -> None:
    """Every row of a batch equals its prompt run alone on ``alone`` (a batch-1 runner):
    logits <= 1e-4 relative (fp32) and identical greedy tokens."""
    prompts = [list(p) for p in prompts]
    for p, got in zip(prompts, batched.logits_batch(prompts), strict=True):
        want = alone.logits(p)
        assert got.shape == want.shape
        assert rel_err(got, want) <= 1e-4, (len(p), rel_err(got, want))
    want_tokens = [alone.generate(p, new_tokens, eos_token_ids=()) for p in prompts]
    assert batched.generate_batch(prompts, new_tokens, eos_token_ids=()) == want_tokens


# Every switch torch.set_float32_matmul_precision writes. Restoring through that legacy
# call alone leaves the new-API values changed ("none" comes back as "ieee"), and
# Inductor's FX-graph key holds torch.backends.cuda.matmul.fp32_precision: every later
# build in the process (a pytest-xdist worker) would then key its graphs differently from
# a fresh process, whose warm load would miss.
_PRECISION_SWITCHES = [
    (torch.backends, "fp32_precision"),
    (torch.backends.cuda.matmul, "fp32_precision"),
    (torch.backends.cudnn, "fp32_precision"),
    (torch.backends.cuda.matmul, "allow_tf32"),
    (torch.backends.cudnn, "allow_tf32"),
]


@contextlib.contextmanager
def matmul_precision_kept() -> Iterator[None]:
    """Restore the fp32 matmul precision and every switch behind it on exit."""
    before = torch.get_float32_matmul_precision()
    switches = [getattr(obj, name, None) for obj, name in _PRECISION_SWITCHES]
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(before)
        for (obj, name), value in zip(_PRECISION_SWITCHES, switches, strict=True):
            if value is not None and getattr(obj, name) != value:
                setattr(obj, name, value)
