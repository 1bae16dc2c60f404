"""Per-backend evidence the seed table does not give, for one recipe, in one call.

For each backend (default eager, inductor, aoti):

* **build**: ``acache build --json`` in a fresh process with empty framework
  caches: build seconds and entry bytes;
* **agreement with eager**: in one process, ``logits(prompt)`` of every backend
  against eager's (max |diff| / max |eager|, and whether the argmax agrees at every
  prompt position), plus greedy generation of ``--gen`` tokens compared token by
  token;
* **aoti decode with and without its CUDA graph** (CUDA only): ``acache bench``
  with ``ACACHE_CUDA_GRAPHS=1`` and ``=0`` on the same entry, decode tok/s each.

Writes OUT/evidence.json and OUT/evidence.md (date, machine, versions, command).
The tolerance for "agrees" is a stated input (``--rtol``; 2e-2 suits bf16's
8 bits of mantissa over a 32-layer model), never tuned after the fact.

On the GPU machine (repo root):

    python benchmarks/backend_evidence.py llama-7b --device cuda --dtype bf16 --out OUT

On CPU, as a check of the script itself:

    python benchmarks/backend_evidence.py tiny-llama --out /tmp/evidence
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def _cli(args: list[str], env: dict[str, str]) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "artifactcache.cli", *args, "--json"]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if out.returncode != 0:
        return {"error": (out.stderr.strip().splitlines() or ["no output"])[-1]}
    return json.loads(out.stdout)


def _fresh_env(cache: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a fresh process: our cache, every framework cache empty."""
    from artifactcache.measure.coldstart import fresh_framework_dirs

    dirs = fresh_framework_dirs(Path(tempfile.mkdtemp(prefix="acache-evidence-")))
    return {
        **os.environ,
        "ACACHE_DIR": str(cache),
        **{var: str(d) for var, d in dirs.items()},
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
        **(extra or {}),
    }


def first_difference(a: list[int], b: list[int]) -> int | None:
    """The first index where two token lists differ, or None."""
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y), None)


def _vs_exact(got: Any, ids: list[int], exact: Any, exact_ids: list[int]) -> dict[str, Any]:
    """How far a low-precision run is from the fp32 computation on the same weights."""
    return {
        "max_rel_err_vs_fp32": float((got - exact).abs().max() / exact.abs().max()),
        "first_token_differing_from_fp32": first_difference(ids, exact_ids),
    }


def agreement(
    recipe: str,
    variants: dict[str, dict[str, Any]],
    common: dict[str, Any],
    n_gen: int,
    rtol: float,
    *,
    fp32_yardstick: bool = True,
):
    """Logits and greedy tokens of each variant against eager's, in one process.

    ``variants`` maps a label to its extra ``api.load`` kwargs; the label is the backend
    unless the kwargs name one (``"backend"``), so two builds of one backend compare
    side by side. Each is loaded, never built. In low precision, with
    ``fp32_yardstick``, eager's own distance from the fp32 computation is the entry
    ``"eager"`` (a variant may not take that label then).
    """
    import torch

    from artifactcache import api
    from artifactcache.recipes import load_recipe

    prompt = list(load_recipe(recipe).bench.prompt_ids)
    ref = api.load(recipe, "eager", **common)
    want = ref.logits(prompt)
    want_ids = ref.generate(prompt, n_gen)
    out: dict[str, Any] = {}
    exact = exact_ids = None
    if fp32_yardstick and "eager" in variants:
        raise ValueError("the label 'eager' is the fp32 yardstick's: name the variant otherwise")
    if fp32_yardstick and common["dtype"] != "fp32" and isinstance(ref.keepalive, torch.nn.Module):
        # The same (bf16-rounded) weights computed in fp32: how far eager itself is
        # from exact arithmetic is the yardstick for how far a compiled backend is
        # from eager. Random weights give near-tied logits, so greedy paths part
        # early in any low-precision run; this says whether compiling parts them
        # sooner than eager's own rounding does.
        ref.keepalive.float()
        exact, exact_ids = ref.logits(prompt), ref.generate(prompt, n_gen)
        out["eager"] = _vs_exact(want, want_ids, exact, exact_ids)
    del ref
    for label, given in variants.items():
        kwargs = {**common, **given}
        backend = kwargs.pop("backend", label)
        runner = api.load(recipe, backend, build_on_miss=False, **kwargs)
        got = runner.logits(prompt)
        ids = runner.generate(prompt, n_gen)
        rel = float((got - want).abs().max() / want.abs().max())
        same = first_difference(ids, want_ids)
        out[label] = {
            "max_rel_err": rel,
            "within_rtol": rel <= rtol,
            "argmax_agrees_at_every_position": bool(torch.equal(got.argmax(-1), want.argmax(-1))),
            "tokens_equal": same is None,
            "first_differing_token": same,
            "tokens": ids,
            "runner_info": dict(getattr(runner, "info", {}) or {}),
        }
        if exact is not None:
            out[label].update(_vs_exact(got, ids, exact, exact_ids))
        del runner
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("recipe")
    p.add_argument("--backends", default="eager,inductor,aoti")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="fp32")
    p.add_argument("--mode", default=None, help="inductor mode (default: reduce-overhead on CUDA)")
    p.add_argument("--gen", type=int, default=32, help="greedy tokens compared with eager")
    p.add_argument("--rtol", type=float, default=None, help="default: 1e-4 fp32, 2e-2 bf16/fp16")
    p.add_argument("--cache-dir", type=Path, default=None, help="default: a fresh temp dir")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    rtol = args.rtol if args.rtol is not None else (1e-4 if args.dtype == "fp32" else 2e-2)
    mode = args.mode or ("reduce-overhead" if args.device.startswith("cuda") else None)
    cache = (args.cache_dir or Path(tempfile.mkdtemp(prefix="acache-evidence-cache-"))).resolve()
    cache.mkdir(parents=True, exist_ok=True, mode=0o700)
    args.out.mkdir(parents=True, exist_ok=True)
    base = [args.recipe, "--device", args.device, "--dtype", args.dtype]
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())

    builds: dict[str, Any] = {}
    for b in backends:
        flags = ["--mode", mode] if (b == "inductor" and mode) else []
        t0 = time.perf_counter()
        builds[b] = _cli(["build", *base, "-b", b, *flags], _fresh_env(cache))
        builds[b]["process_seconds"] = round(time.perf_counter() - t0, 2)
        # Where the build's time went, as the backend recorded it (aoti: compiler
        # probe, export and compile of each step).
        for rec in Path(builds[b].get("path", "/nonexistent")).rglob(f"{b}.json"):
            builds[b]["compile_seconds"] = json.loads(rec.read_text()).get("compile_seconds")
        print(f"[evidence] build {b}: {builds[b]}", file=sys.stderr, flush=True)

    import torch

    from artifactcache.keys import toolchain_fingerprint

    common = {"device": args.device, "dtype": args.dtype, "cache_dir": cache}
    # The inductor entry was built with --mode: load it with the same mode.
    compared = {
        b: ({"mode": mode} if (b == "inductor" and mode) else {})
        for b in backends
        if b != "eager" and "error" not in builds[b]
    }
    agree = agreement(args.recipe, compared, common, args.gen, rtol)
    print(f"[evidence] agreement: {agree}", file=sys.stderr, flush=True)

    graphs: dict[str, Any] = {}
    if "aoti" in backends and args.device.startswith("cuda") and "error" not in builds["aoti"]:
        for flag in ("1", "0"):
            env = _fresh_env(cache, {"ACACHE_CUDA_GRAPHS": flag})
            r = _cli(["bench", *base, "-b", "aoti", "--iters", "5"], env)
            graphs[f"ACACHE_CUDA_GRAPHS={flag}"] = {
                k: r.get(k) for k in ("decode_tok_s", "roofline_pct", "runner_info", "error")
            }
            print(f"[evidence] aoti graphs={flag}: {graphs[f'ACACHE_CUDA_GRAPHS={flag}']}",
                  file=sys.stderr, flush=True)  # fmt: skip

    env_info = {
        "python": platform.python_version(),
        **toolchain_fingerprint(
            ("torch", "triton") if args.device.startswith("cuda") else ("torch",)
        ),
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }
    result = {
        "started": started,
        "command": "python benchmarks/backend_evidence.py "
        + " ".join(shlex.quote(a) for a in (sys.argv[1:] if argv is None else argv)),
        "recipe": args.recipe,
        "device": args.device,
        "dtype": args.dtype,
        "inductor_mode": mode,
        "rtol": rtol,
        "environment": env_info,
        "builds": builds,
        "agreement_with_eager": agree,
        "aoti_cuda_graph_ab": graphs,
    }
    (args.out / "evidence.json").write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    lines = [
        f"# Backend evidence: {args.recipe} ({args.device}, {args.dtype})",
        "",
        f"- date: {started}; command: `{result['command']}`",
        f"- environment: {json.dumps(env_info, sort_keys=True)}",
        f"- agreement tolerance: max |diff| / max |eager logits| <= {rtol:g}",
        "",
        "| backend | build s (process s) | entry bytes | max rel err vs eager | argmax agrees "
        f"| {args.gen} greedy tokens equal (first difference) | max rel err vs fp32 "
        "| first token differing from fp32 greedy |",
        "|---|---:|---:|---:|---|---|---:|---:|",
    ]
    for b in backends:
        bd, ag = builds[b], agree.get(b, {})
        if "error" in bd:
            lines.append(f"| {b} | failed: {bd['error']} | | | | | | |")
            continue
        err = f"{ag['max_rel_err']:.2e}" if "max_rel_err" in ag else "– (the reference)"
        exact = (
            f"{ag['max_rel_err_vs_fp32']:.2e} | {ag['first_token_differing_from_fp32']}"
            if "max_rel_err_vs_fp32" in ag
            else "– | –"
        )
        lines.append(
            f"| {b} | {bd.get('seconds', 0):.1f} ({bd['process_seconds']:.1f}) | {bd.get('bytes')} "
            f"| {err} | {ag.get('argmax_agrees_at_every_position', '–')} "
            f"| {ag.get('tokens_equal', '–')} ({ag.get('first_differing_token', '–')}) "
            f"| {exact} |"
        )
    for b in backends:
        if builds[b].get("compile_seconds"):
            lines.append(f"\n{b} build breakdown (s): {builds[b]['compile_seconds']}")
    if graphs:
        lines += ["", "| aoti decode | tok/s | % roofline | runner |", "|---|---:|---:|---|"]
        for k, v in graphs.items():
            lines.append(
                f"| {k} | {v.get('decode_tok_s')} | {v.get('roofline_pct')} "
                f"| {v.get('runner_info') or v.get('error')} |"
            )
    (args.out / "evidence.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
