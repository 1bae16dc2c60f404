#!/bin/bash
# One GPU call for issue 32's last measurements of the day (docs/benchmarks.md, "phi-2's
# row GEMV default and llama-7b's quantized decode, one machine"): every build alone
# (DECODE_JOBS=1: no build's Inductor tuning shares the GPU, no quantization runs out of
# its memory), then each recipe measured by decode_step.py in a fresh `acache bench`.
# - phi-2, inductor: today's default (the row GEMV, on since the A/B of
#   phi2_row_gemv_call.sh) against `--extra row_gemv=0`, both steps profiled;
# - llama-7b, inductor: bf16, int8wo and int4wo (tinygemm), bf16's step profiled:
#   the quantized ratios again on one machine.
#   bash benchmarks/phi2_default_call.sh NAME   (carry [".whl"])
# Results in /tmp/NAME, tarred into $OUT/NAME.tgz; every step ends within DEADLINE_S
# (default 570), so the tar always runs.
. benchmarks/_device_call.sh
start_call "${1:?usage: phi2_default_call.sh NAME}"
timeout "$(cap 120)" python3 benchmarks/_bytecode.py > "$R/bytecode.json" 2>&1
DECODE_JOBS=1 DECODE_PROFILE="phi-2/inductor phi-2/inductor+row_gemv=0 llama-7b/inductor" \
  timeout "$(cap 540)" bash benchmarks/decode_call.sh "$R/decode" "$C" phi-2/inductor \
  phi-2/inductor+row_gemv=0 llama-7b/inductor llama-7b/inductor+quant=int8wo \
  llama-7b/inductor+quant=int4wo > "$R/decode.log" 2>&1
echo "decode rc=$? at $((SECONDS - T0)) s"; grep -h -A7 '^| variant' "$R"/decode/*.log
grep -h -A5 '^profile' "$R"/decode/*.log
finish_call
