"""Build variants of one backend against eager and each other: logits and greedy tokens.

Each variant is ``NAME=BACKEND:CACHE_DIR[:KEY=VALUE,...]`` (the KEY=VALUE pairs are the
build's ``--extra``), an entry already built in CACHE_DIR (loaded, never built). In one
process, eager's logits over the seed prompt and its ``--gen`` greedy tokens are the
reference; each variant's maximum relative logit error against them (max |diff| / max
|eager|), whether its argmax agrees at every prompt position, and its first token that
differs from eager's and from the first variant's are reported. Random weights give
near-tied logits, so greedy paths of two correct bf16 builds may part; the logit error
is the tolerance check.

    python benchmarks/variant_agreement.py llama-7b --device cuda --dtype bf16 \
        --variant plain=inductor:/tmp/c1 --variant regions=inductor:/tmp/c2:layer_regions=1 \
        --out OUT

Writes OUT/agreement.json and prints it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def parse_variant(text: str) -> tuple[str, str, Path, dict[str, str]]:
    name, _, rest = text.partition("=")
    parts = rest.split(":")
    if not name or len(parts) < 2:
        raise SystemExit(f"--variant {text!r}: expected NAME=BACKEND:CACHE_DIR[:KEY=VALUE,...]")
    extra = dict(kv.split("=", 1) for kv in parts[2].split(",")) if len(parts) > 2 else {}
    return name, parts[0], Path(parts[1]), extra


def first_difference(a: list[int], b: list[int]) -> int | None:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y), None)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("recipe")
    ap.add_argument("--variant", action="append", required=True)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="fp32")
    ap.add_argument("--gen", type=int, default=32)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    variants = [parse_variant(v) for v in args.variant]

    from artifactcache import api
    from artifactcache.recipes import load_recipe

    prompt = list(load_recipe(args.recipe).bench.prompt_ids)
    common = {"device": args.device, "dtype": args.dtype}
    ref = api.load(args.recipe, "eager", cache_dir=args.out / "eager-cache", **common)
    want, want_ids = ref.logits(prompt), ref.generate(prompt, args.gen)
    del ref
    result: dict[str, Any] = {"recipe": args.recipe, **common, "gen": args.gen,
                              "eager_tokens": want_ids, "variants": {}}  # fmt: skip
    first_ids = None
    for name, backend, cache, extra in variants:
        runner = api.load(
            args.recipe, backend, build_on_miss=False, cache_dir=cache, extra=extra, **common
        )
        got, ids = runner.logits(prompt), runner.generate(prompt, args.gen)
        first_ids = ids if first_ids is None else first_ids
        result["variants"][name] = {
            "backend": backend,
            "extra": extra,
            "max_rel_err_vs_eager": float((got - want).abs().max() / want.abs().max()),
            "argmax_agrees_at_every_position": bool((got.argmax(-1) == want.argmax(-1)).all()),
            "first_token_differing_from_eager": first_difference(ids, want_ids),
            "first_token_differing_from_first_variant": first_difference(ids, first_ids),
            "tokens": ids,
        }
        del runner
    args.out.mkdir(parents=True, exist_ok=True)
    text = json.dumps(result, indent=2)
    (args.out / "agreement.json").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
