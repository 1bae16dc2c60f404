"""What the guards of a saved compiled step cost its load, on CPU (issue 31).

A saved step takes the model as its first argument, so Dynamo's default guards cover
every parameter (a tensor guard each) and the modules' attributes, and a warm process
unpickles and rebuilds all of them. ``torch_private.step_guards_kept`` keeps only the
tensor guards of the other inputs. This compiles one step of a model with llama-7b's
parameter count (32 blocks: 7 Linear + 2 norm weights each, tiny widths, so the compile
stays short) both ways, saves each, then times ``load_compiled_step``, the first call and
the mean of 200 more (guards are checked on every call) in ``--runs`` fresh processes
per variant, interleaved.

    python benchmarks/step_guards.py --runs 5 --out OUT.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

MODEL = """
import torch
class Block(torch.nn.Module):
    def __init__(self, d):
        super().__init__()
        self.qkv = torch.nn.ModuleList(torch.nn.Linear(d, d, bias=False) for _ in range(3))
        self.o = torch.nn.Linear(d, d, bias=False)
        self.mlp = torch.nn.ModuleList(torch.nn.Linear(d, d, bias=False) for _ in range(3))
        self.n1 = torch.nn.Parameter(torch.ones(d))
        self.n2 = torch.nn.Parameter(torch.ones(d))
    def forward(self, x):
        h = x * self.n1
        q, k, v = (p(h) for p in self.qkv)
        x = x + self.o(q * k.sigmoid() + v)
        h = x * self.n2
        a, b, c = (p(h) for p in self.mlp)
        return x + c * torch.nn.functional.silu(a) * b
class Model(torch.nn.Module):
    def __init__(self, d=16, n=32):
        super().__init__()
        self.blocks = torch.nn.ModuleList(Block(d) for _ in range(n))
    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return x
def step(model, x):
    return model(x)
def make():
    torch.manual_seed(0)
    return Model().requires_grad_(False), torch.randn(4, 16)
"""

# Dynamo's default guards pickle the modules' classes by name, so the model lives in a
# module of its own (written to the work dir, on the path of both processes).
LOAD_CHILD = """
import sys, time, json
sys.path.insert(0, sys.argv[2])
import torch
from guards_model import make
from artifactcache.backends.shared.torch_private import load_compiled_step
model, x = make()
t0 = time.perf_counter()
fn = load_compiled_step(sys.argv[1])
t1 = time.perf_counter()
with torch.no_grad():
    fn(model, x)
t2 = time.perf_counter()
with torch.no_grad():
    for _ in range(200):
        fn(model, x)
t3 = time.perf_counter()
print(json.dumps({"load_s": t1 - t0, "first_call_s": t2 - t1, "call_us": (t3 - t2) / 200 * 1e6}))
"""


def build(path: Path, acache_guards: bool) -> float:
    import guards_model as ns
    import torch
    import torch._dynamo.config as dc

    from artifactcache.backends.shared import torch_private as tp

    model, x = ns.make()
    t0 = time.perf_counter()
    with torch.no_grad():
        if acache_guards:
            compiled = tp.aot_compile_step(ns.step, (model, x), {})
        else:  # Dynamo's own guard filter, as before step_guards_kept
            with dc.patch(enable_aot_compile=True):
                compiled = torch.compile(ns.step, fullgraph=True, dynamic=False)
                compiled = compiled.aot_compile(((model, x), {}))
        compiled(model, x)
    tp.save_compiled_step(compiled, path)
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    import torch

    work = Path(tempfile.mkdtemp(prefix="acache-guards-"))
    (work / "guards_model.py").write_text(MODEL)
    sys.path.insert(0, str(work))
    variants = {"dynamo_default": work / "default.aotfn", "acache": work / "acache.aotfn"}
    result: dict = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "torch": torch.__version__, "params": 32 * 9,
        "build_s": {}, "file_bytes": {}, "runs": {v: [] for v in variants},
    }  # fmt: skip
    for name, path in variants.items():
        result["build_s"][name] = round(build(path, name == "acache"), 2)
        result["file_bytes"][name] = path.stat().st_size
    for _ in range(args.runs):
        for name, path in variants.items():
            out = subprocess.run([sys.executable, "-c", LOAD_CHILD, str(path), str(work)], cwd=REPO,
                                 capture_output=True, text=True, check=True)  # fmt: skip
            result["runs"][name].append(json.loads(out.stdout.strip().splitlines()[-1]))
    result["median"] = {
        name: {k: round(statistics.median(r[k] for r in rows), 3) for k in rows[0]}
        for name, rows in result["runs"].items()
    }  # fmt: skip
    args.out.write_text(json.dumps(result, indent=1))
    print(json.dumps({k: result[k] for k in ("build_s", "file_bytes", "median")}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
