#!/bin/bash
# One GPU call for docs/perf-notes.md attempt 64 (issue 32's int8wo >= 1.6x bf16):
# - the compiled row GEMV's GPU test (int8 now through the inline PTX cast; float and
#   int8 with loads pipelined);
# - int8 on llama-7b's four block shapes: the kernel with the PTX cast against the same
#   kernel casting a byte at a time (int8_acache_bytes), and a sweep of tiles with 1-3
#   loop stages;
# - llama-7b decode, inductor, bf16 and int8wo, each built alone, measured by
#   decode_step.py in a fresh `acache bench`, int8wo's step profiled;
# - bf16 tiles with 1-3 stages on phi-3-mini's four shapes (its row GEMVs, issue 32's
#   80%), as time allows.
#   bash benchmarks/int8_ptx_call.sh NAME   (carry [".whl"])
# INT8_SWEEP=0 and BF16_SWEEP=0 leave out the sweeps (a short call).
# Results in /tmp/NAME, tarred into $OUT/NAME.tgz; every step ends within DEADLINE_S
# (default 570), so the tar always runs.
. benchmarks/_device_call.sh
start_call "${1:?usage: int8_ptx_call.sh NAME}"
gpu_test
# INT8_SWEEP=0: the default tiles alone (the cast's A/B without the tile sweep).
sweep=(--sweep int8 --stages 1,2,3); [ "${INT8_SWEEP:-1}" = 0 ] && sweep=()
timeout "$(cap 170)" python3 benchmarks/row_gemv.py --out "$R/int8" --quant int8 \
  --no-inductor "${sweep[@]}" \
  --shapes llama_qkv,llama_o,llama_gate_up,llama_down > "$R/int8.log" 2>&1
echo "int8 kernels rc=$? at $((SECONDS - T0)) s"; grep -E 'cublas|int8_acache(_bytes)? ' "$R/int8.log"
DECODE_JOBS=1 DECODE_PROFILE="llama-7b/inductor+quant=int8wo" \
  timeout "$(cap 240)" bash benchmarks/decode_call.sh "$R/decode" "$C" llama-7b/inductor \
  llama-7b/inductor+quant=int8wo > "$R/decode.log" 2>&1
echo "decode rc=$? at $((SECONDS - T0)) s"; grep -h -A5 '^| variant' "$R"/decode/*.log
grep -h -A5 '^profile' "$R"/decode/*.log
[ "${BF16_SWEEP:-1}" = 0 ] && { finish_call; exit; }
timeout "$(cap 170)" python3 benchmarks/row_gemv.py --out "$R/bf16" --no-inductor --sweep \
  --stages 1,2,3 --shapes phi3_qkv,phi3_o,phi3_gate_up,phi3_down > "$R/bf16.log" 2>&1
echo "bf16 kernels rc=$? at $((SECONDS - T0)) s"; grep -E 'cublas|acache ' "$R/bf16.log"
finish_call
