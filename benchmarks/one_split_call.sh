#!/bin/bash
# Attempt 70 measured in one GPU call: the split-KV kernel with one split and no combine
# for a cache of up to 256 positions (today's tree) against the tree before it (.ab70),
# on the models whose attention takes the most of their step (phi-2, phi-3-mini: 32
# heads, 32 layers) and one with grouped heads (llama-3-8b: 8 kv heads, so 8 programs a
# layer where the split of 128 launched 16).
# 1. the attention op's GPU test (tests/test_models_decode_attention.py -k on_cuda);
# 2. each model's default inductor build from both trees, one at a time;
# 3. each model measured and its step profiled (decode_step.py, a fresh `acache bench`),
#    the tree before and today's back to back: R/old/MODEL, R/new/MODEL.
#   bash benchmarks/one_split_call.sh NAME   (carry [".whl", ".ab70"])
# .ab70 holds artifactcache/, recipes/ and benchmarks/decode_step.py of a546c2e, made here by
#   mkdir .ab70 && git archive a546c2e artifactcache recipes benchmarks/decode_step.py | tar -x -C .ab70
# The old side runs from inside .ab70: a546c2e's decode_step.py starts its children in
# the directory it is run from, and `python -m` imports artifactcache from there first.
# Each side's profile tells the trees apart: the old step launches `_combine`, the new
# one does not.
# Then, here: python benchmarks/decode_table.py RESULTS/NAME/new (and RESULTS/NAME/old
# alone: the table keeps the last folder's row of a model).
. benchmarks/_device_call.sh
start_call "${1:?usage: one_split_call.sh NAME}"
[ -f .ab70/benchmarks/decode_step.py ] && [ -d .ab70/recipes ] ||
  { echo "no .ab70 with recipes: see this script's header" >&2; exit 2; }
MODELS=${MODELS:-phi-2 phi-3-mini llama-3-8b}
timeout "$(cap 90)" python3 -m pytest -q -p no:cacheprovider \
  tests/test_models_decode_attention.py -k on_cuda > "$R/gpu-test.log" 2>&1
echo "gpu test rc=$? at $((SECONDS - T0)) s"; tail -n 3 "$R/gpu-test.log"
# step SIDE LIMIT ARGS...: decode_step.py of SIDE's tree, run from that tree's root,
# within LIMIT seconds.
step() {
  local side=$1 limit=$2 tree=$PWD cache=$C; shift 2
  [ "$side" = old ] && tree=$PWD/.ab70 cache=$C-old
  (cd "$tree" && timeout "$limit" python3 benchmarks/decode_step.py "$@" \
    --cache-dir "$cache" --variants inductor)
}
for m in $MODELS; do
  for side in old new; do
    step $side "$(cap 160)" "$m" --build-only --out "$R/$side/builds-$m" \
      --timeout-s 150 > "$R/$side-build-$m.log" 2>&1
    echo "$side build $m rc=$? at $((SECONDS - T0)) s"
    grep -h '"error": "' "$R/$side-build-$m.log" | cut -c1-300
  done
done
for m in $MODELS; do
  for side in old new; do
    step $side "$(cap 60)" "$m" --out "$R/$side/$m" --profile inductor \
      --timeout-s 55 > "$R/$side-$m.log" 2>&1
    echo "$side $m rc=$? at $((SECONDS - T0)) s"; grep -A12 '^| variant' "$R/$side-$m.log"
    python3 -c 'import json, sys; ps = json.load(open(sys.argv[1])).get("profiles") or [{}]
print(sys.argv[2], dict(ps[0].get("top_kernels", [])).get("_combine", "none"))' \
      "$R/$side/$m/decode_step.json" "$side $m _combine (launches, us a step):" 2>&1 | tail -1
  done
done
finish_call
