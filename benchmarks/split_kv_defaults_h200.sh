#!/usr/bin/env bash
# The split-KV defaults on one H200, in one device call (about 9 minutes):
#   1. four llama-7b bf16 builds at once, each with its own Inductor cache dir: aoti at
#      the seed context (256; split-KV, the CUDA default), the same with
#      --extra split_kv_decode=0 (SDPA), aoti --max-batch 32 (split-KV), and inductor
#      reduce-overhead (split-KV);
#   2. with the GPU to itself, `acache bench` of each in a fresh process
#      (decode_step.py: seed prompt, 200 new tokens; batch 32 for the batch build);
#   3. what is left of the any-model report: BERT-base aoti at batch 32, and ort (CPU EP)
#      for ViT-B/16 at batch 32 and BERT-base at batch 1 and 32.
# Builds run side by side, so build seconds here are not cold-build figures.
# Usage: bash benchmarks/split_kv_defaults_h200.sh OUT
set -u
out=${1:?usage: split_kv_defaults_h200.sh OUT}
cache=/tmp/acache-skv-defaults
mkdir -p "$out" "$cache"
acache() { python3 -m artifactcache.cli "$@"; }
common=(llama-7b --device cuda --dtype bf16 --cache-dir "$cache" --json)
start=$SECONDS
stamp() { echo "[$(date -u +%H:%M:%S) +$((SECONDS - start))s] $*"; }

declare -A build_opts=([aoti]="--backend aoti" [aoti-sdpa]="--backend aoti --extra split_kv_decode=0"
                       [aoti-b32]="--backend aoti --max-batch 32"
                       [inductor]="--backend inductor --mode reduce-overhead")
pids=()
for name in aoti aoti-sdpa aoti-b32 inductor; do
  stamp "build $name (${build_opts[$name]})"
  # shellcheck disable=SC2086
  TORCHINDUCTOR_CACHE_DIR=/tmp/ind-$name timeout 220 acache build "${common[@]}" \
    ${build_opts[$name]} > "$out/build-$name.json" 2> "$out/build-$name.log" &
  pids+=($!)
done
for p in "${pids[@]}"; do wait "$p"; stamp "build pid $p rc $?"; done

stamp "decode_step: the four builds"
timeout 120 python3 benchmarks/decode_step.py llama-7b --out "$out/decode" --cache-dir "$cache" \
  --variants aoti aoti+split_kv_decode=0 aoti+max_batch=32 inductor:reduce-overhead \
  > "$out/decode.log" 2>&1
stamp "decode_step rc $?"
stamp "any-model: bert_base aoti batch 32"
timeout 140 python3 benchmarks/anymodel_report.py --models full --only bert_base --backends aoti \
  --batches 32 --iters 30 --out "$out/bert-aoti-b32" > "$out/bert-aoti-b32.log" 2>&1
stamp "bert aoti rc $?"
stamp "any-model: ort (CPU EP)"
timeout 70 python3 benchmarks/anymodel_report.py --models full --only vit_b_16 --backends ort \
  --batches 32 --iters 10 --warmup 2 --out "$out/ort-vit-b32" > "$out/ort-vit-b32.log" 2>&1
stamp "ort vit rc $?"
timeout 80 python3 benchmarks/anymodel_report.py --models full --only bert_base --backends ort \
  --iters 10 --warmup 2 --out "$out/ort-bert" > "$out/ort-bert.log" 2>&1
stamp "ort bert rc $?; done"
