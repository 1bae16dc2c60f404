#!/bin/bash
# One GPU call for inductor's layer regions (docs/perf-notes.md, attempt 53): llama-7b
# built as the default does (regions in the decode step) and without them (then each
# entry benched and their tokens compared with eager's), the split-KV decode path
# (--max-seq-len 4096), int8wo with them (its default since attempt 54) and without,
# phi-2 asked to use them (one serial build logged with TORCH_LOGS=dynamic), and the
# other llama-family seed models as built by default, while time is left (DEADLINE_S,
# default 480).
#   bash benchmarks/layer_regions_call.sh NAME
# Results in /tmp/NAME-*, tarred into $OUT/NAME.tgz. Run from the repository root on the
# device machine.
NAME=$1; T0=$(date +%s); DEADLINE=${DEADLINE_S:-480}; P=$PWD
left() { [ $(( $(date +%s) - T0 )) -lt "$1" ]; }
B=benchmarks/build_phases_call.sh
mkdir -p "$OUT/parts"; export OUT=$OUT/parts
BENCH=1 bash $B $NAME-llama inductor inductor+layer_regions=0
(cd /tmp && PYTHONPATH=/tmp/site PYTHONPYCACHEPREFIX=/tmp/pyc timeout 120 python3 $P/benchmarks/variant_agreement.py \
  llama-7b --device cuda --dtype bf16 --out /tmp/$NAME-llama/agree \
  --variant regions=inductor:/tmp/$NAME-llama-work/1-inductor/ac \
  --variant plain=inductor:/tmp/$NAME-llama-work/2-inductor-layer_regions-0/ac:layer_regions=0 \
  > /tmp/$NAME-llama/agree.log 2>&1; echo "agreement rc=$?")
tar czf "$OUT/$NAME-llama.tgz" -C /tmp "$NAME-llama"
left $((DEADLINE - 120)) && TARGET="--device cuda --dtype bf16 --max-seq-len 4096" BENCH=1 bash $B $NAME-4k inductor inductor+layer_regions=0
left $((DEADLINE - 60)) && EXTRA="--quant int8wo" BENCH=1 bash $B $NAME-int8 inductor inductor+layer_regions=0
if left $((DEADLINE - 60)); then
  mkdir -p /tmp/$NAME-phi2
  # phi-2 decodes with the rope inside split-KV by default since attempt 67, and a rope
  # build takes no regions: add split_kv_rope=0 (--extra split_kv_rope=0) to rerun this.
  (cd /tmp && PYTHONPATH=$P:/tmp/site PYTHONPYCACHEPREFIX=/tmp/pyc ACACHE_BUILD_JOBS=1 TORCH_LOGS=dynamic \
    TORCHINDUCTOR_CACHE_DIR=/tmp/$NAME-phi2/ind TRITON_CACHE_DIR=/tmp/$NAME-phi2/tri timeout 90 \
    python3 -m artifactcache.cli build phi-2 -b inductor --device cuda --dtype bf16 --extra layer_regions=1 \
    --cache-dir /tmp/$NAME-phi2/ac --json > /tmp/$NAME-phi2/build.json 2> /tmp/$NAME-phi2/build.log; echo "phi-2 regions rc=$?")
  rm -rf /tmp/$NAME-phi2/ind /tmp/$NAME-phi2/tri /tmp/$NAME-phi2/ac; tar czf "$OUT/$NAME-phi2.tgz" -C /tmp "$NAME-phi2"
fi
for r in llama-3-8b mistral-7b; do
  left $((DEADLINE - 50)) && RECIPE=$r BENCH=1 bash $B $NAME-$r inductor
done
echo "done at $(( $(date +%s) - T0 ))s"
