"""How far ``--quant int8wo`` is from the same build unquantized, stated, not asserted.

Loads the recipe twice with one backend, device and dtype (building on a miss): once
as it is, once with ``--quant``. On the seed prompt it reports

* the first greedy token where the two differ (index into the new tokens, or none),
  each generating on its own, no early stop;
* the max relative logits error, ``max|q - f| / max|f|``, over the prompt and over the
  prompt plus the unquantized model's greedy tokens (teacher-forced: both read the same
  tokens, so the error is not compounded by a diverged continuation), and how many of
  those positions pick the same top-1 token.

    python benchmarks/quant_agreement.py llama-7b --weights /models/llama-2-7b \\
        --backend aoti --device cuda --dtype bf16 --out OUT/quant_agreement.json

Random weights (no --weights) give a number, but not one about a real model.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
from pathlib import Path
from typing import Any


def _rel(a: Any, b: Any) -> float:
    return float((a - b).abs().max() / b.abs().max())


def run(args: argparse.Namespace, quant: str | None) -> tuple[Any, dict[str, Any]]:
    """(runner, its greedy tokens and prompt logits) for one of the two builds."""
    import artifactcache
    from artifactcache.recipes import load_recipe

    runner = artifactcache.load(
        args.recipe, backend=args.backend, device=args.device, dtype=args.dtype,
        mode=args.mode, weights=args.weights, extra=dict(args.extra), quant=quant,
        cache_dir=args.cache_dir,
    )  # fmt: skip
    prompt = list(load_recipe(args.recipe).bench.prompt_ids)
    tokens = runner.generate(prompt, args.new_tokens, eos_token_ids=())
    return runner, {"tokens": tokens, "prompt": prompt, "prompt_logits": runner.logits(prompt)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("recipe")
    ap.add_argument("--backend", default="eager")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="fp32")
    ap.add_argument("--mode", default=None)
    ap.add_argument("--weights", default=None)
    ap.add_argument("--quant", default="int8wo")
    ap.add_argument("--extra", action="append", default=[], type=lambda t: t.split("=", 1),
                    help="KEY=VALUE for both builds, repeatable")  # fmt: skip
    ap.add_argument("--new-tokens", type=int, default=200)
    ap.add_argument("--cache-dir", default=None)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    import torch

    runner, ref = run(args, None)
    # Teacher-forced over the reference continuation, while the reference is loaded.
    forced = ref["prompt"] + ref["tokens"][:-1]
    ref_forced = runner.logits(forced)
    del runner  # one model on the device at a time
    gc.collect()
    if args.device.startswith("cuda"):
        torch.cuda.empty_cache()
    runner, q = run(args, args.quant)
    q_forced = runner.logits(forced)
    diff = [i for i, (a, b) in enumerate(zip(ref["tokens"], q["tokens"], strict=True)) if a != b]
    top1 = (ref_forced.argmax(-1) == q_forced.argmax(-1)).float().mean().item()
    report = {
        "recipe": args.recipe, "backend": args.backend, "device": args.device,
        "dtype": args.dtype, "quant": args.quant, "weights": args.weights or "random",
        "extra": dict(args.extra), "new_tokens": args.new_tokens,
        "first_differing_token": diff[0] if diff else None,
        "differing_tokens": len(diff),
        "max_rel_logits_error_prompt": _rel(q["prompt_logits"], ref["prompt_logits"]),
        "max_rel_logits_error_forced": _rel(q_forced, ref_forced),
        "top1_agreement_forced": top1,
        "forced_positions": len(forced),
    }  # fmt: skip
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report))
    first = report["first_differing_token"]
    print(
        f"{args.recipe} {args.backend} {args.dtype} {args.quant} vs unquantized: "
        f"max rel logits error {report['max_rel_logits_error_prompt']:.4f} (prompt), "
        f"{report['max_rel_logits_error_forced']:.4f} ({len(forced)} forced positions, "
        f"top-1 agreement {top1:.1%}); greedy tokens "
        + ("all equal" if first is None else f"differ first at new token {first}")
        + f" of {args.new_tokens}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
