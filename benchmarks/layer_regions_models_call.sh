#!/bin/bash
# One GPU call for inductor's layer regions on the seed models other than llama-7b
# (docs/perf-notes.md, attempt 54): phi-2 without and with regions (off by default for
# phi-2), llama-3-8b as built by default and without, then mistral-7b and phi-3-mini as
# built by default, each entry benched, while time is left (DEADLINE_S, default 520).
#   bash benchmarks/layer_regions_models_call.sh NAME
# Results in /tmp/NAME-*, each tarred into $OUT/parts/NAME-RECIPE.tgz. Run from the
# repository root on the device machine.
NAME=$1; T0=$(date +%s); DEADLINE=${DEADLINE_S:-520}
left() { [ $(( $(date +%s) - T0 )) -lt "$1" ]; }
B=benchmarks/build_phases_call.sh
mkdir -p "$OUT/parts"; export OUT=$OUT/parts
# phi-2 decodes with the rope inside split-KV by default since attempt 67, and a rope
# build takes no regions: add split_kv_rope=0 (--extra split_kv_rope=0) to rerun this.
RECIPE=phi-2 BENCH=1 bash $B $NAME-phi-2 inductor inductor+layer_regions=1
left $((DEADLINE - 160)) && RECIPE=llama-3-8b BENCH=1 bash $B $NAME-llama-3-8b inductor inductor+layer_regions=0
for r in mistral-7b phi-3-mini; do
  left $((DEADLINE - 85)) && RECIPE=$r BENCH=1 bash $B $NAME-$r inductor
done
echo "done at $(( $(date +%s) - T0 ))s"
