#!/usr/bin/env bash
# KV positions, int8 weight-only decode and a batch-32 profile on one H200, in one
# device call (about 9 minutes): four llama-7b bf16 aoti builds run concurrently
# (max_seq_len 4096, 256, --quant int8wo, --max-batch 32), then, with the GPU to
# itself, one measurement at a time:
#   1. kv_positions.py: decode tok/s at positions ~200/1k/4k, 4096- vs 256-allocated;
#   2. decode_step.py: aoti vs aoti+int8wo (batch 1) and aoti at batch 32, each in a
#      fresh `acache bench`, then kernel profiles of the batch-32 and int8wo steps.
# Builds run side by side, so build seconds here are not cold-build figures.
# Usage: bash benchmarks/decode_shapes_h200.sh OUT [CACHE_DIR]
# BUILDS, VARIANTS and PROFILES (space-separated) override the default sets, e.g.
#   BUILDS="msl4096 msl256 b32" VARIANTS="aoti aoti+max_batch=32" PROFILES="aoti" ...
set -u
out=${1:?usage: decode_shapes_h200.sh OUT [CACHE_DIR]}
cache=${2:-/tmp/acache-decode-shapes}
mkdir -p "$out" "$cache"
acache() { python3 -m artifactcache.cli "$@"; }
common=(llama-7b --backend aoti --device cuda --dtype bf16 --cache-dir "$cache" --json)
start=$SECONDS
stamp() { echo "[$(date -u +%H:%M:%S) +$((SECONDS - start))s] $*"; }

declare -A build_opts=([msl4096]="--max-seq-len 4096" [msl256]="--max-seq-len 256"
                       [int8wo]="--quant int8wo" [b32]="--max-batch 32"
                       [b32splitkv]="--max-batch 32 --extra split_kv_decode=1")
read -r -a builds <<< "${BUILDS:-msl4096 msl256 int8wo b32}"
read -r -a variants <<< "${VARIANTS:-aoti aoti+quant=int8wo aoti+max_batch=32}"
read -r -a profiles <<< "${PROFILES:-aoti+max_batch=32 aoti+quant=int8wo}"
pids=()
for name in "${builds[@]}"; do
  opts=${build_opts[$name]}
  stamp "build $name ($opts)"
  # shellcheck disable=SC2086
  TORCHINDUCTOR_CACHE_DIR=/tmp/ind-$name acache build "${common[@]}" $opts \
    > "$out/build-$name.json" 2> "$out/build-$name.log" &
  pids+=($!)
done
for p in "${pids[@]}"; do wait "$p"; stamp "build pid $p rc $?"; done

stamp "kv_positions (aoti, 4096 vs 256)"
python3 benchmarks/kv_positions.py --out "$out/kv" --backends aoti --cache-dir "$cache" \
  > "$out/kv.log" 2>&1
stamp "kv_positions rc $?"
stamp "decode_step (aoti, int8wo, batch 32; profiles)"
python3 benchmarks/decode_step.py llama-7b --out "$out/decode" --cache-dir "$cache" \
  --variants "${variants[@]}" --profile "${profiles[@]}" > "$out/decode.log" 2>&1
stamp "decode_step rc $?; done"
