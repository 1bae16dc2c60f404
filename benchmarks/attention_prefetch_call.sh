#!/bin/bash
# The decode attention's L2 prefetch of the next projection (models/decode_attention.py,
# --extra attention_prefetch=MiB) in one GPU call (issue 32):
# 1. the attention op's and the row GEMV's GPU tests (-k on_cuda: the bulk prefetch
#    compiled, under Inductor too, changes no result and copies no weight; GPU_TEST=0
#    leaves them out);
# 2. benchmarks/attention_prefetch.py: the one-row layers of MODELS in a CUDA graph, no
#    compiler, each MiB of SWEEP against none in the same run, each replay profiled, in
#    each of KINDS (bulk, lines: attention_prefetch.py's --kinds);
# 3. with VARIANTS ("RECIPE/VARIANT ...", decode_call.sh's), those builds measured by
#    decode_step.py (a fresh `acache bench` each, % of copy from the same process); the
#    word BEST in a variant becomes the MiB the sweep found fastest for its recipe.
#   bash benchmarks/attention_prefetch_call.sh NAME   (carry [".whl"])
. benchmarks/_device_call.sh
start_call "${1:?usage: attention_prefetch_call.sh NAME}"
if [ "${GPU_TEST:-1}" = 1 ]; then
  timeout "$(cap 150)" python3 -m pytest -q -p no:cacheprovider \
    tests/test_models_decode_attention.py tests/test_models_gemv.py -k on_cuda \
    > "$R/gpu-test.log" 2>&1
  echo "gpu test rc=$? at $((SECONDS - T0)) s"; tail -n 3 "$R/gpu-test.log"
fi
timeout "$(cap 200)" python3 benchmarks/attention_prefetch.py --out "$R" \
  --models "${MODELS:-phi-2,phi-3-mini,llama-7b}" --mib "${SWEEP:-0,4,8,12,16,24}" \
  --kinds "${KINDS:-bulk}" > "$R/sweep.log" 2>&1
echo "sweep rc=$? at $((SECONDS - T0)) s"; cat "$R/sweep.log" | grep -v Warning | tail -n 25
if [ -n "${VARIANTS:-}" ]; then
  variants=()
  for spec in $VARIANTS; do
    best=$(python3 -c 'import json, sys
rows = json.load(open(sys.argv[1]))["models"].get(sys.argv[2], {}).get("rows", {})
print(min(rows, key=lambda m: rows[m]["step_us"]) if rows else 16)' \
      "$R/attention_prefetch.json" "${spec%%/*}" 2>/dev/null || echo 16)
    variants+=("${spec//BEST/$best}")
  done
  echo "variants: ${variants[*]}"
  DECODE_JOBS=1 DECODE_PROFILE=${DECODE_PROFILE:-1} timeout "$(cap 560)" \
    bash benchmarks/decode_call.sh "$R/decode" "$C" "${variants[@]}" > "$R/decode.log" 2>&1
  echo "decode rc=$? at $((SECONDS - T0)) s"; grep -h -A8 '^| variant' "$R"/decode/*.log
  grep -h '"error": "' "$R"/decode/build-*.log | cut -c1-300
fi
finish_call
