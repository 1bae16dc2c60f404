#!/usr/bin/env bash
# Prefill TTFT of several recipes in one GPU call (issue 30): every recipe's aoti entry is
# built at once (the builds are CPU-bound: export, Inductor, g++), then each recipe is
# measured alone by prefill_ttft.py against transformers, the entries found as hits.
#
#   benchmarks/prefill_models.sh OUT phi-2:2048 mistral-7b:4096 phi-3-mini:4096
#
# Each RECIPE:MAX_SEQ_LEN gets OUT/RECIPE/ (prefill_ttft's results.md, JSON and logs) and
# OUT/build-RECIPE.json (`acache build --json`, with its wall time). Decode tok/s that
# prefill_ttft reports comes from entries whose decode-step tuning (coordinate descent)
# ran while the other builds used the GPU: not a figure for the decode table.
# Environment: PREFILL_LENS (16,128,512,2000,4000), PREFILL_REPS (3), PREFILL_BACKENDS
# (aoti,eager), PREFILL_BUDGET_S (per recipe's measurement, 150).
set -uo pipefail
out=$(realpath -m "$1"); shift
here=$(cd "$(dirname "$0")" && pwd)
cache=$(mktemp -d /tmp/acache-prefill-XXXX)
lens=${PREFILL_LENS:-16,128,512,2000,4000}
backends=${PREFILL_BACKENDS:-aoti,eager}
mkdir -p "$out"
for spec in "$@"; do
  recipe=${spec%%:*} len=${spec##*:}
  (
    start=$SECONDS
    for b in ${backends//,/ }; do
      TORCHINDUCTOR_CACHE_DIR=$(mktemp -d /tmp/inductor-XXXX) python3 -m artifactcache.cli build \
        "$recipe" --backend "$b" --device cuda --dtype bf16 --max-seq-len "$len" --seed 0 \
        --cache-dir "$cache" --json >"$out/build-$recipe-$b.json" 2>"$out/build-$recipe-$b.log"
      echo "[prefill-models] build $recipe/$b: exit $? after $((SECONDS - start)) s"
    done
  ) &
done
wait
for spec in "$@"; do
  recipe=${spec%%:*} len=${spec##*:}
  python3 "$here/prefill_ttft.py" --recipe "$recipe" --device cuda --dtype bf16 \
    --max-seq-len "$len" --backends "$backends" --prompt-lens "$lens" \
    --reps "${PREFILL_REPS:-3}" --jobs 1 --cache-dir "$cache" \
    --budget-s "${PREFILL_BUDGET_S:-150}" --out "$out/$recipe"
done
