#!/usr/bin/env bash
# Prefill TTFT of several recipes in one GPU call (issue 30): every recipe's entries are
# built at once (the builds are CPU-bound: export, Inductor, g++), then each recipe is
# measured alone by prefill_ttft.py against transformers, the entries found as hits.
#
#   benchmarks/prefill_models.sh OUT phi-2:2048 mistral-7b:4096 phi-3-mini:4096
#
# Each RECIPE:MAX_SEQ_LEN gets OUT/RECIPE/ (prefill_ttft's results.md, JSON and logs) and
# OUT/build-RECIPE-BACKEND.json (`acache build --json`) with its .log. A recipe whose build
# failed is not measured (its build log says why); the exit status is 1 if any build or
# measurement failed. The builds run side by side, so their Triton kernels' configs are
# benchmarked while the others use the GPU: decode tok/s that prefill_ttft reports from
# these entries is not a figure for the decode table.
# Environment: PREFILL_LENS (16,128,512,2000,4000), PREFILL_REPS (3), PREFILL_BACKENDS
# (aoti,eager), PREFILL_BUDGET_S (per recipe's measurement, 150).
set -uo pipefail
if [ $# -lt 2 ]; then
  echo "usage: $0 OUT RECIPE:MAX_SEQ_LEN [RECIPE:MAX_SEQ_LEN ...]" >&2
  exit 2
fi
for spec in "${@:2}"; do
  if [[ $spec != *:* ]]; then
    echo "$0: $spec: expected RECIPE:MAX_SEQ_LEN" >&2
    exit 2
  fi
done
out=$(realpath -m "$1"); shift
here=$(cd "$(dirname "$0")" && pwd)
cd "$here/.."  # python3 -m artifactcache finds this checkout
work=$(mktemp -d /tmp/acache-prefill-XXXX)
cache=$work/cache
# A stopped script (a timeout) stops its builds too, rather than leave them on the GPU.
trap 'kill $(jobs -p) 2>/dev/null; rm -rf "$work/inductor-"*' EXIT
lens=${PREFILL_LENS:-16,128,512,2000,4000}
backends=${PREFILL_BACKENDS:-aoti,eager}
mkdir -p "$out"
declare -A builder
for spec in "$@"; do
  recipe=${spec%%:*} len=${spec##*:}
  (
    rc=0
    for b in ${backends//,/ }; do
      start=$SECONDS
      TORCHINDUCTOR_CACHE_DIR=$(mktemp -d "$work/inductor-XXXX") python3 -m artifactcache.cli \
        build "$recipe" --backend "$b" --device cuda --dtype bf16 --max-seq-len "$len" \
        --seed 0 --cache-dir "$cache" --json \
        >"$out/build-$recipe-$b.json" 2>"$out/build-$recipe-$b.log"
      one=$?
      [ $one -eq 0 ] || rc=1
      echo "[prefill-models] build $recipe/$b: exit $one after $((SECONDS - start)) s"
    done
    exit $rc
  ) &
  builder[$recipe]=$!
done
status=0
declare -A failed
for spec in "$@"; do
  recipe=${spec%%:*}
  if ! wait "${builder[$recipe]}"; then
    echo "[prefill-models] $recipe: a build failed; not measured (see $out/build-$recipe-*.log)"
    failed[$recipe]=1
    status=1
  fi
done
for spec in "$@"; do
  recipe=${spec%%:*} len=${spec##*:}
  [ -n "${failed[$recipe]:-}" ] && continue
  python3 "$here/prefill_ttft.py" --recipe "$recipe" --device cuda --dtype bf16 \
    --max-seq-len "$len" --backends "$backends" --prompt-lens "$lens" \
    --reps "${PREFILL_REPS:-3}" --jobs 1 --cache-dir "$cache" \
    --budget-s "${PREFILL_BUDGET_S:-150}" --out "$out/$recipe" || status=1
done
exit $status
