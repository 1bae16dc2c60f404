"""Why does AOTInductor loading segfault on the GPU image, and which load path works?

ENVIRONMENT.md records that ``torch._inductor.aoti_load_package`` segfaulted in
``_load_aoti`` in a fresh process on torch 2.11+cu130. This script builds two
packages of a decode step (weights inside; weights stripped) for a 2-layer model
with Llama-2-7B layer shapes, then tries each load path in its own fresh process
and records the exit code (−11 = SIGSEGV), the time to load, and whether the
output matches eager:

  A  aoti_load_package(pt2), no CUDA context created first
  B  aoti_load_package(pt2), after torch.zeros(1, device="cuda")
  C  stripped pt2 + load_constants(user_managed=True), after CUDA init
  D  AOTIModelPackageLoader on the already-unpacked directory (no extraction), after CUDA init
  E  like D for the stripped package, constants from the live model (user_managed)
  F  like A under cuda-gdb, to get the native backtrace of the crash

Usage (on the GPU machine):
    python benchmarks/aoti_load_probe.py --out $OUT/aoti_probe.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _model(device: str):
    import torch

    from artifactcache.models import build_model
    from artifactcache.recipes import load_recipe

    r = load_recipe("llama-7b")
    r = replace(r, model=replace(r.model, n_layers=2, vocab_size=32000))
    m = build_model(r, device=device, dtype="bf16")
    idx = torch.tensor([[15043]], device=device)
    pos = torch.tensor([5], device=device)
    return m, idx, pos


PACKAGES = {"inside", "stripped"}


def build(work: Path) -> dict:
    import torch

    m, idx, pos = _model("cuda")
    ref = m(idx, pos).float().cpu()
    torch.save(ref, work / "ref.pt")
    ep = torch.export.export(m, (idx, pos), strict=False)
    out = {}
    variants = {
        "inside": {},
        "stripped": {"aot_inductor.package_constants_in_so": False},
    }
    for name, opts in variants.items():
        if name not in PACKAGES:
            continue
        t0 = time.perf_counter()
        path = torch._inductor.aoti_compile_and_package(
            ep, package_path=str(work / f"{name}.pt2"), inductor_configs=opts
        )
        out[name] = {"build_s": time.perf_counter() - t0, "bytes": os.path.getsize(path)}
        unpacked = work / f"{name}_dir"
        with zipfile.ZipFile(path) as z:
            z.extractall(unpacked)
        out[name]["files"] = sorted(
            str(p.relative_to(unpacked)) for p in unpacked.rglob("*") if p.is_file()
        )[:40]
    return out


CHILD = r"""
import faulthandler, sys, time, json, torch
faulthandler.enable()
variant, work = sys.argv[1], sys.argv[2]
sys.path.insert(0, sys.argv[3])
t0 = time.perf_counter()
if variant != "A":
    torch.zeros(1, device="cuda")
t_ctx = time.perf_counter()
from torch._inductor import aoti_load_package
pkg = {"A": "inside.pt2", "B": "inside.pt2", "C": "stripped.pt2", "D": "inside_dir", "E": "stripped_dir"}[variant]
path = f"{work}/{pkg}"
if variant in ("D", "E"):
    from torch.export.pt2_archive._package import AOTICompiledModel
    loader = torch._C._aoti.AOTIModelPackageLoader(path, "model", False, 1, -1)
    runner = AOTICompiledModel(loader)
else:
    runner = aoti_load_package(path)
t_load = time.perf_counter()
if variant in ("C", "E"):
    sys.path.insert(0, sys.argv[3])
    import importlib.util
    spec = importlib.util.spec_from_file_location("probe", sys.argv[3] + "/benchmarks/aoti_load_probe.py")
    mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)
    m, _, _ = mod._model("cuda")
    sd = {**dict(m.named_parameters()), **dict(m.named_buffers())}
    fqns = runner.get_constant_fqns()
    missing = [f for f in fqns if f not in sd]
    runner.load_constants({f: sd[f] for f in fqns if f in sd}, check_full_update=True, user_managed=True)
t_const = time.perf_counter()
idx = torch.tensor([[15043]], device="cuda"); pos = torch.tensor([5], device="cuda")
out = runner(idx, pos)
out = out[0] if isinstance(out, (list, tuple)) else out
torch.cuda.synchronize()
t_run = time.perf_counter()
ref = torch.load(f"{work}/ref.pt")
err = ((out.float().cpu() - ref).abs().max() / ref.abs().max()).item()
print(json.dumps({"ctx_s": t_ctx - t0, "load_s": t_load - t_ctx, "constants_s": t_const - t_load,
                  "first_call_s": t_run - t_const, "max_rel_err": err,
                  "n_constants": len(runner.get_constant_fqns())}))
"""


def run_child(variant: str, work: Path, gdb: bool = False) -> dict:
    cmd = [sys.executable, "-c", CHILD, variant, str(work), str(ROOT)]
    if gdb:
        cmd = [
            "cuda-gdb",
            "-batch",
            "-ex",
            "set pagination off",
            "-ex",
            "run",
            "-ex",
            "bt 30",
            "--args",
            *cmd,
        ]
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=150)
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"") + (e.stderr or b"")
        text = out.decode(errors="replace") if isinstance(out, bytes) else out
        return {"variant": variant, "rc": "timeout", "tail": text[-6000:]}
    res = {"variant": variant, "rc": p.returncode, "wall_s": time.perf_counter() - t0}
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
    if lines:
        res.update(json.loads(lines[-1]))
    text = p.stdout + p.stderr
    if gdb:  # keep the whole native backtrace, from frame #0
        i = text.find("#0 ")
        res["tail"] = text[max(0, i - 3000) :][:20000]
    else:
        res["tail"] = text[-2500:] if p.returncode else ""
    return res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--variants", default="ABCDE", help="load paths to try (see the docstring)")
    ap.add_argument("--gdb-variant", default="A")
    args = ap.parse_args()
    PACKAGES.clear()
    PACKAGES.update({"inside"} if set(args.variants) & set("ABD") else set())
    PACKAGES.update(
        {"stripped"} if set(args.variants) & set("CE") or args.gdb_variant == "C" else set()
    )
    import torch

    work = Path(tempfile.mkdtemp(prefix="aoti_probe_"))
    report: dict = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "gpu": torch.cuda.get_device_name(0),
        "command": " ".join(sys.argv),
        "has_runner_cuda": hasattr(torch._C._aoti, "AOTIModelContainerRunnerCuda"),
    }
    report["build"] = build(work)
    out = Path(args.out)
    report["loads"] = []
    for v in args.variants:  # written after each step: a call cut short keeps what ran
        report["loads"].append(run_child(v, work))
        out.write_text(json.dumps(report, indent=2))
    if shutil.which("cuda-gdb") and any(ld["rc"] != 0 for ld in report["loads"]):
        report["gdb"] = run_child(args.gdb_variant, work, gdb=True)
    Path(args.out).write_text(json.dumps(report, indent=2))
    print(json.dumps({k: v for k, v in report.items() if k != "gdb"}, indent=1)[:6000])
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
