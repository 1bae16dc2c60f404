#!/bin/bash
# One GPU call for docs/perf-notes.md attempt 65 (issue 32: phi-3-mini >= 80%, int8wo
# >= 1.6x): the rotary embedding and the cache write inside the split-KV decode kernel
# (`--extra split_kv_rope=1`, models/decode_attention.py's decode_attention_rope).
# - the op's GPU test (bf16, eager and under torch.compile with the caches as buffers);
# - inductor decode, each build with and without split_kv_rope (which builds without
#   layer regions: inductor/options.py says why), two built at a time, measured by
#   decode_step.py in a fresh `acache bench`: phi-3-mini bf16 (and without regions, to
#   part the regions' share from the kernel's), llama-7b int8wo and llama-7b bf16
#   (int8wo's ratio to bf16 in the same run), then phi-2 (whose default at 256 slots
#   is SDPA's step) against split-KV with rope; phi-3-mini's default and rope builds
#   profiled.
#   bash benchmarks/split_kv_rope_call.sh NAME   (carry [".whl"]; ROPE_SET=short: the
#   first five builds only)
# Results in /tmp/NAME, tarred into $OUT/NAME.tgz; every step ends within DEADLINE_S
# (default 570), so the tar always runs.
. benchmarks/_device_call.sh
start_call "${1:?usage: split_kv_rope_call.sh NAME}"
timeout "$(cap 120)" python3 -m pytest -q -p no:cacheprovider tests/test_models_decode_attention.py \
  -k on_cuda > "$R/rope-test.log" 2>&1
echo "rope test rc=$? at $((SECONDS - T0)) s"; tail -n 3 "$R/rope-test.log"
# ROPE_SET=short: the phi-3-mini trio and llama-7b int8wo's pair only (a short call).
variants=(phi-3-mini/inductor phi-3-mini/inductor+split_kv_rope=1
  llama-7b/inductor+quant=int8wo llama-7b/inductor+quant=int8wo,split_kv_rope=1
  phi-3-mini/inductor+layer_regions=0)
[ "${ROPE_SET:-full}" = short ] || variants+=(llama-7b/inductor llama-7b/inductor+split_kv_rope=1
  phi-2/inductor phi-2/inductor+split_kv_decode=1,split_kv_rope=1)
DECODE_JOBS=2 DECODE_PROFILE="phi-3-mini/inductor phi-3-mini/inductor+split_kv_rope=1" \
  timeout "$(cap 480)" bash benchmarks/decode_call.sh "$R/decode" "$C" "${variants[@]}" \
  > "$R/decode.log" 2>&1
echo "decode rc=$? at $((SECONDS - T0)) s"; grep -h -A10 '^| variant' "$R"/decode/*.log
grep -h -A6 '^profile' "$R"/decode/*.log
grep -h '"error": "' "$R"/decode/build-*.log | cut -c1-600
finish_call
