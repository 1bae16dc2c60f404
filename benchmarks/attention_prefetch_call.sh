#!/bin/bash
# The decode attention's L2 prefetch of the next projection (models/decode_attention.py,
# --extra attention_prefetch=MiB) and the row GEMV's two spans of x (models/gemv.py,
# x_tail) in one GPU call (issue 32, docs/perf-notes.md attempt 71):
# 1. the attention op's and the row GEMV's GPU tests (-k on_cuda: the bulk prefetch
#    compiled, under Inductor too, changes no result and copies no weight; GPU_TEST=0
#    leaves them out);
# 2. benchmarks/attention_prefetch.py: the one-row layers of MODELS in a CUDA graph, no
#    compiler, each MiB of SWEEP against none in the same run, each replay profiled, in
#    each of KINDS (bulk, lines) and CHUNKS (bytes a thread): attention_prefetch.py's
#    --kinds and --chunks, and OP its --op (rope, the default, or plain);
# 3. each of BUILDS (recipes; default none) built on inductor three ways, one at a time,
#    then measured and profiled back to back by decode_step.py (a fresh `acache bench`
#    each, % of copy from the same process): the tree before (.ab71, run from inside its
#    copy: R/old/MODEL), today's without the prefetch (R/new/MODEL; attention_prefetch=0,
#    which until f91af78 was the default that p71b-p71d built as plain "inductor") and
#    today's with the prefetch the sweep found fastest for that model (R/pf/MODEL);
#    PF_MIB names it instead (no sweep needed);
# 4. KERNEL_RUNS (default none): benchmarks/row_gemv.py once per '|'-separated argument
#    list after the measurements (_device_call.sh's kernel_runs, each within KERNEL_S).
#   bash benchmarks/attention_prefetch_call.sh NAME   (carry [".whl", ".ab71"])
# .ab71 holds artifactcache/, recipes/ and benchmarks/decode_step.py of 2555c58, made by
#   mkdir .ab71 && git archive 2555c58 artifactcache recipes benchmarks/decode_step.py | tar -x -C .ab71
# OLD_TREE (default .ab71) names another such copy for the old side, e.g. .ab73 of 6ea20c8
# (the tiles and defaults before perf-notes attempts 73 and 74; carry it instead).
. benchmarks/_device_call.sh
start_call "${1:?usage: attention_prefetch_call.sh NAME}"
[ "${GPU_TEST:-1}" = 1 ] && gpu_test
[ "${MODELS-x}" = "" ] ||  # MODELS= (empty): no sweep
timeout "$(cap 200)" python3 benchmarks/attention_prefetch.py --out "$R" \
  --models "${MODELS:-phi-2,phi-3-mini,llama-7b}" --mib "${SWEEP:-0,4,8,12,16,24}" \
  --kinds "${KINDS:-bulk}" --chunks "${CHUNKS:-4096}" --op "${OP:-rope}" > "$R/sweep.log" 2>&1
echo "sweep rc=$? at $((SECONDS - T0)) s"; grep -v Warn "$R/sweep.log" | tail -n 40
# best MODEL: the bulk prefetch's fastest MiB for MODEL in the sweep (8 without one).
best() {
  python3 -c 'import json, sys
rows = json.load(open(sys.argv[1]))["models"].get(sys.argv[2], {}).get("rows", {})
bulk = {m: r for m, r in rows.items() if m.isdigit()}
print(min(bulk, key=lambda m: bulk[m]["step_us"]) if bulk else 8)' \
    "$R/attention_prefetch.json" "$1" 2>/dev/null || echo 8
}
# step SIDE LIMIT build|measure ARGS...: decode_step.py of SIDE's tree (old: OLD_TREE), run
# from its root; measure profiles the step.
step() {
  local side=$1 limit=$2 what=$3 tree=$PWD cache=$C variant=inductor+attention_prefetch=0
  shift 3
  [ "$side" = old ] && tree=$PWD/${OLD_TREE:-.ab71} cache=$C-old variant=inductor
  [ "$side" = pf ] && variant="inductor+attention_prefetch=$mib"
  local more=(--build-only); [ "$what" = measure ] && more=(--profile "$variant")
  (cd "$tree" && timeout "$limit" python3 benchmarks/decode_step.py "$@" \
    --cache-dir "$cache" --variants "$variant" "${more[@]}")
}
# SIDES (default "old new pf") picks the builds; PF_MIB the prefetch (default: best's).
for m in ${BUILDS:-}; do
  mib=${PF_MIB:-$(best "$m")}; echo "$m: prefetch $mib MiB"
  for side in ${SIDES:-old new pf}; do
    step $side "$(cap 160)" build "$m" --out "$R/$side/builds-$m" \
      --timeout-s 150 > "$R/$side-build-$m.log" 2>&1
    echo "$side build $m rc=$? at $((SECONDS - T0)) s"
    grep -h '"error": "' "$R/$side-build-$m.log" | cut -c1-300
  done
done
for m in ${BUILDS:-}; do
  mib=${PF_MIB:-$(best "$m")}
  for side in ${SIDES:-old new pf}; do
    step $side "$(cap 60)" measure "$m" --out "$R/$side/$m" --timeout-s 55 \
      > "$R/$side-$m.log" 2>&1
    echo "$side $m rc=$? at $((SECONDS - T0)) s"; grep -A6 '^| variant' "$R/$side-$m.log"
  done
done
kernel_runs
finish_call
