#!/usr/bin/env bash
# Decode of several recipes' build variants in one GPU call (issue 32): every entry built
# first, DECODE_JOBS at a time, then each recipe measured alone by decode_step.py (a fresh
# `acache bench` per variant: tok/s and % of the copy roofline from the same process),
# with one decode step profiled per variant (DECODE_PROFILE=1, the default), none (0), or
# those listed (DECODE_PROFILE="RECIPE/VARIANT ...").
#
#   benchmarks/decode_call.sh OUT CACHE_DIR RECIPE/VARIANT...
#   e.g. benchmarks/decode_call.sh R C phi-2/aoti phi-2/aoti+fuse_projections=0 phi-3-mini/aoti
#
# VARIANT is decode_step.py's `backend[:mode][+key=value,...]`. OUT gets build-N.log
# (each build's JSON lines), RECIPE/decode_step.json and RECIPE.log (its table last).
# DECODE_JOBS (default 2): builds at once; three of the small seed models side by side
# fit the H200, four builds with three 7-8B models among them ran it out of memory.
# DECODE_TIMEOUT_S (default 330): per build. The exit status is 1 if any build or
# measurement failed.
# DECODE_ARGS: more decode_step.py options for every run (a CPU check:
# DECODE_ARGS="--device cpu --dtype fp32" DECODE_PROFILE=0 ... tiny-llama/eager).
set -uo pipefail
if [ $# -lt 3 ]; then
  echo "usage: $0 OUT CACHE_DIR RECIPE/VARIANT..." >&2
  exit 2
fi
out=$(realpath -m "$1"); cache=$(realpath -m "$2"); shift 2
cd "$(dirname "$0")/.."
mkdir -p "$out"
jobs=${DECODE_JOBS:-2} limit=${DECODE_TIMEOUT_S:-330}
read -ra more <<<"${DECODE_ARGS:-}"
for spec in "$@"; do  # every spec checked before anything starts
  case $spec in */*) ;; *) echo "not RECIPE/VARIANT: $spec" >&2; exit 2 ;; esac
done
start=$SECONDS
status=0
n=0
for spec in "$@"; do
  while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n; done
  n=$((n + 1))
  # decode_step's own limit, under the outer one, stops its `acache build` child and
  # writes builds.json; the outer one only catches a hung decode_step.
  timeout "$((limit + 15))" python3 benchmarks/decode_step.py "${spec%%/*}" --build-only \
    --out "$out/builds/$n" --cache-dir "$cache" --variants "${spec#*/}" \
    --timeout-s "$limit" "${more[@]}" >"$out/build-$n.log" 2>&1 &
  echo "build $n: $spec"
done
wait
echo "builds done after $((SECONDS - start)) s"
if grep -h '"error": "' "$out"/build-*.log; then status=1; fi
recipes=$(for spec in "$@"; do echo "${spec%%/*}"; done | awk '!seen[$0]++')
for recipe in $recipes; do
  variants=()
  for spec in "$@"; do [ "${spec%%/*}" = "$recipe" ] && variants+=("${spec#*/}"); done
  profile=()
  case ${DECODE_PROFILE:-1} in
    1) profile=(--profile "${variants[@]}") ;;
    0) ;;
    *) for v in ${DECODE_PROFILE}; do  # RECIPE/VARIANT entries: this recipe's only
         [ "${v%%/*}" = "$recipe" ] && profile+=("${v#*/}")
       done
       [ ${#profile[@]} -gt 0 ] && profile=(--profile "${profile[@]}") ;;
  esac
  timeout 400 python3 benchmarks/decode_step.py "$recipe" --out "$out/$recipe" \
    --cache-dir "$cache" --variants "${variants[@]}" "${profile[@]}" --timeout-s 200 "${more[@]}" \
    >"$out/$recipe.log" 2>&1
  rc=$?
  echo "$recipe: decode_step exit $rc after $((SECONDS - start)) s"
  [ $rc -eq 0 ] || status=1
  grep -A30 '^| variant' "$out/$recipe.log"
done
exit $status
