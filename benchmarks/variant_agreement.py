"""Build variants of one backend against eager and each other: logits and greedy tokens.

Each variant is ``NAME=BACKEND:CACHE_DIR[:KEY=VALUE,...]`` (the KEY=VALUE pairs are the
build's ``--extra``), an entry already built in CACHE_DIR (loaded, never built). The
comparison is backend_evidence.py's ``agreement``: in one process, eager's logits over
the seed prompt and its ``--gen`` greedy tokens are the reference; each variant's
maximum relative logit error against them (max |diff| / max |eager|), whether its
argmax agrees at every prompt position, and its first token that differs from eager's
(and, in low precision, from eager's fp32 computation) are reported, plus here its
first token that differs from the first variant's. Random weights give near-tied
logits, so greedy paths of two correct bf16 builds may part; the logit error is the
tolerance check (``--rtol``, reported, never asserted).

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
sys.path.insert(0, str(Path(__file__).resolve().parent))

from backend_evidence import agreement, first_difference  # noqa: E402


def parse_variant(text: str) -> tuple[str, str, Path, dict[str, str]]:
    name, _, rest = text.partition("=")
    parts = rest.split(":")
    if not name or len(parts) < 2:
        raise SystemExit(f"--variant {text!r}: expected NAME=BACKEND:CACHE_DIR[:KEY=VALUE,...]")
    if name == "eager":
        raise SystemExit(f"--variant {text!r}: 'eager' names the reference; name it otherwise")
    extra = dict(kv.split("=", 1) for kv in parts[2].split(",")) if len(parts) > 2 else {}
    return name, parts[0], Path(parts[1]), extra


def compare(
    recipe: str, variants: list[tuple[str, str, Path, dict[str, str]]], common: dict[str, Any],
    eager_cache: Path, gen: int, rtol: float, fp32_yardstick: bool = False,
) -> dict[str, Any]:  # fmt: skip
    """agreement() over the variants, each also against the first variant's tokens; with
    ``fp32_yardstick`` (an fp32 copy of eager: 4 bytes a parameter more) also eager's own
    distance from fp32, under ``"eager_vs_fp32"``."""
    labelled = {
        name: {"backend": backend, "cache_dir": cache, "extra": extra}
        for name, backend, cache, extra in variants
    }
    found = agreement(recipe, labelled, {**common, "cache_dir": eager_cache}, gen, rtol,
                      fp32_yardstick=fp32_yardstick)  # fmt: skip
    yardstick = found.pop("eager", None)
    first_ids = found[variants[0][0]]["tokens"]
    for name, backend, _, extra in variants:
        found[name].update(backend=backend, extra=extra)
        found[name]["first_token_differing_from_first_variant"] = first_difference(
            found[name]["tokens"], first_ids
        )
    return {"variants": found, **({"eager_vs_fp32": yardstick} if yardstick else {})}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("recipe")
    ap.add_argument("--variant", action="append", required=True)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="fp32")
    ap.add_argument("--gen", type=int, default=32)
    ap.add_argument("--rtol", type=float, default=None, help="default: 1e-4 fp32, 2e-2 bf16/fp16")
    ap.add_argument(
        "--fp32-yardstick",
        action="store_true",
        help="also eager in fp32 (4 bytes a parameter more): eager's own distance",
    )
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    variants = [parse_variant(v) for v in args.variant]
    rtol = args.rtol if args.rtol is not None else (1e-4 if args.dtype == "fp32" else 2e-2)
    common = {"device": args.device, "dtype": args.dtype}
    found = compare(args.recipe, variants, common, args.out / "eager-cache", args.gen, rtol,
                    args.fp32_yardstick)  # fmt: skip
    result = {"recipe": args.recipe, **common, "gen": args.gen, "rtol": rtol, **found}
    args.out.mkdir(parents=True, exist_ok=True)
    text = json.dumps(result, indent=2, default=str)
    (args.out / "agreement.json").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
