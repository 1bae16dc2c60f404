#!/bin/bash
# Attempt 69 measured beside issue 32's inductor part, in one GPU call:
# 1. the row GEMV's GPU test (tests/test_models_gemv.py -k on_cuda, its x_tail cases
#    included) while phi-2 is built from the tree before attempt 69 (.ab69);
# 2. decode_table_call.sh's inductor part: the five seed models' default inductor builds,
#    one at a time, each measured and profiled (R/decode);
# 3. phi-2 from the tree before attempt 69 measured, then today's again (cache hits): the
#    pair adjacent in time, on one machine (R/old, R/again).
#   bash benchmarks/x_tail_call.sh NAME   (carry [".whl", ".ab69"])
# .ab69 holds artifactcache/ and benchmarks/decode_step.py of 5ee79ee, where phi-2's fused
# out-projection read [attention | fc1] through a concatenation; made here by
#   mkdir .ab69 && git archive 5ee79ee artifactcache recipes benchmarks/decode_step.py | tar -x -C .ab69
# The old side runs from inside .ab69, so decode_step.py's `python -m` children import
# its artifactcache (until 2026-12-07 it ran from the repository's root, and its
# children imported today's: perf-notes attempt 69, call t70). Then, here:
#   python benchmarks/decode_table.py RESULTS/NAME/decode
. benchmarks/_device_call.sh
start_call "${1:?usage: x_tail_call.sh NAME}"
OLD=.ab69/benchmarks/decode_step.py
[ -f "$OLD" ] && [ -d .ab69/recipes ] ||
  { echo "no $OLD or .ab69/recipes: see this script's header" >&2; exit 2; }
(cd .ab69 && timeout "$(cap 200)" python3 benchmarks/decode_step.py phi-2 --build-only \
  --out "$R/old/builds" --cache-dir "$C-old" --variants inductor --timeout-s 180) \
  > "$R/old-build.log" 2>&1 &
old_build=$!
gpu_test
wait "$old_build"
echo "old build rc=$? at $((SECONDS - T0)) s"; cat "$R/old-build.log"
variants=()
for m in ${MODELS:-phi-2 llama-7b llama-3-8b mistral-7b phi-3-mini}; do
  variants+=("$m/inductor")
done
left=$(($(cap 600) - 55)); [ "$left" -ge 1 ] || left=1  # 55 s kept for the two phi-2 runs
DECODE_JOBS=1 DECODE_PROFILE=1 timeout "$left" bash benchmarks/decode_call.sh \
  "$R/decode" "$C" "${variants[@]}" > "$R/decode.log" 2>&1
echo "decode rc=$? at $((SECONDS - T0)) s"; grep -h -A8 '^| variant' "$R"/decode/*.log
grep -h '"error": "' "$R"/decode/build-*.log | cut -c1-300
(cd .ab69 && timeout "$(cap 30)" python3 benchmarks/decode_step.py phi-2 --out "$R/old" \
  --cache-dir "$C-old" --variants inductor --timeout-s 28) > "$R/old.log" 2>&1
echo "old rc=$? at $((SECONDS - T0)) s"; grep -A3 '^| variant' "$R/old.log"
timeout "$(cap 30)" python3 benchmarks/decode_step.py phi-2 --out "$R/again" --cache-dir "$C" \
  --variants inductor --timeout-s 28 > "$R/again.log" 2>&1
echo "again rc=$? at $((SECONDS - T0)) s"; grep -A3 '^| variant' "$R/again.log"
python3 benchmarks/decode_table.py "$R/decode" > "$R/table.md" 2>&1; cat "$R/table.md"
finish_call
