"""gpt-fast's own generate loop beside ``acache bench``, on the same GPU in one call.

gpt-fast (github:pytorch-labs/gpt-fast, BSD-3) is the peer that docs/benchmarks.md
compares against. Its files are not part of this repository: put its ``model.py`` and
``generate.py``, unmodified, into ``.gpucache/gpt-fast/`` at the repository root (that
folder is git-ignored and carried to the GPU machine), or name another folder with
``--gpt-fast-dir``. Its tokenizer is not needed: the prompt is the recipe's recorded
``prompt_ids``.

Each part runs in a fresh process, in this order:

1. **gpt-fast.** Importing its generate.py applies its own Inductor settings
   (``coordinate_descent_tuning``, ``triton.unique_kernel_names``, ``fx_graph_cache``,
   the AOTAutograd cache); the child reads them back into the result. Its
   ``Transformer`` for ``ModelArgs.from_name("7B")`` (checked against the recipe's
   shapes) is built on the meta device and given seeded random weights in the recipe's
   dtype by acache's ``init_random``. Then what its ``main()`` does with ``--compile``:
   ``decode_one_token = torch.compile(decode_one_token, mode="reduce-overhead",
   fullgraph=True)``, prefill left uncompiled, one warm-up sample (the compile), then
   ``--samples`` timed calls of its ``generate()``; tok/s = new tokens / wall time of
   one call, prefill included, averaged: the figure it prints as "Average tokens/sec".
   Greedy: temperature 0 and no top-k in its sampler (``logits / max(T, 1e-5)``, then
   softmax and an exponential race, which picks the argmax). Its prefill is also timed
   on its own, so that a decode rate can be derived the way ``acache bench`` derives
   its own: (N - 1) / (median request - median prefill).
2. **acache.** ``acache bench RECIPE --backend B --device cuda --dtype bf16
   --new-tokens N --json`` for each of ``--backends`` (default aoti, inductor), against
   one cache dir, building on a miss (the build is outside the timed loop).

Ratios are acache / gpt-fast, for the figure with prefill (the same definition on both
sides) and for decode. gpt-fast's % of roofline uses acache's bytes per token and the
copy bandwidth measured in the same call. The whole call stops starting parts once
``--budget-s`` is spent.

    python benchmarks/gpt_fast_peer.py --out OUT              # on the GPU machine
    python benchmarks/gpt_fast_peer.py --tiny --out OUT       # CPU: the plumbing only

``--tiny``: tiny-llama's shapes as gpt-fast ModelArgs, fp32 on CPU, no compile, 32 new
tokens, acache's eager backend; its numbers mean nothing. Writes
``OUT/gpt_fast_peer.json`` and ``OUT/gpt_fast_peer.md`` and prints the markdown.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import time
import types
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # this checkout's artifactcache, as in its children
DEFAULT_GPT_FAST_DIR = REPO / ".gpucache" / "gpt-fast"
GPT_FAST_FILES = ("model.py", "generate.py")
# gpt-fast's transformer_configs names for the recipes whose architecture its model.py has.
GPT_FAST_CONFIGS = {"llama-7b": "7B", "llama-3-8b": "llama-3-8b", "mistral-7b": "Mistral-7B"}
# The ModelArgs fields that must equal the recipe's, as (gpt-fast name, recipe name).
SHAPE_FIELDS = (
    ("vocab_size", "vocab_size"),
    ("n_layer", "n_layers"),
    ("n_head", "n_heads"),
    ("n_local_heads", "n_kv_heads"),
    ("dim", "dim"),
    ("intermediate_size", "intermediate_size"),
    ("rope_base", "rope_theta"),
    ("norm_eps", "norm_eps"),
)
MIN_PART_S = 30  # a part with less budget left than this is not started


class PeerError(Exception):
    """A one-line reason the benchmark cannot run; main() prints it as ``error: ...``."""


def check_gpt_fast_dir(path: Path) -> None:
    missing = [f for f in GPT_FAST_FILES if not (path / f).is_file()]
    if missing:
        raise PeerError(
            f"gpt-fast's {' and '.join(missing)} not found in {path}: put model.py and "
            f"generate.py from github:pytorch-labs/gpt-fast there, unmodified "
            f"(default place: {DEFAULT_GPT_FAST_DIR.relative_to(REPO)}/ at the repository "
            "root, or pass --gpt-fast-dir)"
        )


def model_args(gpt_fast_dir: Path, recipe: Any, config: str | None) -> Any:
    """gpt-fast's ModelArgs by its config name, or from the recipe; checked against it."""
    sys.path.insert(0, str(gpt_fast_dir))
    from model import ModelArgs  # gpt-fast's model.py

    m = recipe.model
    if config is None:
        kw = {g: getattr(m, r) for g, r in SHAPE_FIELDS}
        return ModelArgs(block_size=m.max_position_embeddings, **kw)
    try:
        args = ModelArgs.from_name(config)
    except (KeyError, IndexError):
        raise PeerError(f"gpt-fast's model.py has no config named {config!r}") from None
    for g, r in SHAPE_FIELDS:
        if getattr(args, g) != getattr(m, r):
            raise PeerError(
                f"gpt-fast's ModelArgs {config!r} do not match recipe {recipe.name}: "
                f"{g} is {getattr(args, g)}, the recipe's {r} is {getattr(m, r)}"
            )
    return args


def _no_tokenizer() -> types.ModuleType:
    """Stands in for gpt-fast's tokenizer.py, which generate.py imports at module level
    and which needs sentencepiece and tiktoken; the benchmark feeds token ids."""
    mod = types.ModuleType("tokenizer")

    def get_tokenizer(*_: Any) -> Any:
        raise RuntimeError("gpt_fast_peer.py feeds token ids; gpt-fast's tokenizer is not used")

    mod.get_tokenizer = get_tokenizer  # type: ignore[attr-defined]
    return mod


def gpt_fast_child(cfg: dict[str, Any]) -> dict[str, Any]:
    """Runs in its own process: gpt-fast's loop as its main() runs it (module doc)."""
    gdir = Path(cfg["gpt_fast_dir"])
    sys.path.insert(0, str(gdir))
    sys.modules["tokenizer"] = _no_tokenizer()
    import generate as gf  # gpt-fast's generate.py: sets its Inductor config on import
    import torch
    from model import Transformer

    from artifactcache.dtypes import torch_dtype
    from artifactcache.models.weights import init_random
    from artifactcache.recipes import load_recipe

    recipe = load_recipe(cfg["recipe"])
    device = cfg["device"]
    dev = torch.device(device)
    dtype = torch_dtype(cfg["dtype"])
    with torch.device("meta"):
        model = Transformer(model_args(gdir, recipe, cfg["config"]))
    model = model.to(dtype)  # still on meta: init_random allocates in this dtype
    init_random(model, cfg["seed"], dev, dtype)
    model = model.eval()
    encoded = torch.tensor(recipe.bench.prompt_ids, dtype=torch.int, device=dev)
    prompt_length = encoded.size(-1)
    sampling = {"temperature": 0.0, "top_k": None}
    new_tokens = cfg["new_tokens"]

    torch.manual_seed(1234)
    model_size, params = gf._get_model_size(model)
    if cfg["compile"]:
        gf.decode_one_token = torch.compile(
            gf.decode_one_token, mode="reduce-overhead", fullgraph=True
        )
    tps: list[float] = []
    request_s: list[float] = []
    compile_s = None
    tokens: list[int] = []
    for i in range(-1 if cfg["compile"] else 0, cfg["samples"]):
        gf.device_sync(device=device)
        t0 = time.perf_counter()
        y, _ = gf.generate(
            model, encoded, new_tokens, batch_size=1, interactive=False, draft_model=None,
            callback=lambda x: x, **sampling,
        )  # fmt: skip
        if i == -1:
            compile_s = time.perf_counter() - t0
            continue
        gf.device_sync(device=device)
        t = time.perf_counter() - t0
        request_s.append(t)
        tps.append((y.size(-1) - prompt_length) / t)
        tokens = y[0, prompt_length:].tolist()
    prefill_s = []
    pos = torch.arange(0, prompt_length, device=dev)
    with torch.no_grad():
        for _ in range(cfg["samples"]):
            gf.device_sync(device=device)
            t0 = time.perf_counter()
            gf.prefill(model, encoded.view(1, -1), pos, **sampling)
            gf.device_sync(device=device)
            prefill_s.append(time.perf_counter() - t0)
    decode = statistics.median(request_s) - statistics.median(prefill_s)
    ind, fun = torch._inductor.config, torch._functorch.config
    cuda = dev.type == "cuda"
    return {
        "tokens_per_sec": tps,
        "average_tokens_per_sec": sum(tps) / len(tps),
        "request_s": request_s,
        "prefill_s": prefill_s,
        "decode_tok_s": (new_tokens - 1) / decode if new_tokens > 1 and decode > 0 else None,
        "compile_s": compile_s,
        "bandwidth_gbps_reported": model_size * sum(tps) / len(tps) / 1e9,
        "model_size_bytes": model_size,
        "params": params,
        "kv_slots": model.max_seq_length,
        "first_tokens": tokens[:8],
        "sampling": sampling,
        "compiled": bool(cfg["compile"]),
        "inductor_settings": {
            "coordinate_descent_tuning": ind.coordinate_descent_tuning,
            "triton.unique_kernel_names": ind.triton.unique_kernel_names,
            "fx_graph_cache": ind.fx_graph_cache,
            "functorch.enable_autograd_cache": fun.enable_autograd_cache,
        },
        "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name() if cuda else None,
        "max_memory_reserved_bytes": torch.cuda.max_memory_reserved() if cuda else None,
    }  # fmt: skip


def child_env(out: Path, inductor_dir: str) -> dict[str, str]:
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, "PYTHONPATH": path, "TORCHINDUCTOR_CACHE_DIR": str(out / inductor_dir)}


def run_child(
    cmd: list[str], env: dict[str, str], timeout: float
) -> subprocess.CompletedProcess[str]:
    """subprocess.run in its own session, so a timeout also ends the probe it started."""
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                          start_new_session=True) as p:  # fmt: skip
        try:
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.communicate()
            raise
    return subprocess.CompletedProcess(cmd, p.returncode, out, err)


def _failure(p: subprocess.CompletedProcess[str]) -> str:
    lines = p.stderr.strip().splitlines()
    return (lines[-1] if lines else f"exit {p.returncode}")[-500:]


def run_gpt_fast(cfg: dict[str, Any], out: Path, timeout: float) -> dict[str, Any]:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--gpt-fast-child", json.dumps(cfg)]
    t0 = time.perf_counter()
    try:
        p = run_child(cmd, child_env(out, "gpt-fast-inductor-cache"), timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    (out / "gpt_fast_child.log").write_text(p.stderr)
    if p.returncode != 0:
        return {"error": _failure(p), "wall_s": round(time.perf_counter() - t0, 1)}
    return {**json.loads(p.stdout.strip().splitlines()[-1]),
            "wall_s": round(time.perf_counter() - t0, 1)}  # fmt: skip


def acache_command(backend: str, a: argparse.Namespace) -> list[str]:
    return ["bench", a.recipe, "--backend", backend, "--device", a.device, "--dtype", a.dtype,
            "--new-tokens", str(a.new_tokens), "--iters", str(a.iters), "--json",
            "--cache-dir", str(a.cache_dir)]  # fmt: skip


def run_acache(backend: str, a: argparse.Namespace, timeout: float) -> dict[str, Any]:
    args = acache_command(backend, a)
    row: dict[str, Any] = {"backend": backend, "command": "acache " + " ".join(args)}
    t0 = time.perf_counter()
    try:
        cmd = [sys.executable, "-m", "artifactcache.cli", *args]
        p = run_child(cmd, child_env(a.out, "inductor-cache"), timeout)
    except subprocess.TimeoutExpired:
        return {**row, "error": f"timed out after {timeout:.0f} s"}
    row["wall_s"] = round(time.perf_counter() - t0, 1)
    if p.returncode != 0:
        return {**row, "error": _failure(p)}
    r = json.loads(p.stdout)
    keep = ("decode_tok_s", "request_tok_s", "roofline_pct", "roofline_tok_s", "copy_gbps",
            "achieved_gbps", "bytes_per_token", "prefill", "request", "mode", "runner_info",
            "phases", "environment")  # fmt: skip
    return {**row, **{k: r.get(k) for k in keep}}


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


def add_ratios(report: dict[str, Any]) -> None:
    """acache / gpt-fast per row, and gpt-fast's % of roofline from acache's bytes and copy rate."""
    g = report["gpt_fast"]
    for row in report["acache"]:
        if "error" in row or "error" in g:
            continue
        row["ratio_incl_prefill"] = _ratio(row["request_tok_s"], g["average_tokens_per_sec"])
        row["ratio_decode"] = _ratio(row["decode_tok_s"], g["decode_tok_s"])
    measured = [r for r in report["acache"] if r.get("copy_gbps") and r.get("bytes_per_token")]
    if measured and "error" not in g and g.get("decode_tok_s"):
        r = measured[0]
        g["roofline_pct"] = (
            100 * r["bytes_per_token"]["total"] * g["decode_tok_s"] / 1e9 / r["copy_gbps"]
        )


def _f(v: float | None, fmt: str = "{:.1f}") -> str:
    return "–" if v is None else fmt.format(v)


def markdown(report: dict[str, Any]) -> str:
    s = report["setup"]
    g = report["gpt_fast"]
    lines = [
        f"## gpt-fast beside acache: {s['recipe']}, {s['dtype']}, {s['device']}, batch 1, "
        f"seed prompt, {s['new_tokens']} new tokens, greedy",
        "",
        f"{report['date']}, host {report['host']}, GPU {g.get('gpu') or '–'}, "
        f"torch {g.get('torch') or '–'}, gpt-fast {report['gpt_fast_source']}",
        f"`{report['command']}`",
        "",
        "| run | tok/s incl. prefill (gpt-fast's figure) | decode tok/s | % of copy roofline "
        "| ratio incl. prefill | ratio decode | process s |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    name = "gpt-fast generate.py" + (" --compile" if s["compile"] else " (eager)")
    if "error" in g:
        lines.append(f"| {name} | error: {g['error']} | | | | | |")
    else:
        lines.append(
            f"| {name} | {_f(g['average_tokens_per_sec'])} | {_f(g['decode_tok_s'])} | "
            f"{_f(g.get('roofline_pct'))} | 1 | 1 | {_f(g['wall_s'], '{:.0f}')} |"
        )
    for r in report["acache"]:
        label = f"acache {r['backend']}" + (f" ({r['mode']})" if r.get("mode") else "")
        if "error" in r:
            lines.append(f"| {label} | error: {r['error']} | | | | | {_f(r.get('wall_s'))} |")
            continue
        lines.append(
            f"| {label} | {_f(r['request_tok_s'])} | {_f(r['decode_tok_s'])} | "
            f"{_f(r['roofline_pct'])} | {_f(r.get('ratio_incl_prefill'), '{:.3f}')} | "
            f"{_f(r.get('ratio_decode'), '{:.3f}')} | {_f(r['wall_s'], '{:.0f}')} |"
        )
    for r in report["not_run"]:
        lines.append(f"| {r['what']} | not run: {r['why']} | | | | | |")
    if "error" not in g:
        warmup = f"a warm-up sample of {_f(g['compile_s'])} s (its compile)"
        lines += [
            "",
            f"gpt-fast: {len(g['tokens_per_sec'])} timed samples after "
            f"{warmup if g['compiled'] else 'no warm-up (not compiled)'}; "
            f"its KV cache holds {g['kv_slots']} positions; its prefill "
            f"{_f(statistics.median(g['prefill_s']) * 1e3, '{:.1f}')} ms (not compiled, as without "
            "--compile_prefill); its own bandwidth figure "
            f"{_f(g['bandwidth_gbps_reported'])} GB/s.",
        ]  # fmt: skip
    return "\n".join(lines) + "\n"


def gpt_fast_source(gdir: Path) -> str:
    src = gdir / "SOURCE.txt"
    return src.read_text().strip() if src.is_file() else "(no SOURCE.txt: version unknown)"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, help="where gpt_fast_peer.json/.md go")
    ap.add_argument("--gpt-fast-dir", type=Path, default=DEFAULT_GPT_FAST_DIR)
    ap.add_argument("--recipe", default="llama-7b")
    ap.add_argument("--gpt-fast-config", help="its transformer_configs name (default: by recipe)")
    ap.add_argument("--backends", default="aoti,inductor", help="acache backends, comma-separated")
    ap.add_argument("--new-tokens", type=int, default=200)
    ap.add_argument("--samples", type=int, default=5, help="gpt-fast's --num_samples")
    ap.add_argument("--iters", type=int, default=3, help="acache bench --iters")
    ap.add_argument("--seed", type=int, default=0, help="random weights seed")
    ap.add_argument("--cache-dir", type=Path, help="acache's cache (default: OUT/cache)")
    ap.add_argument("--budget-s", type=float, default=540, help="no part starts after this")
    ap.add_argument("--tiny", action="store_true", help="CPU plumbing check (module doc)")
    ap.add_argument("--gpt-fast-child", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.gpt_fast_child is None and a.out is None:
        ap.error("--out is required")
    if a.tiny:
        a.recipe, a.backends, a.new_tokens, a.samples, a.iters = "tiny-llama", "eager", 32, 2, 2
        a.device, a.dtype, a.compile = "cpu", "fp32", False
    else:
        a.device, a.dtype, a.compile = "cuda", "bf16", True
    return a


def run(a: argparse.Namespace) -> dict[str, Any]:
    from artifactcache.errors import AcacheError
    from artifactcache.recipes import load_recipe

    deadline = time.monotonic() + a.budget_s
    gdir = a.gpt_fast_dir.resolve()
    check_gpt_fast_dir(gdir)
    try:
        recipe = load_recipe(a.recipe)
    except AcacheError as e:
        raise PeerError(str(e)) from None
    config = a.gpt_fast_config or (None if a.tiny else GPT_FAST_CONFIGS.get(recipe.name))
    if config is None and not a.tiny:
        raise PeerError(f"no gpt-fast config for recipe {recipe.name}: pass --gpt-fast-config")
    model_args(gdir, recipe, config)  # shape mismatches fail here, before any process starts
    if a.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise PeerError("needs a CUDA GPU (--tiny checks the plumbing on CPU)")
    a.out = a.out.resolve()
    a.out.mkdir(parents=True, exist_ok=True)
    a.cache_dir = (a.cache_dir or a.out / "cache").resolve()
    report: dict[str, Any] = {
        "command": " ".join(["python benchmarks/gpt_fast_peer.py", *sys.argv[1:]]),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "host": platform.node(),
        "gpt_fast_source": gpt_fast_source(gdir),
        "setup": {
            "recipe": recipe.name,
            "gpt_fast_config": config,
            "device": a.device,
            "dtype": a.dtype,
            "new_tokens": a.new_tokens,
            "samples": a.samples,
            "iters": a.iters,
            "seed": a.seed,
            "compile": a.compile,
        },  # fmt: skip
        "gpt_fast": {"error": "not run"},
        "acache": [],
        "not_run": [],
    }
    cfg = {"gpt_fast_dir": str(gdir), "recipe": recipe.name, "config": config,
           "device": a.device, "dtype": a.dtype, "new_tokens": a.new_tokens,
           "samples": a.samples, "seed": a.seed, "compile": a.compile}  # fmt: skip
    parts = [("gpt-fast", None)] + [(f"acache {b}", b) for b in a.backends.split(",") if b]
    for what, backend in parts:
        left = deadline - time.monotonic()
        if left < MIN_PART_S:
            report["not_run"].append({"what": what, "why": f"{left:.0f} s of budget left"})
            continue
        if backend is None:
            report["gpt_fast"] = run_gpt_fast(cfg, a.out, left)
        else:
            report["acache"].append(run_acache(backend, a, left))
        add_ratios(report)
        write(report, a.out)
    return report


def write(report: dict[str, Any], out: Path) -> None:
    (out / "gpt_fast_peer.json").write_text(json.dumps(report, indent=2, default=str))
    (out / "gpt_fast_peer.md").write_text(markdown(report))


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    if a.gpt_fast_child is not None:
        print(json.dumps(gpt_fast_child(json.loads(a.gpt_fast_child))))
        return 0
    try:
        report = run(a)
    except PeerError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(markdown(report), end="")
    failed = [r for r in [report["gpt_fast"], *report["acache"]] if "error" in r]
    return 1 if failed or report["not_run"] else 0


if __name__ == "__main__":
    sys.exit(main())
