#!/bin/bash
# One GPU call for docs/perf-notes.md attempts 66-68 (issue 32):
# - the rope op's GPU test (the owner's work now before the tile loop, attempt 66);
# - inductor decode, each variant measured by decode_step.py in a fresh `acache bench`
#   and profiled: phi-2's default (SDPA at 256 slots) against split-KV and split-KV with
#   rope, phi-3-mini's default against `split_kv_rope=1` (these five built two at a
#   time), then llama-7b bf16 and int8wo built one at a time (two llama-7b builds side by
#   side failed the build's memory check): the issue's same-run int8wo ratio;
# - attempt 68, as the deadline allows: phi-3-mini's default built and measured again with
#   Inductor's own kernels compiled for programmatic dependent launch
#   (TORCHINDUCTOR_ENABLE_PDL=1, in a cache of its own: the variable is not part of the
#   key), profiled, and the count of Inductor's files that wait on a predecessor.
#   bash benchmarks/owner_first_call.sh NAME   (carry [".whl"])
# Results in /tmp/NAME, tarred into $OUT/NAME.tgz; every step ends within DEADLINE_S
# (default 570), so the tar always runs.
. benchmarks/_device_call.sh
start_call "${1:?usage: owner_first_call.sh NAME}"
timeout "$(cap 90)" python3 -m pytest -q -p no:cacheprovider tests/test_models_decode_attention.py \
  -k on_cuda > "$R/rope-test.log" 2>&1
echo "rope test rc=$? at $((SECONDS - T0)) s"; tail -n 3 "$R/rope-test.log"
DECODE_JOBS=2 timeout "$(cap 270)" bash benchmarks/decode_call.sh "$R/small" "$C" \
  phi-2/inductor phi-2/inductor+split_kv_decode=1 \
  phi-2/inductor+split_kv_decode=1,split_kv_rope=1 \
  phi-3-mini/inductor phi-3-mini/inductor+split_kv_rope=1 > "$R/small.log" 2>&1
echo "small models rc=$? at $((SECONDS - T0)) s"
DECODE_JOBS=1 timeout "$(cap 200)" bash benchmarks/decode_call.sh "$R/llama" "$C" \
  llama-7b/inductor llama-7b/inductor+quant=int8wo > "$R/llama.log" 2>&1
echo "llama-7b rc=$? at $((SECONDS - T0)) s"
grep -h -A6 '^| variant' "$R"/{small,llama}/*.log
grep -h -A6 '^profile' "$R"/{small,llama}/*.log
grep -h '"error": "' "$R"/{small,llama}/build-*.log | cut -c1-400
if [ "$(cap 120)" -ge 110 ]; then
  TORCHINDUCTOR_ENABLE_PDL=1 python3 -c \
    "import torch._inductor.config as c; print('enable_pdl with the variable:', c.triton.enable_pdl)" 2>&1 | tail -n 1
  TORCHINDUCTOR_ENABLE_PDL=1 DECODE_JOBS=1 timeout "$(cap 150)" \
    bash benchmarks/decode_call.sh "$R/pdl" "$C-pdl" phi-3-mini/inductor > "$R/pdl.log" 2>&1
  echo "pdl rc=$? at $((SECONDS - T0)) s"; grep -h -A4 '^| variant' "$R"/pdl/*.log
  grep -h -A6 '^profile' "$R"/pdl/*.log
  # decode_step.py points TORCHINDUCTOR_CACHE_DIR under its results (builds/N/inductor-cache).
  echo "files with gdc_wait: $(grep -rl gdc_wait "$R/pdl" "$C-pdl" 2>/dev/null | wc -l)" \
    "of $(find "$R/pdl" -name '*.py' 2>/dev/null | wc -l) Python files"
fi
finish_call
