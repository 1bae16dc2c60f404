#!/usr/bin/env bash
# How benchmarks/results/seed-h200 was assembled on 2026-11-30 from the units of two
# device calls (each a fresh H200 machine; see docs/benchmarks.md for the commands).
set -eu
cd "$(dirname "$0")/.."
python3 benchmarks/seed_report.py --out benchmarks/results/seed-h200 \
  --calls "python benchmarks/seed_table.py --out benchmarks/results/seed-h200 --recipes llama-7b --backends eager,inductor --budget-s 330 (2026-11-30 23:46 UTC)" \
          "python benchmarks/seed_table.py --out benchmarks/results/seed-h200 --recipes phi-2,phi-3-mini --backends eager,inductor --budget-s 250 (2026-11-30 23:54 UTC)" \
  --not-run "aoti=AOTInductor loads segfaulted on this GPU image (a libstdc++ mismatch, see docs/backends.md); the fix came after this session's GPU time was spent" \
            "trt=TensorRT unavailable on this machine"
