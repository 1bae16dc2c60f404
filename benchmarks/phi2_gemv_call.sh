#!/bin/bash
# One GPU call for phi-2's row GEMV kernels (issue 32; docs/perf-notes.md attempt 62):
# the compiled kernel's GPU test; row_gemv.py on phi-2's fused in (LayerNorm) and out
# (GELU) shapes with every tile (--sweep), against cuBLAS and Inductor and against the
# same kernel with the prologue left out (acache_plain); then phi-2's inductor decode,
# today's default (the row GEMV) against `--extra row_gemv=0`, each built alone, the
# default's step profiled.
#   bash benchmarks/phi2_gemv_call.sh NAME   (carry [".whl"])
# PHI2_SWEEP=0: gemv_launch's tiles only; PHI2_VARIANTS: the decode's variants (default
# "inductor inductor+row_gemv=0"), built in that order. Where both inductor variants
# were built, variant_agreement.py then compares their logits and greedy tokens with
# eager's and each other's (PHI2_AGREE=0 skips it).
# Results in /tmp/NAME, tarred into $OUT/NAME.tgz; every step ends within DEADLINE_S
# (default 570), so the tar always runs.
. benchmarks/_device_call.sh
start_call "${1:?usage: phi2_gemv_call.sh NAME}"
gpu_test
sweep=(--sweep); [ "${PHI2_SWEEP:-1}" = 0 ] && sweep=()
timeout "$(cap 200)" python3 benchmarks/row_gemv.py --out "$R/kernels" "${sweep[@]}" \
  --shapes phi2_in,phi2_out > "$R/kernels.log" 2>&1
echo "kernels rc=$? at $((SECONDS - T0)) s"
grep -E " (cublas|inductor|acache|acache_plain) " "$R/kernels.log"
timeout "$(cap 120)" python3 benchmarks/_bytecode.py > "$R/bytecode.json" 2>&1
specs=()
for v in ${PHI2_VARIANTS:-inductor inductor+row_gemv=0}; do specs+=("phi-2/$v"); done
DECODE_JOBS=1 DECODE_PROFILE="phi-2/inductor" \
  timeout "$(cap 400)" bash benchmarks/decode_call.sh "$R/decode" "$C" "${specs[@]}" \
  > "$R/decode.log" 2>&1
echo "decode rc=$? at $((SECONDS - T0)) s"; grep -h -A6 '^| variant' "$R"/decode/*.log
grep -h -A5 '^profile' "$R"/decode/*.log
variants=" ${PHI2_VARIANTS:-inductor inductor+row_gemv=0} "
if [ "${PHI2_AGREE:-1}" != 0 ] && [[ $variants == *" inductor "* ]] \
    && [[ $variants == *" inductor+row_gemv=0 "* ]]; then
  timeout "$(cap 120)" python3 benchmarks/variant_agreement.py phi-2 --device cuda \
    --dtype bf16 --variant gemv=inductor:"$C" --variant plain=inductor:"$C":row_gemv=0 \
    --out "$R/agree" > "$R/agree.log" 2>&1
  echo "agreement rc=$? at $((SECONDS - T0)) s"; tail -n 20 "$R/agree.log"
fi
finish_call
