"""Prefill against the compute roofline (issue 30): time to first token by prompt length.

Each part runs in a fresh process (a failure loses only that part, and frees its GPU):
1. ``env``: versions, the GPU, the dense ``--dtype`` matmul rate (n=8192 on CUDA, 1024 on
   CPU, best of 5 rounds): the FLOP roofline;
2. ``acache build --json`` per backend at ``--max-seq-len``, ``--jobs`` side by side,
   each with a fresh Inductor cache dir;
3. ``transformers``: from_config of the recipe's equivalent config (the trt backend's),
   SDPA, holding acache's own seeded random weights (its state dict: HF's names); TTFT =
   one forward with use_cache=True, logits_to_keep=1, and the argmax;
4. per backend (eager, the reference, first), one process loads the entry (no build on a
   miss), times ``runner.generate(ids, 1)`` at each ``--prompt-lens`` (a warm-up, then
   ``--reps`` runs between synchronizations), takes at ``--check-len`` tokens the last
   logits and ``--gen`` greedy tokens (against eager's and transformers'), then the seed
   request's decode tok/s (bench prompt, 200 new tokens, as ``acache bench`` counts them).

Prefill FLOPs of n tokens = 2 x params x n + 2 x n_layers x n^2 x n_heads x head_dim
(causal QK^T and PV; fewer pairs in a sliding window); params = every weight but the
input embedding (the LM head included), as acache's sizing counts them. tok/s and %
of roofline use the p50.

    python benchmarks/prefill_ttft.py                      # H200: llama-7b bf16, 4096
    python benchmarks/prefill_ttft.py --recipe tiny-llama --device cpu --dtype fp32 \\
        --backends eager --prompt-lens 4,16,40 --max-seq-len 64 --reps 2 --out /tmp/pt

Writes OUT/prefill_ttft.json (after every part), OUT/results.md and OUT/logs/.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import random
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def prompt(vocab: int, n: int) -> list[int]:
    """The first n of one fixed pseudo-random sequence (a BOS, then ids past the specials)."""
    rng = random.Random(30)
    return [1] + [rng.randrange(3, vocab) for _ in range(n - 1)]


def _timed(fn: Any, ids: list[int], sync: Any, reps: int) -> dict[str, Any]:
    fn(ids)  # warm-up: first use of a shape may compile, tune or capture a graph
    times = []
    for _ in range(reps):
        sync()
        t = time.perf_counter()
        fn(ids)
        sync()
        times.append(time.perf_counter() - t)
    return {"min_s": min(times), "p50_s": statistics.median(times), "times_s": times}


def _transformers(spec: dict[str, Any], recipe: Any, dev: Any, out: dict[str, Any]) -> Any:
    """(first token of a prompt, (last logits, greedy tokens) of a prompt) of transformers."""
    import torch
    import transformers as T

    from artifactcache.backends.tensorrt.llm import hf_config
    from artifactcache.dtypes import torch_dtype
    from artifactcache.models import WeightsSpec, build_model

    cfg = hf_config(recipe, spec["dtype"])  # the recipe's architecture as config.json says it
    cfg = {k: v for k, v in cfg.items() if k not in ("architectures", "torch_dtype")}
    config = T.AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    weights = WeightsSpec(seed=spec["seed"])  # what every acache backend starts from
    src = build_model(recipe, device=dev, dtype=spec["dtype"], weights=weights)
    with dev:
        hf = T.AutoModelForCausalLM.from_config(
            config, dtype=torch_dtype(spec["dtype"]), attn_implementation="sdpa"
        )
    hf = hf.to(dev).eval()
    missing, unexpected = hf.load_state_dict(src.state_dict(), strict=False)
    del src
    if missing:
        raise RuntimeError(f"acache's state dict lacks {missing[:5]} ({len(missing)})")
    out.update(unexpected_keys=list(unexpected), attn=hf.config._attn_implementation)
    keep = {"logits_to_keep": 1}

    @torch.inference_mode()
    def forward(ids: list[int], **kw: Any) -> Any:
        x = torch.tensor([ids], device=dev)
        try:
            return hf(input_ids=x, use_cache=True, **keep, **kw)
        except TypeError:  # a transformers without logits_to_keep
            keep.clear()
            return hf(input_ids=x, use_cache=True, **kw)

    def check(ids: list[int]) -> tuple[Any, list[int]]:
        res = forward(ids)
        logits = res.logits[0, -1].float().cpu()
        tokens = [int(logits.argmax())]
        for _ in range(spec["gen"] - 1):
            res = forward([tokens[-1]], past_key_values=res.past_key_values)
            tokens.append(int(res.logits[0, -1].argmax()))
        out["logits_to_keep"] = bool(keep)
        return logits, tokens

    return (lambda ids: int(forward(ids).logits[0, -1].argmax())), check


def _dynamo_graphs() -> int | None:
    """Graphs Dynamo compiled in this process so far (None where it never loaded)."""
    if "torch._dynamo" not in sys.modules:
        return None
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def _child(spec: dict[str, Any]) -> None:
    import torch

    from artifactcache.recipes import load_recipe

    out: dict[str, Any] = {}

    def save() -> None:
        Path(spec["result"]).write_text(json.dumps(out))

    dev = torch.device(spec["device"])

    def sync() -> None:
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    recipe = load_recipe(spec["recipe"]).with_shapes(max_seq_len=spec["max_seq_len"])
    if spec["part"] == "env":
        from artifactcache.measure.child.timing import matmul_flops

        out["gpu"] = torch.cuda.get_device_name(dev) if dev.type == "cuda" else None
        try:
            out["transformers"] = version("transformers")
        except PackageNotFoundError:
            out["transformers"] = None
        out.update(torch=torch.__version__, cuda=torch.version.cuda)
        save()
        out["matmul"] = matmul_flops(dev, spec["dtype"], spec["gemm_n"])  # best of 5 rounds
        save()
        return
    t0 = time.perf_counter()
    runner = None
    if spec["part"] == "hf":
        first, check = _transformers(spec, recipe, dev, out)
    else:
        import artifactcache

        backend, quant = variant(spec["backend"])
        runner = artifactcache.load(
            spec["recipe"], backend=backend, quant=quant, device=spec["device"],
            dtype=spec["dtype"], max_seq_len=spec["max_seq_len"], cache_dir=spec["cache"],
            seed=spec["seed"], extra=dict(kv.split("=", 1) for kv in spec["extra"]),
            build_on_miss=False,
        )  # fmt: skip
        out["runner_info"] = dict(getattr(runner, "info", {}) or {})

        def first(ids: list[int]) -> Any:
            return runner.generate(ids, 1, eos_token_ids=())

        def check(ids: list[int]) -> tuple[Any, list[int]]:
            logits = runner.logits(ids)[-1].float().cpu()
            return logits, runner.generate(ids, spec["gen"], eos_token_ids=())

    out.update(load_s=time.perf_counter() - t0, prefill={})
    out["graphs_after_load"] = _dynamo_graphs()
    save()
    vocab = recipe.model.vocab_size
    for n in spec["lens"]:
        out["prefill"][n] = _timed(first, prompt(vocab, n), sync, spec["reps"])
        save()
        ms = out["prefill"][n]["p50_s"] * 1e3
        print(f"[prefill]   {spec['name']} prompt {n}: p50 {ms:.1f} ms", flush=True)
    # More graphs than after the load: a prompt length made the warm process compile.
    out["graphs_after_prefill"] = _dynamo_graphs()
    logits, tokens = check(prompt(vocab, spec["check_len"]))
    torch.save(logits, spec["logits"])
    out["check"] = {"n": spec["check_len"], "tokens": tokens}
    save()
    if runner is not None:
        from artifactcache.measure.bench import resolve_new_tokens
        from artifactcache.measure.child.timing import measure_requests

        seed = list(recipe.bench.prompt_ids)
        new = spec["decode_tokens"] or resolve_new_tokens(recipe, None)
        r = measure_requests(runner, [seed], new, iters=spec["decode_iters"], warmup=1, device=dev)
        keys = ("new_tokens", "iters", "decode_tok_s", "prefill_median_s", "request_median_s")
        out["decode"] = {k: r[k] for k in keys}
        save()


def variant(name: str) -> tuple[str, str | None]:
    """(backend, --quant) of a ``--backends`` entry: ``aoti`` or ``aoti+int4wo``."""
    backend, _, quant = name.partition("+")
    return backend, quant or None


def gpu_slug(device: str) -> str:
    """The GPU's name as nvidia-smi says it (this process starts no CUDA), e.g. h200."""
    if not device.startswith("cuda") or not shutil.which("nvidia-smi"):
        return device.split(":")[0]
    cmd = ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"]
    name = subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout
    return "-".join((name.splitlines() or ["gpu"])[0].lower().replace("nvidia", "").split())


def last_line(log: Path, default: str) -> str:
    lines = log.read_text().strip().splitlines() if log.exists() else []
    return (lines[-1] if lines else default)[:400]


class Run:
    def __init__(self, args: argparse.Namespace):
        self.a, self.t0 = args, time.perf_counter()

    def left(self) -> float:
        return self.a.budget_s - (time.perf_counter() - self.t0)

    def env(self, name: str) -> dict[str, str]:
        path = os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])
        inductor = str(self.a.work / "inductor" / name)  # a fresh cache dir per process
        return {**os.environ, "PYTHONPATH": path, "TORCHINDUCTOR_CACHE_DIR": inductor}

    def proc(self, cmd: list[str], name: str, log: Path, pipe: bool) -> tuple[int | None, str]:
        """(exit status, None past the timeout; stdout if ``pipe``, else it is ours) of cmd, its
        stderr to ``log``; in a process group of its own, so that a timeout ends its workers."""
        with open(log, "w") as f:
            out = subprocess.PIPE if pipe else None
            p = subprocess.Popen(cmd, stdout=out, stderr=f, env=self.env(name),
                                 text=True, start_new_session=True)  # fmt: skip
            try:
                text = p.communicate(timeout=min(self.a.timeout_s, self.left()))[0]
                return p.returncode, text or ""
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.communicate()
                return None, ""

    def child(self, name: str, **spec: Any) -> dict[str, Any]:
        a, timeout = self.a, min(self.a.timeout_s, self.left())
        if self.left() < 10:
            return {"error": "not run: --budget-s spent"}
        spec.update(recipe=a.recipe, device=a.device, dtype=a.dtype, max_seq_len=a.max_seq_len,
                    reps=a.reps, seed=a.seed, name=name, result=str(a.work / f"{name}.json"),
                    logits=str(a.work / f"logits-{name}.pt"))  # fmt: skip
        (a.work / f"{name}-spec.json").write_text(json.dumps(spec))
        cmd = [sys.executable, __file__, "--child", str(a.work / f"{name}-spec.json")]
        print(f"[prefill] {name}: start ({timeout:.0f} s at most)", flush=True)
        t0, log = time.perf_counter(), a.out / "logs" / f"{name}.log"
        rc, _ = self.proc(cmd, name, log, pipe=False)  # its progress lines on our stdout
        res = Path(spec["result"])  # what the child saved before any failure is kept
        out = json.loads(res.read_text()) if res.exists() else {}
        if rc != 0:
            err = f"exit {rc}" if rc is not None else f"timed out after {timeout:.0f} s"
            out["error"] = f"{err} ({last_line(log, 'the log is empty')})"
        out["wall_s"] = round(time.perf_counter() - t0, 1)
        print(f"[prefill] {name}: {out.get('error') or 'ok'} ({out['wall_s']:.0f} s)", flush=True)
        return out

    def build(self, b: str) -> dict[str, Any]:
        a = self.a
        backend, quant = variant(b)
        cmd = [sys.executable, "-m", "artifactcache.cli", "build", a.recipe, "--backend", backend,
               "--device", a.device, "--dtype", a.dtype, "--max-seq-len", str(a.max_seq_len),
               "--seed", str(a.seed), "--cache-dir", str(a.cache), "--json"]  # fmt: skip
        cmd += [f"--extra={kv}" for kv in a.extra] + (["--quant", quant] if quant else [])
        print(f"[prefill] build {b}: start", flush=True)
        t0, log = time.perf_counter(), a.out / "logs" / f"build-{b}.log"
        rc, stdout = self.proc(cmd, f"build-{b}", log, pipe=True)
        row = json.loads(stdout) if rc == 0 else {}
        row = {k: row[k] for k in ("seconds", "status", "key", "bytes") if k in row}
        if rc != 0:
            err = f"exit {rc}" if rc is not None else "timed out"
            row["error"] = f"{err} ({last_line(log, 'the log is empty')})"
        row["wall_s"] = round(time.perf_counter() - t0, 1)
        print(f"[prefill] build {b}: {row}", flush=True)
        return row


def derive(report: dict[str, Any], work: Path) -> None:
    """tok/s and % of roofline per length; logits and tokens against eager and transformers."""
    import torch

    from artifactcache.measure.prefill import recipe_prefill_flops
    from artifactcache.recipes import load_recipe

    s, results = report["settings"], report["results"]
    recipe = load_recipe(s["recipe"])
    peak = (report["env"].get("matmul") or {}).get("tflops")
    formula = "artifactcache.measure.prefill.prefill_flops (what acache bench --prompt-len counts)"
    params = recipe_prefill_flops(recipe, s["dtype"], 1)["parameters"]
    report["flops"] = {"params_without_embedding": params, "peak_tflops": peak, "of_n": formula}
    for res in results.values():
        for n, t in (res.get("prefill") or {}).items():
            flops = recipe_prefill_flops(recipe, s["dtype"], int(n))["total"]
            n = int(n)
            tflops = flops / t["p50_s"] / 1e12
            pct = 100 * tflops / peak if peak else None
            t.update(flops=flops, tok_s=n / t["p50_s"], tflops=tflops, roofline_pct=pct)
    logits = {b: torch.load(work / f"logits-{b}.pt") for b in results
              if (work / f"logits-{b}.pt").exists()}  # fmt: skip
    refs = {r: results.get(r, {}).get("check", {}).get("tokens") for r in ("eager", "transformers")}
    for b, res in results.items():
        c = res.get("check")
        if c and "eager" in logits and b in logits:
            c["max_abs_diff_vs_eager"] = float((logits[b] - logits["eager"]).abs().max())
            c["argmax_agrees_with_eager"] = bool(logits[b].argmax() == logits["eager"].argmax())
        for name, ref in refs.items():
            if c and ref and b != name:
                diff = [i for i, (x, y) in enumerate(zip(c["tokens"], ref)) if x != y]  # noqa: B905
                c[f"first_token_differing_from_{name}"] = diff[0] if diff else None


def markdown(report: dict[str, Any]) -> str:
    s, env, res = report["settings"], report["env"], report["results"]
    mm = env.get("matmul") or {}
    where = f"{s['recipe']}, {s['dtype']}, {s['device']}, max_seq_len {s['max_seq_len']}"
    lines = [
        f"# Prefill TTFT: {where}", "",
        f"- {report['date']}, {report['host']}, {env.get('gpu') or s['device']}; torch "
        f"{env.get('torch')}, transformers {env.get('transformers')}; commit {report['commit']}",
        f"- command: `{report['command']}`; wall {report.get('wall_s', 0):.0f} s",
        f"- roofline: dense {s['dtype']} matmul (n={mm.get('n')}) {mm.get('tflops') or 0:.4g} "
        f"TFLOP/s; prefill FLOPs {report['flops']['of_n']}, params "
        f"{report['flops']['params_without_embedding']:,} (all but the input embedding)",
        f"- tok/s and % use the p50 of {s['reps']} runs after one warm-up; prompts "
        f"that do not fit max_seq_len, skipped: {s['skipped_lens'] or 'none'}", "",
        "| backend | prompt | TTFT min ms | TTFT p50 ms | prefill tok/s | TFLOP/s "
        "| % FLOP roofline |", "|---|---:|---:|---:|---:|---:|---:|",
    ]  # fmt: skip
    for b, r in res.items():
        if r.get("error"):
            lines.append(f"| {b} | error: {r['error'].replace('|', '/')} | | | | | |")
        for n, t in (r.get("prefill") or {}).items():
            pct = "" if t.get("roofline_pct") is None else f"{t['roofline_pct']:.1f}"
            cells = [b, n, f"{t['min_s'] * 1e3:.1f}", f"{t['p50_s'] * 1e3:.1f}",
                     f"{t.get('tok_s', 0):.0f}", f"{t.get('tflops', 0):.3g}", pct]  # fmt: skip
            lines.append("| " + " | ".join(str(x) for x in cells) + " |")
    lines += ["", f"| backend | build s (wall s) | load s | decode tok/s (seed) | check prompt "
              f"| last logits max abs diff vs eager | argmax = eager | first of {s['gen']} "
              "greedy tokens != transformers (!= eager) |",
              "|---|---:|---:|---:|---:|---:|---|---|"]  # fmt: skip
    for b, r in res.items():
        bd, c, d = report["builds"].get(b, {}), r.get("check") or {}, r.get("decode") or {}
        build = (f"failed: {bd['error']}" if "error" in bd else
                 f"{bd['seconds']:.1f} ({bd['wall_s']:.0f})" if bd else "–")  # fmt: skip
        diff, tok = c.get("max_abs_diff_vs_eager"), d.get("decode_tok_s")
        cells = [b, build, f"{r['load_s']:.1f}" if "load_s" in r else "",
                 "" if tok is None else f"{tok:.1f}", c.get("n", ""),
                 "" if diff is None else f"{diff:.3g}", c.get("argmax_agrees_with_eager", ""),
                 f"{c.get('first_token_differing_from_transformers', '–')} "
                 f"({c.get('first_token_differing_from_eager', '–')})"]  # fmt: skip
        lines.append("| " + " | ".join(str(x) for x in cells) + " |")
    lines.append("\nfirst differing token: None = all equal; – = no reference to compare with.")
    return "\n".join(lines) + "\n"


def main() -> int:
    def ints(text: str) -> list[int]:
        return [int(v) for v in text.split(",") if v.strip()]

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--recipe", default="llama-7b")
    ap.add_argument("--backends", default="aoti,inductor,eager", help="aoti+int4wo: quantized")
    ap.add_argument("--prompt-lens", type=ints, default=[16, 128, 512, 2000, 4000])
    ap.add_argument("--max-seq-len", type=int, default=4096)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--seed", type=int, default=0, help="of the random weights")
    ap.add_argument("--reps", type=int, default=5, help="timed runs per prompt length")
    ap.add_argument("--check-len", type=int, default=2000, help="prompt of the logits check")
    ap.add_argument("--gen", type=int, default=16, help="greedy tokens compared")
    ap.add_argument("--decode-tokens", type=int, default=0, help="0: the recipe's (200)")
    ap.add_argument("--decode-iters", type=int, default=3)
    ap.add_argument("--gemm-n", type=int, default=None, help="default 8192 (CUDA), 1024")
    ap.add_argument("--extra", action="append", default=[], help="KEY=VALUE: build + load")
    ap.add_argument("--no-transformers", action="store_true")
    ap.add_argument("--jobs", type=int, default=2, help="builds at a time")
    ap.add_argument("--budget-s", type=float, default=570, help="no part runs past it")
    ap.add_argument("--timeout-s", type=float, default=300, help="per build or process")
    ap.add_argument("--cache-dir", type=Path, help="default: a fresh dir under /tmp")
    ap.add_argument("--out", type=Path, help="default: benchmarks/results/prefill-GPU-DATE")
    ap.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        _child(json.loads(args.child.read_text()))
        return 0
    date = datetime.datetime.now(datetime.timezone.utc)
    name = f"prefill-{gpu_slug(args.device)}-{date:%Y-%m-%d}"
    args.out = (args.out or REPO / "benchmarks" / "results" / name).resolve()
    (args.out / "logs").mkdir(parents=True, exist_ok=True)
    args.work = Path(tempfile.mkdtemp(prefix="prefill-ttft-"))
    args.cache = (args.cache_dir or args.work / "cache").resolve()
    args.cache.mkdir(mode=0o700, parents=True, exist_ok=True)
    backends = [b for b in args.backends.split(",") if b]
    lens = [n for n in args.prompt_lens if n < args.max_seq_len]  # n + 1 positions must fit
    check_len = max(1, min(args.check_len, args.max_seq_len - args.gen))
    git = ["git", "-C", str(REPO), "rev-parse", "HEAD"]
    has_git = shutil.which("git") and (REPO / ".git").exists()  # a copied tree may have neither
    commit = subprocess.run(git, capture_output=True, text=True).stdout.strip() if has_git else None
    settings = {k: v for k, v in vars(args).items() if k not in ("child", "work", "cache_dir")}
    settings.update(backends=backends, prompt_lens=lens, check_len=check_len,
                    skipped_lens=[n for n in args.prompt_lens if n not in lens])  # fmt: skip
    report: dict[str, Any] = {
        "command": shlex.join(["python", "benchmarks/prefill_ttft.py", *sys.argv[1:]]),
        "date": date.isoformat(timespec="seconds"), "host": platform.node(), "commit": commit,
        "machine": {"platform": platform.platform(), "python": platform.python_version(),
                    "cpus": os.cpu_count()},
        "settings": json.loads(json.dumps(settings, default=str)),
        "env": {}, "builds": {}, "results": {},
    }  # fmt: skip
    run, path = Run(args), args.out / "prefill_ttft.json"

    def save() -> None:
        report["wall_s"] = round(time.perf_counter() - run.t0, 1)
        path.write_text(json.dumps(report, indent=2))

    common = {"lens": lens, "check_len": check_len, "gen": args.gen}
    report["env"] = env = run.child("env", part="env", gemm_n=args.gemm_n)
    tflops = (env.get("matmul") or {}).get("tflops") or 0
    print(f"[prefill] {env.get('gpu') or args.device}: matmul {tflops:.1f} TFLOP/s", flush=True)
    save()
    with ThreadPoolExecutor(args.jobs) as pool:  # --jobs builds side by side
        report["builds"] = dict(zip(backends, pool.map(run.build, backends), strict=True))
    save()
    if not args.no_transformers:
        report["results"]["transformers"] = run.child("transformers", part="hf", **common)
        save()
    for b in sorted(backends, key=lambda b: b != "eager"):  # the reference first
        if "error" in report["builds"][b]:
            report["results"][b] = {"error": "build failed: " + report["builds"][b]["error"]}
            continue
        report["results"][b] = run.child(b, part="backend", backend=b, cache=str(args.cache),
                                         extra=args.extra,
                                         decode_tokens=args.decode_tokens,
                                         decode_iters=args.decode_iters, **common)  # fmt: skip
        save()
    derive(report, args.work)
    save()
    (args.out / "results.md").write_text(markdown(report))
    print("\n" + markdown(report))
    print(f"[prefill] wrote {path}, results.md, logs/ (entries in {args.cache})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
