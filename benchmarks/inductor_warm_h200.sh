#!/usr/bin/env bash
# Inductor's two warm paths on one H200, in one device call (4 minutes, + 2 per RUNS):
#   1. two llama-7b bf16 inductor builds at once (the default mode, reduce-overhead),
#      each with its own Inductor cache dir: the Mega-Cache path (CUDA's default) and
#      the saved-compiled-function path (ACACHE_INDUCTOR_WARM_PATH=aot_compile). Side by
#      side, so their build seconds are not cold-build figures;
#   2. with the GPU to itself, startup_diag.py tuning: one warm load of each in a fresh
#      process (empty framework caches), counting the autotune-cache checks, tuning and
#      Triton compiles it makes, and what it left in its Triton and Inductor cache dirs;
#   3. startup_diag.py warm: RUNS fresh warm probes of each (an eager start after
#      each), the coldstart probe's phases and steady decode (RUNS=0 skips them);
#   4. PROFILE=1: one warm load of the aot_compile entry under cProfile.
# Usage: bash benchmarks/inductor_warm_h200.sh OUT [RUNS]
set -u
out=${1:?usage: inductor_warm_h200.sh OUT [RUNS]}
runs=${2:-0}
mkdir -p "$out"
start=$SECONDS
stamp() { echo "[$(date -u +%H:%M:%S) +$((SECONDS - start))s] $*"; }

pids=()
for path in megacache aot_compile; do
  stamp "build llama-7b inductor, warm path $path"
  mkdir -p "/tmp/acache-iw-$path"
  ACACHE_INDUCTOR_WARM_PATH=$path TORCHINDUCTOR_CACHE_DIR=/tmp/ind-iw-$path \
    timeout "${BUILD_TIMEOUT:-270}" python3 -m artifactcache.cli build llama-7b \
    --backend inductor --device cuda --dtype bf16 --cache-dir "/tmp/acache-iw-$path" --json \
    > "$out/build-$path.json" 2> "$out/build-$path.log" &
  pids+=($!)
done
for p in "${pids[@]}"; do wait "$p"; stamp "pid $p rc $?"; done
for path in megacache aot_compile; do
  find "/tmp/acache-iw-$path" -name inductor.json -exec cp {} "$out/record-$path.json" \;
done
tar czf "$out/records.tgz" -C "$out" record-megacache.json record-aot_compile.json \
  && rm -f "$out"/record-*.json

for path in aot_compile megacache; do
  stamp "tuning counts of one warm load, $path"
  # The warm process computes the key, which names the warm path: same variable.
  ACACHE_INDUCTOR_WARM_PATH=$path timeout "${TUNING_TIMEOUT:-120}" python3 \
    benchmarks/startup_diag.py tuning llama-7b --backend inductor \
    --cache-dir "/tmp/acache-iw-$path" --out "$out/tuning-$path-child.json" \
    > "$out/tuning-$path.json" 2>&1
  stamp "rc $?"
done

if [ "$runs" -gt 0 ]; then
  for path in aot_compile megacache; do
    stamp "warm x$runs, $path"
    ACACHE_INDUCTOR_WARM_PATH=$path timeout "${WARM_TIMEOUT:-130}" python3 \
      benchmarks/startup_diag.py warm llama-7b --backend inductor --runs "$runs" \
      --cache-dir "/tmp/acache-iw-$path" > "$out/warm-$path.jsonl" 2> "$out/warm-$path.log"
    stamp "rc $?"
  done
fi

if [ "${PROFILE:-0}" = 1 ]; then
  stamp "profile one aot_compile warm load"
  ACACHE_INDUCTOR_WARM_PATH=aot_compile timeout "${PROFILE_TIMEOUT:-100}" python3 \
    benchmarks/startup_diag.py profile llama-7b --backend inductor \
    --cache-dir /tmp/acache-iw-aot_compile --out "$out/profile-aot_compile.txt" \
    > "$out/profile-aot_compile.json" 2>&1
  stamp "rc $?"
fi
stamp "done"
