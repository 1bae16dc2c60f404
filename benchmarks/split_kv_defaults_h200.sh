#!/usr/bin/env bash
# The split-KV defaults on one H200, in one device call (about 4 minutes):
#   1. three llama-7b bf16 builds at once at the seed context (256), each with its own
#      Inductor cache dir: aoti (static SDPA, the default at 256), aoti with
#      --extra split_kv_decode=1, and inductor reduce-overhead with it; beside
#      them split_kv_check.py's backend check on tiny recipes (fp32: greedy tokens of a
#      padded batch of four against eager, and each decode step's CUDA graph), which
#      times nothing;
#   2. with the GPU to itself, `acache bench` of each 7B build in a fresh process
#      (decode_step.py: seed prompt, 200 new tokens).
# Builds run side by side, so build seconds here are not cold-build figures.
# Usage: bash benchmarks/split_kv_defaults_h200.sh OUT [RECIPES]
set -u
out=${1:?usage: split_kv_defaults_h200.sh OUT [RECIPES]}
recipes=${2:-tiny-mistral,tiny-phi-2}
cache=/tmp/acache-skv-defaults
mkdir -p "$out" "$cache"
common=(llama-7b --device cuda --dtype bf16 --cache-dir "$cache" --json)
start=$SECONDS
stamp() { echo "[$(date -u +%H:%M:%S) +$((SECONDS - start))s] $*"; }

declare -A build_opts=([aoti]="--backend aoti"
                       [aoti-splitkv]="--backend aoti --extra split_kv_decode=1"
                       [inductor-splitkv]="--backend inductor --mode reduce-overhead --extra split_kv_decode=1")
pids=()
for name in aoti aoti-splitkv inductor-splitkv; do
  stamp "build $name (${build_opts[$name]})"
  # shellcheck disable=SC2086
  TORCHINDUCTOR_CACHE_DIR=/tmp/ind-$name timeout "${BUILD_TIMEOUT:-200}" \
    python3 -m artifactcache.cli build "${common[@]}" ${build_opts[$name]} \
    > "$out/build-$name.json" 2> "$out/build-$name.log" &
  pids+=($!)
done
stamp "split_kv_check backends on $recipes (beside the builds)"
TORCHINDUCTOR_CACHE_DIR=/tmp/ind-tiny timeout "${BUILD_TIMEOUT:-200}" \
  python3 benchmarks/split_kv_check.py --out "$out/tiny" --skip-kernel --recipes "$recipes" \
  > "$out/tiny.log" 2>&1 &
pids+=($!)
for p in "${pids[@]}"; do wait "$p"; stamp "pid $p rc $?"; done

stamp "decode_step: the three 7B builds"
timeout "${BENCH_TIMEOUT:-100}" python3 benchmarks/decode_step.py llama-7b --out "$out/decode" \
  --cache-dir "$cache" \
  --variants aoti+split_kv_decode=1 aoti inductor:reduce-overhead+split_kv_decode=1 \
  > "$out/decode.log" 2>&1
stamp "decode_step rc $?; done"
