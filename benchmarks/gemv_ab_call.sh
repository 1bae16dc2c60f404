#!/bin/bash
# The row GEMV of two trees on one GPU, alternating (docs/perf-notes.md attempt 72): each
# shape of SHAPES (benchmarks/row_gemv.py's names) timed standalone by row_gemv.py
# (CUDA-graph replays over L2-overflowing weight copies, % of the copy bandwidth
# measured in the same run), the tree before (.ab71's artifactcache) then today's,
# ROUNDS times: R/old-N, R/new-N.
#   bash benchmarks/gemv_ab_call.sh NAME   (carry [".whl", ".ab71"])
. benchmarks/_device_call.sh
start_call "${1:?usage: gemv_ab_call.sh NAME}"
S=${SHAPES:-phi3_down,llama_down,llama3_down,phi3_o,phi2_out}
for n in $(seq "${ROUNDS:-2}"); do
  for side in old new; do
    path=$PWD:/tmp/site; [ "$side" = old ] && path=$PWD/.ab71:/tmp/site
    PYTHONPATH=$path timeout "$(cap 90)" python3 benchmarks/row_gemv.py --out "$R/$side-$n" \
      --shapes "$S" --no-inductor > "$R/$side-$n.log" 2>&1
    echo "$side $n rc=$? at $((SECONDS - T0)) s"
    grep -E ' (acache|cublas) ' "$R/$side-$n.log" | head -20
  done
done
finish_call
