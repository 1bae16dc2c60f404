#!/usr/bin/env bash
# How benchmarks/results/seed-h200-2026-12-01 was assembled from the units of five
# device calls on 2026-12-01 (one H200 each time; commit 085143f onwards, see git log).
# Calls 1 and 2 also ran llama-7b/aoti, which failed (a relative cache dir, then a
# crashing $CXX; logs in failed/, fixes in the next commits); those units were deleted
# so call 3 re-ran the pair. calls/ holds each call's log.
# Third session, same day (commit 45b99b8): call 6 ran phi-2/aoti but its units were
# not returned (the device tool returns at most 8 files; the log is kept as
# calls/call6_seed_units_not_returned.log); call 7 re-ran it and returned a tarball.
# (Calls 6 and 7 are device calls D3 and D4 in docs/benchmarks.md.)
set -eu
cd "$(dirname "$0")/.."
T="python benchmarks/seed_table.py --out benchmarks/results/seed-h200-2026-12-01"
python3 benchmarks/seed_report.py --out benchmarks/results/seed-h200-2026-12-01 \
  --calls "$T --recipes llama-7b --backends eager,inductor,aoti --budget-s 455 --probe-timeout-s 400 (01:44 UTC)" \
          "$T --recipes llama-7b,llama-3-8b --backends eager,inductor,aoti --budget-s 500 --probe-timeout-s 420 (01:49 UTC)" \
          "$T --recipes llama-7b,llama-3-8b,mistral-7b,phi-3-mini,phi-2 --backends eager,inductor,aoti --budget-s 500 --probe-timeout-s 400 (01:59 UTC)" \
          "$T --recipes llama-7b,llama-3-8b,mistral-7b,phi-3-mini,phi-2 --backends eager,inductor,aoti --budget-s 440 --probe-timeout-s 300 (02:07 UTC)" \
          "$T --recipes phi-2 --backends eager,inductor --budget-s 150 --probe-timeout-s 160 (02:14 UTC)" \
          "$T --recipes phi-2 --backends aoti --budget-s 220 --probe-timeout-s 240 (04:37 UTC; out dir copied from and back to the repo)" \
  --not-run "trt=TensorRT unavailable on this machine"
