#!/bin/bash
# One GPU call for docs/perf-notes.md attempt 67's follow-up (issue 32): phi-2's decode
# with split-KV and the rope inside it on both model backends, each build alone (clean
# build times, the issue's 10% limit): aoti and inductor, each with
# `split_kv_decode=1,split_kv_rope=1` and with the options it had by default before
# (SDPA at 256 slots: `split_kv_decode=0`), measured by decode_step.py in a fresh
# `acache bench`; aoti's rope build profiled (its first run on a GPU).
#   bash benchmarks/phi2_rope_call.sh NAME   (carry [".whl"]; PHI2_BACKENDS="aoti": one
#   backend's pair only)
# Results in /tmp/NAME, tarred into $OUT/NAME.tgz; every step ends within DEADLINE_S
# (default 570), so the tar always runs.
. benchmarks/_device_call.sh
start_call "${1:?usage: phi2_rope_call.sh NAME}"
variants=()
for b in ${PHI2_BACKENDS:-aoti inductor}; do
  variants+=("phi-2/$b+split_kv_decode=1,split_kv_rope=1" "phi-2/$b+split_kv_decode=0")
done
DECODE_JOBS=1 DECODE_PROFILE="phi-2/aoti+split_kv_decode=1,split_kv_rope=1" \
  timeout "$(cap 540)" bash benchmarks/decode_call.sh "$R/decode" "$C" "${variants[@]}" \
  > "$R/decode.log" 2>&1
echo "decode rc=$? at $((SECONDS - T0)) s"; grep -h -A7 '^| variant' "$R"/decode/*.log
grep -h -A6 '^profile' "$R"/decode/*.log
for f in "$R"/decode/build-*.log; do
  echo "$(basename "$f"): $(grep -o '"variant": "[^"]*"\|"wall_s": [0-9.]*\|"error": "[^"]\{0,200\}' "$f" | tr '\n' ' ')"
done
finish_call
