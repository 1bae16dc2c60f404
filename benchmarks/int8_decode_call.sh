#!/usr/bin/env bash
# llama-7b's int8 weight-only decode against bf16, in one GPU call (issue 32, perf-notes
# attempt 30): aoti bf16, aoti --quant int8wo and inductor --quant int8wo built side by
# side into one cache dir, then decode_step.py measures each in a fresh `acache bench`
# (tok/s, % of the copy roofline from the same process) and profiles one aoti int8wo
# decode step, then quant_agreement.py compares the aoti int8wo build with the bf16 one.
#
#   benchmarks/int8_decode_call.sh OUT [CACHE_DIR]
#
# OUT gets build-*.json/.log, decode/ (decode_step.json and its table), decode.log,
# quant_agreement.json and agree.log. Random weights: the agreement figures say how the
# kernels round, not how a real checkpoint fares.
#
# INT8_CALL_BUILDS picks the builds (default: aoti aoti-int8wo inductor-int8wo; also
# inductor), and the variants measured follow them. Three builds at once ran the H200
# out of memory (one failed): give two at a time.
set -uo pipefail
if [ $# -lt 1 ]; then
  echo "usage: $0 OUT [CACHE_DIR]" >&2
  exit 2
fi
out=$(realpath -m "$1"); cache=${2:-$(mktemp -d /tmp/acache-int8-XXXX)}
cd "$(dirname "$0")/.."
mkdir -p "$out"
build() {  # NAME ARGS...: one build, its JSON and log under OUT
  local name=$1; shift
  timeout 330 python3 -m artifactcache.cli build llama-7b --device cuda --dtype bf16 \
    --cache-dir "$cache" --json "$@" >"$out/build-$name.json" 2>"$out/build-$name.log"
  echo "build $name exit $?"
}
declare -A args=([aoti]="--backend aoti" [aoti-int8wo]="--backend aoti --quant int8wo"
  [inductor]="--backend inductor" [inductor-int8wo]="--backend inductor --quant int8wo")
declare -A variant=([aoti]=aoti [aoti-int8wo]=aoti+quant=int8wo [inductor]=inductor
  [inductor-int8wo]=inductor+quant=int8wo)
builds=${INT8_CALL_BUILDS:-aoti aoti-int8wo inductor-int8wo}
variants=() profile=()
start=$SECONDS
for b in $builds; do
  [ -n "${args[$b]:-}" ] || { echo "unknown build $b" >&2; exit 2; }
  # shellcheck disable=SC2086
  build "$b" ${args[$b]} &
  variants+=("${variant[$b]}")
  [ "$b" = aoti-int8wo ] && profile=(--profile aoti+quant=int8wo)
done
wait
echo "builds done after $((SECONDS - start)) s"
timeout 200 python3 benchmarks/decode_step.py llama-7b --out "$out/decode" --cache-dir "$cache" \
  --variants "${variants[@]}" "${profile[@]}" --timeout-s 180 >"$out/decode.log" 2>&1
echo "decode_step exit $? after $((SECONDS - start)) s"
tail -8 "$out/decode.log"
[ "${profile[*]}" ] || exit 0  # the agreement reads the aoti builds
timeout 90 python3 benchmarks/quant_agreement.py llama-7b --backend aoti --device cuda \
  --dtype bf16 --cache-dir "$cache" --out "$out/quant_agreement.json" >"$out/agree.log" 2>&1
echo "quant_agreement exit $? after $((SECONDS - start)) s"
tail -3 "$out/agree.log"
