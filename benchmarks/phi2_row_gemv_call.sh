#!/bin/bash
# One GPU call for phi-2's row GEMV (issue 32; docs/perf-notes.md attempt 59): the
# compiled kernel's GPU test (every prologue, LayerNorm and GELU included, on seed and
# phi-2 shapes, the LayerNorm through Inductor too), then phi-2's decode with the row
# GEMV (today's default) beside `--extra row_gemv=0`, inductor and then aoti
# (PHI2_BACKENDS, default "inductor aoti"), two builds at once (decode_call.sh), the
# inductor pair's steps profiled. (p4 ran it when the default was off: its pairs were
# `+row_gemv=1` and the plain build.)
#   bash benchmarks/phi2_row_gemv_call.sh NAME   (run with carry [".whl"])
# Results in /tmp/NAME, tarred into $OUT/NAME.tgz; every step ends within DEADLINE_S
# (default 570), so the tar always runs.
. benchmarks/_device_call.sh
start_call "${1:?usage: phi2_row_gemv_call.sh NAME}"
gpu_test
specs=()
for b in ${PHI2_BACKENDS:-inductor aoti}; do specs+=("phi-2/$b" "phi-2/$b+row_gemv=0"); done
DECODE_JOBS=2 DECODE_PROFILE="phi-2/inductor phi-2/inductor+row_gemv=0" \
  timeout "$(cap 420)" bash benchmarks/decode_call.sh "$R/decode" "$C" "${specs[@]}" \
  > "$R/decode.log" 2>&1
echo "decode rc=$? at $((SECONDS - T0)) s"; grep -h -A7 '^| variant' "$R"/decode/*.log
grep -h -A5 '^profile' "$R"/decode/*.log
finish_call
