#!/usr/bin/env bash
# The "real shapes" measurements on one H200, in one device call (about 9 minutes):
#   1. llama-7b bf16 decode tok/s at positions ~200, ~1k and ~4k for aoti artifacts
#      allocated at 4096 and at 256 (benchmarks/kv_positions.py, which builds both);
#   2. batch 32: `acache bench --batch 32` on aoti and inductor artifacts built for
#      max_batch 32 (built concurrently with step 1's builds, measured after it);
#   3. the seed benchmark (batch 1) on the 256-allocated aoti artifact of step 1.
# Usage: bash benchmarks/shapes_h200.sh OUT [CACHE_DIR]
set -u
out=${1:?usage: shapes_h200.sh OUT [CACHE_DIR]}
cache=${2:-/tmp/acache-shapes}
mkdir -p "$out" "$cache"
acache() { python3 -m artifactcache.cli "$@"; }
common=(llama-7b --device cuda --dtype bf16 --cache-dir "$cache")
start=$SECONDS
stamp() { echo "[$(date -u +%H:%M:%S) +$((SECONDS - start))s] $*"; }

stamp "builds for max_batch 32 (aoti, inductor) in the background"
acache build "${common[@]}" --backend aoti --max-batch 32 --json > "$out/build-aoti-b32.json" 2> "$out/build-aoti-b32.log" &
pa=$!
acache build "${common[@]}" --backend inductor --max-batch 32 --json > "$out/build-inductor-b32.json" 2> "$out/build-inductor-b32.log" &
pi=$!

stamp "kv_positions (aoti, 4096 vs 256)"
python3 benchmarks/kv_positions.py --out "$out/kv" --backends aoti --cache-dir "$cache" > "$out/kv.log" 2>&1
stamp "kv_positions rc $?"

wait $pa; stamp "aoti b32 build rc $?"
wait $pi; stamp "inductor b32 build rc $?"
for b in aoti inductor; do
  stamp "bench $b --batch 32"
  acache bench "${common[@]}" --backend "$b" --batch 32 --iters 3 --warmup 1 --json > "$out/bench-$b-b32.json" 2> "$out/bench-$b-b32.log"
  stamp "rc $?"
done
stamp "bench aoti seed (batch 1, max_seq_len 256)"
acache bench "${common[@]}" --backend aoti --iters 3 --warmup 1 --json > "$out/bench-aoti-b1.json" 2> "$out/bench-aoti-b1.log"
stamp "rc $?; done"
