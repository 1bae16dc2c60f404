#!/usr/bin/env bash
# Which of an inductor entry's Triton kernels a warm process tunes again, and why
# (one device call, about 4 minutes; llama-7b bf16, the default reduce-overhead mode,
# warm path WARM_PATH, default aot_compile):
#   1. the build, in a process that records each autotune result it saves (where, the
#      configs hash) and each kernel it tunes or compiles;
#   2. a warm load + first token with empty framework caches, counting the same;
#   3. a second warm load reusing the framework caches the first one left: whether
#      what a warm process tunes and saves is then found.
# Usage: bash benchmarks/inductor_tuning_h200.sh OUT
set -u
out=${1:?usage: inductor_tuning_h200.sh OUT}
path=${WARM_PATH:-aot_compile}
export ACACHE_INDUCTOR_WARM_PATH=$path
cache=/tmp/acache-it-$path
fw=/tmp/acache-it-fw-$path
mkdir -p "$out"
rm -rf "$fw" /tmp/acache-it-fw-build  # the first warm load starts with empty caches
start=$SECONDS
stamp() { echo "[$(date -u +%H:%M:%S) +$((SECONDS - start))s] $*"; }
common=(llama-7b --backend inductor --cache-dir "$cache")

stamp "build ($path), counting"
timeout "${BUILD_TIMEOUT:-220}" python3 benchmarks/startup_diag.py tuning "${common[@]}" \
  --build --framework-dir /tmp/acache-it-fw-build --out "$out/build-child.json" \
  > "$out/build.json" 2>&1
stamp "rc $?"
for run in first second; do
  stamp "warm load, $run"
  timeout "${LOAD_TIMEOUT:-110}" python3 benchmarks/startup_diag.py tuning "${common[@]}" \
    --framework-dir "$fw" --out "$out/warm-$run-child.json" > "$out/warm-$run.json" 2>&1
  stamp "rc $?"
done
stamp "done"
