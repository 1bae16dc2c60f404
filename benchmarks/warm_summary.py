"""A warm start's seconds by segment, from ``startup_diag.py warm`` output files.

Reads each file's JSON objects (one per process, then the summary object) and prints a
Markdown table: per process, the seconds after the imports at which each load stamp
fell (the probe's phases and the inductor load's subphases), and first result minus
imports, the figure issue 31's targets are stated in.

    python benchmarks/warm_summary.py RESULTS/warm.json RESULTS/warm-alt.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

# (column, stamp): seconds after imports_done; stamps a backend does not make show "–".
STAMPS = (
    ("key + lookup", "entry_ready"),
    ("weights", "weights_ready"),
    ("Inductor imported", "compiler_ready"),
    ("kernels installed", "files_installed"),
    ("megacache loaded", "cache_loaded"),
    ("steps read", "steps_read"),
    ("decode deserialized", "steps_opened"),
    ("decode run once", "steps_loaded"),
    ("artifact (graph captured)", "artifact_ready"),
    ("first result", "first_result"),
)


def processes(path: Path) -> list[dict[str, Any]]:
    """The per-process objects of one output file, failed probes (``"phases": null``)
    included; the summary object last is skipped."""
    text, decoder, pos, out = path.read_text(), json.JSONDecoder(), 0, []
    while True:
        while pos < len(text) and text[pos].isspace():
            pos += 1
        if pos >= len(text):
            return out
        obj, pos = decoder.raw_decode(text, pos)
        if "phases" in obj and "what" not in obj:
            out.append(obj)


def row(label: str, proc: dict[str, Any]) -> str:
    phases = proc.get("phases")
    if not isinstance(phases, dict) or "imports_done" not in phases:
        why = str(proc.get("error") or "no phases")[:80].replace("|", "/")
        return f"| {label} | {proc.get('run', '?')} | failed: {why} |"
    stamps = {**(proc.get("subphases") or {}), **phases}
    base = stamps["imports_done"]
    cells = [f"{stamps[s] - base:.2f}" if s in stamps else "–" for _, s in STAMPS]
    compiled = proc.get("compile", {}).get("triton_compiles")
    return (
        f"| {label} | {proc.get('run', '?')} | {base:.2f} | "
        + " | ".join(cells)
        + f" | {compiled if compiled is not None else '–'} |"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("files", nargs="+", type=Path)
    args = p.parse_args(argv)
    print("seconds after the imports (`imports_done`) at each stamp")
    print()
    print(
        "| file | process | imports | " + " | ".join(c for c, _ in STAMPS) + " | Triton compiles |"
    )
    print("|---|---|---:|" + "---:|" * (len(STAMPS) + 1))
    for f in args.files:
        for proc in processes(f):
            print(row(f.stem, proc))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
