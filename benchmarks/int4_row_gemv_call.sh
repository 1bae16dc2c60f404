#!/bin/bash
# One GPU call for acache's int4 row GEMV (issue 32, item 3; docs/perf-notes.md attempt
# 57): the compiled kernel's GPU test; the kernel against tinygemm and bf16 on llama-7b's
# four block shapes, with int4's tile sweep (row_gemv.py --quant --sweep int4); llama-7b's
# decode, inductor, bf16 against --quant int8wo, --quant int4wo with tinygemm (today's
# default) and with --extra row_gemv=1 (decode_call.sh, the last one's step profiled);
# then the agreement of each with bf16 (quant_agreement.py, eager; random weights: how
# the kernels round, not how a real checkpoint fares). Bytecode primed first.
#   bash benchmarks/int4_row_gemv_call.sh NAME [kernels|decode]   (carry [".whl"])
# "kernels": the GPU test and the kernel timings only (with int4_dot_probe.py's
# tensor-core candidate); "decode": the decodes (int8wo's too) and the agreements only. GemLite's A16W4 GEMV is timed beside the kernels where
# .whl holds its wheel (and tqdm's, which it imports).
# Results in /tmp/NAME (framework caches left out), tarred into $OUT/NAME.tgz; every
# step ends within DEADLINE_S (default 570), so the tar always runs.
. benchmarks/_device_call.sh
start_call "${1:?usage: int4_row_gemv_call.sh NAME}"
timeout "$(cap 120)" python3 benchmarks/_bytecode.py > "$R/bytecode.json" 2>&1
MODE=${2:-all}
if [ "$MODE" != decode ]; then
gpu_test
timeout "$(cap 300)" python3 benchmarks/row_gemv.py --out "$R/kernels" --quant --sweep int4 \
  --no-inductor --shapes llama_qkv,llama_o,llama_gate_up,llama_down > "$R/kernels.log" 2>&1
echo "kernels rc=$? at $((SECONDS - T0)) s"
grep -E "cublas|int4_tinygemm|int4_acache |int4_gemlite|int8_acache" "$R/kernels.log"
timeout "$(cap 120)" python3 benchmarks/int4_dot_probe.py --out "$R/probe" > "$R/probe.log" 2>&1
echo "tensor-core probe rc=$? at $((SECONDS - T0)) s"; grep -E "us .* TB/s" "$R/probe.log"
fi
if [ "$MODE" = kernels ]; then
  finish_call; exit 0
fi
DECODE_JOBS=1 DECODE_PROFILE="llama-7b/inductor+quant=int4wo,row_gemv=1" \
  timeout "$(cap 420)" bash benchmarks/decode_call.sh "$R/decode" "$C" llama-7b/inductor \
  llama-7b/inductor+quant=int8wo llama-7b/inductor+quant=int4wo \
  llama-7b/inductor+quant=int4wo,row_gemv=1 > "$R/decode.log" 2>&1
echo "decode rc=$? at $((SECONDS - T0)) s"; grep -h -A6 '^| variant' "$R"/decode/*.log
# eager runs the same kernel and compiles nothing (an inductor bf16 build with row_gemv
# would be one more build in this call).
for q in int8wo int4wo int4wo,row_gemv; do
  extra=(--extra fuse_projections=1); [ "$q" = int4wo,row_gemv ] && extra+=(--extra row_gemv=1)
  timeout "$(cap 60)" python3 benchmarks/quant_agreement.py llama-7b --backend eager \
    --device cuda --dtype bf16 --quant "${q%%,*}" "${extra[@]}" --cache-dir "$C" \
    --out "$R/quant_agreement-$q.json" > "$R/agree-$q.log" 2>&1
  echo "agreement $q rc=$? at $((SECONDS - T0)) s"; tail -n 1 "$R/agree-$q.log"
done
finish_call
