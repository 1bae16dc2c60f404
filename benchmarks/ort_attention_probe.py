"""Where ort's CPU first pass goes (issue 30): its step graph's kernel time by op type, and
ONNX's Attention op with a mask against ``is_causal`` and torch's SDPA.

1. ``--recipe`` (default tiny-llama-2k) built for ort on the CPU (``--cache-dir``), then
   one ``generate(ids, 1)`` of ``--tokens`` timed (p50 of 9), and the entry's optimized
   graph run under ORT's profiler with the same first-pass feeds: microseconds per run by
   op type.
2. One Attention node (opset 23) at the recipe's first-pass shape, [1, H, T, D] with
   Hkv heads of keys and values: with the causal mask as a bool input (how the step graph
   carries it) and with ``is_causal=1``, beside ``F.scaled_dot_product_attention(...,
   is_causal=True)``; p50 of 15 runs each, and the largest difference between the two
   ONNX outputs.

    python benchmarks/ort_attention_probe.py --out OUT/ort_attention.json

Prints one line per figure and writes the JSON (with the date, host and versions).
"""

from __future__ import annotations

import argparse
import collections
import datetime
import glob
import json
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def p50_ms(fn: Any, n: int) -> float:
    for _ in range(3):
        fn()
    ts = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return round(statistics.median(ts) * 1e3, 3)


def step_graph_profile(recipe: str, tokens: int, cache_dir: str) -> dict[str, Any]:
    import onnxruntime as ort

    from artifactcache import api

    runner = api.load(recipe, "ort", device="cpu", dtype="fp32", cache_dir=cache_dir)
    ids = [1] + [(7 * i + 3) % 32000 for i in range(tokens - 1)]
    ttft = p50_ms(lambda: runner.generate(ids, 1), 9)
    path = sorted(glob.glob(f"{cache_dir}/v1/entries/**/model.opt.onnx", recursive=True))[-1]
    so = ort.SessionOptions()
    so.enable_profiling = True
    so.profile_file_prefix = str(Path(cache_dir) / "ort-profile")
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # optimized once
    sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    past = next(i.shape for i in sess.get_inputs() if i.name == "past_keys")
    feeds = {
        "input_ids": np.array([ids], dtype=np.int64),
        "input_pos": np.arange(tokens, dtype=np.int64),
        "row_start": np.zeros(past[1], dtype=np.int64),
        "kv_pos": np.arange(tokens, dtype=np.int64),
        "logit_rows": np.array([tokens - 1], dtype=np.int64),
        "past_keys": np.zeros(past, np.float32),
        "past_values": np.zeros(past, np.float32),
    }
    runs = 13
    session_ms = p50_ms(lambda: sess.run(None, feeds), runs - 3)  # 3 warm-ups inside
    by_op: collections.Counter[str] = collections.Counter()
    for event in json.loads(Path(sess.end_profiling()).read_text()):
        if event.get("cat") == "Node" and event["name"].endswith("_kernel_time"):
            by_op[event["args"]["op_name"]] += event["dur"]
    per_run = {op: round(us / runs) for op, us in by_op.most_common()}
    return {"ttft_p50_ms": ttft, "session_run_p50_ms": session_ms, "us_per_run_by_op": per_run}


def attention_probe(heads: int, kv_heads: int, tokens: int, head_dim: int) -> dict[str, Any]:
    import onnxruntime as ort
    from onnx import TensorProto, helper

    shape = {"q": [1, heads, tokens, head_dim], "k": [1, kv_heads, tokens, head_dim]}
    shape["v"] = shape["k"]

    def session(causal: bool) -> Any:
        names = ["q", "k", "v"] + ([] if causal else ["m"])
        ins = [helper.make_tensor_value_info(n, TensorProto.FLOAT, shape[n]) for n in names[:3]]
        if not causal:
            ins.append(helper.make_tensor_value_info("m", TensorProto.BOOL, [1, 1, tokens, tokens]))
        node = helper.make_node("Attention", names, ["y"], is_causal=int(causal))
        out = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
        model = helper.make_model(helper.make_graph([node], "attention", ins, [out]),
                                  opset_imports=[helper.make_opsetid("", 23)])  # fmt: skip
        model.ir_version = 10
        return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])

    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal(shape[n], np.float32) for n in ("q", "k", "v"))
    mask = np.tril(np.ones((tokens, tokens), bool))[None, None]
    masked, causal = session(False), session(True)
    fm, fc = {"q": q, "k": k, "v": v, "m": mask}, {"q": q, "k": k, "v": v}
    diff = float(np.abs(masked.run(None, fm)[0] - causal.run(None, fc)[0]).max())
    rep = heads // kv_heads
    tq = torch.from_numpy(q)
    tk, tv = (torch.from_numpy(x).repeat_interleave(rep, 1) for x in (k, v))
    sdpa = torch.nn.functional.scaled_dot_product_attention
    return {
        "shape": {"heads": heads, "kv_heads": kv_heads, "tokens": tokens, "head_dim": head_dim},
        "onnx_mask_ms": p50_ms(lambda: masked.run(None, fm), 15),
        "onnx_is_causal_ms": p50_ms(lambda: causal.run(None, fc), 15),
        "torch_sdpa_causal_ms": p50_ms(lambda: sdpa(tq, tk, tv, is_causal=True), 15),
        "max_abs_diff_mask_vs_causal": diff,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--recipe", default=str(REPO / "benchmarks/recipes/tiny-llama-2k.toml"))
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--cache-dir", default="/tmp/acache-ort-probe")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    import onnxruntime

    from artifactcache.recipes import load_recipe

    cfg = load_recipe(args.recipe).model
    report = {
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "host": platform.node(), "torch": torch.__version__,
        "onnxruntime": onnxruntime.__version__, "torch_threads": torch.get_num_threads(),
        "step_graph": step_graph_profile(args.recipe, args.tokens, args.cache_dir),
        "attention": attention_probe(cfg.n_heads, cfg.n_kv_heads, args.tokens, cfg.head_dim),
    }  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))
    print(json.dumps(report["step_graph"]["us_per_run_by_op"]))
    for k in ("ttft_p50_ms", "session_run_p50_ms"):
        print(k, report["step_graph"][k])
    for k, v in report["attention"].items():
        print(k, v)
    return 0


if __name__ == "__main__":
    sys.exit(main())
