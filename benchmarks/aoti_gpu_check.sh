#!/usr/bin/env bash
# Check the aoti backend's compiler choice on the GPU image (no LD_PRELOAD): build
# tiny-llama and llama-7b (bf16, random weights) with `acache build`, then generate
# with `acache run` in a fresh process and record load/generate seconds.
# Usage (GPU machine, repo root): bash benchmarks/aoti_gpu_check.sh OUTDIR
set -u
out=${1:?outdir}
export ACACHE_DIR=/tmp/ac-cxx; mkdir -p -m 700 "$ACACHE_DIR"
fresh() { export TORCHINDUCTOR_CACHE_DIR=$(mktemp -d) TRITON_CACHE_DIR=$(mktemp -d) CUDA_CACHE_PATH=$(mktemp -d); }
ac() { python3 -m artifactcache.cli "$@"; }
date -u +%FT%TZ > "$out/aoti_check_date.txt"
for spec in tiny-llama:16 llama-7b:200; do
  r=${spec%:*}; n=${spec#*:}
  fresh; ac build $r -b aoti --device cuda --dtype bf16 --json > "$out/aoti_${r}_build.json" 2>"$out/aoti_${r}_build.err"
  echo "$r build rc=$?"
  fresh; ac run $r -b aoti --device cuda --dtype bf16 --tokens 1,15043,29892,590,1024,338 --max-new-tokens $n --json > "$out/aoti_${r}_run.json" 2>"$out/aoti_${r}_run.err"
  echo "$r aoti run rc=$?"
done
