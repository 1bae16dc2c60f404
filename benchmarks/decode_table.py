"""Issue 32's decode table from decode_step.py's results, running nothing.

Reads every ``decode_step.json`` under the folders given (decode_call.sh writes one a
recipe; decode_table_call.sh's three parts write them) and prints, in Markdown:

- each seed model's default build (no ``--extra``) at batch 1, unquantized, on aoti and
  inductor: tok/s and % of the copy roofline measured in the same process, the two
  backends' distance in points, and the targets (llama-7b >= 85%, the others >= 80%,
  aoti and inductor within 3 points);
- every batched row: aggregate tok/s and % of its roofline (weights plus the rows' KV),
  against 75%;
- every quantized row with its ratio to the unquantized row of the same recipe, backend
  and batch from the same file (one decode_step.py run: one machine, one session),
  against int8wo's 1.6x and int4wo's 2.5x. No ratio is made across files.

aoti's and inductor's rows may come from different calls (decode_table_call.sh measures
them in separate parts): their distance is in % of each run's own roofline. A row with
an error is listed as such; a pair not measured says so. "Default" means
the defaults of the tree that ran: give the folders of one remeasurement
(decode_table_call.sh's parts), later folders winning where a model repeats.

    python benchmarks/decode_table.py /tmp/t1 /tmp/t2 /tmp/t3
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, NamedTuple

SEED_TARGETS = {"llama-7b": 85.0, "llama-3-8b": 80.0, "mistral-7b": 80.0, "phi-3-mini": 80.0,
                "phi-2": 80.0}  # fmt: skip
BACKENDS = ("aoti", "inductor")
BACKEND_GAP_POINTS = 3.0
BATCH_TARGET = 75.0
QUANT_TARGETS = {"int8wo": 1.6, "int4wo": 2.5}


class Row(NamedTuple):
    """One measured variant: where it came from and what it decoded."""

    file: Path
    recipe: str
    variant: str
    backend: str
    mode: str | None
    max_seq_len: int  # 0: the recipe's
    dtype: str
    quant: str | None
    batch: int
    extra: dict[str, Any]
    tok_s: float | None  # per row; None where the run failed
    aggregate_tok_s: float | None
    roofline_pct: float | None
    error: str | None

    @property
    def default(self) -> bool:
        """A default build: no option given but the dtype (bf16, the seed's)."""
        plain = not self.extra and self.quant is None and self.mode is None
        return plain and self.batch == 1 and self.max_seq_len == 0 and self.dtype == "bf16"

    def twin(self, other: Row) -> bool:
        """Whether ``other`` is this row's build but for the quantization."""
        return (self.backend, self.mode, self.max_seq_len, self.dtype, self.batch,
                self.extra) == (other.backend, other.mode, other.max_seq_len, other.dtype,
                                other.batch, other.extra)  # fmt: skip


def read_rows(folders: list[Path]) -> list[Row]:
    """Every decode_step.json row under ``folders``, the recipe taken from its command."""
    rows = []
    for folder in folders:
        for path in sorted(folder.rglob("decode_step.json")):
            report = json.loads(path.read_text())
            words = report["command"].split()
            recipe = words[1]
            dtype = words[words.index("--dtype") + 1] if "--dtype" in words else "bf16"
            for r in report["rows"]:
                ok = "error" not in r
                rows.append(
                    Row(
                        file=path, recipe=recipe, variant=r["variant"], backend=r["backend"],
                        mode=r.get("mode"), max_seq_len=int(r.get("max_seq_len") or 0),
                        dtype=dtype, quant=r.get("quant"), batch=int(r.get("batch") or 1),
                        extra=r.get("extra") or {},
                        tok_s=r["decode_tok_s"] if ok else None,
                        aggregate_tok_s=r.get("aggregate_decode_tok_s") if ok else None,
                        roofline_pct=r["roofline_pct"] if ok else None,
                        error=None if ok else str(r["error"]),
                    )
                )  # fmt: skip
    return rows


def _cell(row: Row | None) -> str:
    if row is None:
        return "not measured"
    if row.error is not None:
        first = row.error.splitlines()[0].removeprefix("error: ")
        return f"error: {first[:80]}"
    return f"{row.tok_s:.1f} ({row.roofline_pct:.1f}%)"


def _verdict(ok: bool) -> str:
    return "met" if ok else "**missed**"


def seed_table(rows: list[Row]) -> list[str]:
    """The seed models' default builds, one line a model."""
    lines = [
        "| model | aoti tok/s (% of roofline) | inductor tok/s (% of roofline) | gap, points "
        "| target | verdict |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for recipe, target in SEED_TARGETS.items():
        found: dict[str, Row | None] = {b: None for b in BACKENDS}
        for r in rows:
            if r.recipe == recipe and r.backend in found and r.default:
                found[r.backend] = r  # the last file read wins: newer results folders last
        pcts = [r.roofline_pct for r in found.values() if r is not None and r.roofline_pct]
        if any(r is not None and r.error is not None for r in found.values()):
            gap_text, verdict = "–", "**missed** (a build or run failed)"
        elif len(pcts) < 2:
            gap_text, verdict = "–", "not all measured"
        else:
            gap = max(pcts) - min(pcts)
            gap_text = f"{gap:.1f}"
            verdict = _verdict(min(pcts) >= target and gap <= BACKEND_GAP_POINTS)
        lines.append(
            f"| {recipe} | {_cell(found['aoti'])} | {_cell(found['inductor'])} | {gap_text} "
            f"| {target:.0f}% | {verdict} |"
        )
    return lines


def batch_table(rows: list[Row]) -> list[str]:
    lines = ["| model, backend | batch | aggregate tok/s | % of roofline | verdict |",
             "|---|---:|---:|---:|---|"]  # fmt: skip
    for r in rows:
        if r.batch == 1 or r.quant is not None:
            continue
        if r.tok_s is None or r.roofline_pct is None:
            lines.append(f"| {r.recipe}, {r.variant} | {r.batch} | {_cell(r)} | | |")
            continue
        agg = r.aggregate_tok_s if r.aggregate_tok_s is not None else r.tok_s * r.batch
        lines.append(
            f"| {r.recipe}, {r.variant} | {r.batch} | {agg:.1f} | {r.roofline_pct:.1f} "
            f"| {_verdict(r.roofline_pct >= BATCH_TARGET)} |"
        )
    return lines


def quant_table(rows: list[Row]) -> list[str]:
    lines = ["| model, variant | tok/s | unquantized, same run | ratio | target | verdict |",
             "|---|---:|---:|---:|---:|---|"]  # fmt: skip
    for r in rows:
        if r.quant is None:
            continue
        base = next((b for b in rows if b.file == r.file and b.quant is None and r.twin(b)), None)
        target = QUANT_TARGETS.get(r.quant)
        if r.tok_s is None or base is None or base.tok_s is None:
            why = (_cell(r) if r.tok_s is None else "no unquantized row in its run"
                   if base is None else "its run's unquantized row failed")  # fmt: skip
            lines.append(f"| {r.recipe}, {r.variant} | {why} | | | | |")
            continue
        ratio = r.tok_s / base.tok_s
        verdict = "–" if target is None else _verdict(ratio >= target)
        target_text = "–" if target is None else f"{target}x"
        lines.append(
            f"| {r.recipe}, {r.variant} | {r.tok_s:.1f} | {base.tok_s:.1f} | {ratio:.3f}x "
            f"| {target_text} | {verdict} |"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folders", nargs="+", type=Path, help="results folders, searched down")
    args = ap.parse_args(argv)
    missing = [str(f) for f in args.folders if not f.is_dir()]
    if missing:
        print(f"error: not a folder: {', '.join(missing)}", file=sys.stderr)
        return 1
    rows = read_rows(args.folders)
    if not rows:
        print("error: no decode_step.json under the folders given", file=sys.stderr)
        return 1
    for title, lines in (
        ("Seed models, batch 1, bf16, default builds", seed_table(rows)),
        ("Batches", batch_table(rows)),
        ("Quantized weights against the same run's unquantized build", quant_table(rows)),
    ):
        print(f"\n### {title}\n")
        print("\n".join(lines) if len(lines) > 2 else "none in these folders")
    print("\n### From\n")
    for path in sorted({r.file for r in rows}):
        report = json.loads(path.read_text())
        print(f"- {path}: {report.get('date')}, host {report.get('host')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
