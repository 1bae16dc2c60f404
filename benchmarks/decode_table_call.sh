#!/bin/bash
# Issue 32's table remeasured in four GPU calls (one part each), summarized by
# decode_table.py: every variant built, measured by decode_step.py in a fresh `acache
# bench` (random weights, the seed prompt, 200 new tokens, % of the copy roofline from
# the same process) and its decode step profiled.
#   bash benchmarks/decode_table_call.sh NAME PART   (carry [".whl"])
# PART: inductor: the five seed models' default builds;
#       aoti-7b, aoti-small: the same on aoti, llama-7b, llama-3-8b and mistral-7b, then
#       phi-3-mini and phi-2 (five aoti builds one at a time do not fit one call);
#       aoti: all five, meant for an H200 with DECODE_JOBS=2 DECODE_PROFILE=0 (two
#       builds at a time, no profiles; not yet run there: on an H100 two builds at once
#       ran out of GPU memory);
#       llama: llama-7b on inductor, bf16, int8wo and int4wo (the ratios from one run),
#       and bf16 built for batch 8 and 32;
#       list: the RECIPE/VARIANT entries in VARIANTS (what is left of a table);
#       none: no build (GPU_TEST and KERNEL_RUNS only).
# Before the builds: GPU_TEST=1 runs the decode kernels' GPU tests; KERNEL_RUNS runs
# benchmarks/row_gemv.py once per '|'-separated argument list (R/kernels-N), each within
# KERNEL_S (default 200) seconds.
# MODELS replaces a part's models. Builds one at a time (DECODE_JOBS, default 1): two
# 7-8B builds side by side failed the build's memory check on an H100. DECODE_PROFILE
# (default 1) as decode_call.sh takes it. Every build ends before the first
# measurement, so a part cut by the deadline measures nothing. Results
# in /tmp/NAME, tarred into $OUT/NAME.tgz; every step ends within DEADLINE_S (default
# 570), so the tar always runs. Afterwards, here, over the four parts' results:
#   python benchmarks/decode_table.py RESULTS/NAME1 RESULTS/NAME2 RESULTS/NAME3 RESULTS/NAME4
[ "${2:-}" != list ] || [ -n "${VARIANTS:-}" ] ||
  { echo 'the list part takes VARIANTS="RECIPE/VARIANT ..."' >&2; exit 2; }
. benchmarks/_device_call.sh
start_call "${1:?usage: decode_table_call.sh NAME PART}"
variants=()
case ${2:?usage: decode_table_call.sh NAME PART} in
  inductor)
    for m in ${MODELS:-llama-7b llama-3-8b mistral-7b phi-3-mini phi-2}; do
      variants+=("$m/inductor")
    done ;;
  aoti | aoti-7b | aoti-small)
    default="llama-7b llama-3-8b mistral-7b"; [ "$2" = aoti-small ] && default="phi-3-mini phi-2"
    [ "$2" = aoti ] && default="llama-7b llama-3-8b mistral-7b phi-3-mini phi-2"
    for m in ${MODELS:-$default}; do variants+=("$m/aoti"); done ;;
  llama)
    variants=(llama-7b/inductor llama-7b/inductor+quant=int8wo llama-7b/inductor+quant=int4wo
      llama-7b/inductor+max_batch=8 llama-7b/inductor+max_batch=32) ;;
  list) read -ra variants <<<"$VARIANTS" ;;
  none) ;;
  *) echo "PART is inductor, aoti, aoti-7b, aoti-small, llama, list or none, not $2" >&2; exit 2 ;;
esac
# GPU_TEST=1: the decode kernels' GPU tests first; KERNEL_RUNS: row_gemv.py runs next
# (_device_call.sh's kernel_runs), before any build.
[ "${GPU_TEST:-0}" = 1 ] && gpu_test
kernel_runs
[ ${#variants[@]} -gt 0 ] || { finish_call; exit 0; }
DECODE_JOBS=${DECODE_JOBS:-1} DECODE_PROFILE=${DECODE_PROFILE:-1} timeout "$(cap 560)" bash benchmarks/decode_call.sh \
  "$R/decode" "$C" "${variants[@]}" > "$R/decode.log" 2>&1
echo "decode rc=$? at $((SECONDS - T0)) s"; grep -h -A8 '^| variant' "$R"/decode/*.log
grep -h '"error": "' "$R"/decode/build-*.log | cut -c1-300
python3 benchmarks/decode_table.py "$R" > "$R/table.md" 2>&1; cat "$R/table.md"
finish_call
