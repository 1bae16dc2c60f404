#!/bin/bash
# One GPU call: llama-7b cold builds one after another, each with empty acache, Inductor
# and Triton caches, and each build's own phase record (aoti.json / inductor.json) kept.
# A spec is BACKEND[:profile][+KEY=VALUE...]: each +KEY=VALUE becomes --extra KEY=VALUE,
# and :profile runs the build with benchmarks/workerprofile/ on PYTHONPATH, a cProfile
# of each build worker by its main thread's CPU clock (summed by workerprofile/top.py;
# the .prof files are kept).
#   bash benchmarks/build_phases_call.sh NAME aoti inductor inductor:profile
#   BENCH=1 bash benchmarks/build_phases_call.sh NAME inductor inductor+layer_regions=1
# BENCH=1: after all builds, `acache bench` on each entry, one after another (a fresh
# process: the entry's warm load, then time to first token, decode tok/s and % of the
# copy roofline).
# EXTRA (optional) is passed to every build, e.g. EXTRA="--extra coordinate_descent_tuning=0";
# RECIPE (default llama-7b) and TARGET (default "--device cuda --dtype bf16") for a CPU check.
# Results in /tmp/NAME, tarred into $OUT/NAME.tgz. Run from the repository root on the
# device machine; the builds run from /tmp, so `python -m` imports the package on
# PYTHONPATH, not the working directory's.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
export PYTHONUNBUFFERED=1 PYTHONPYCACHEPREFIX=/tmp/pyc; unset PYTHONDONTWRITEBYTECODE
NAME=$1; shift; R=/tmp/$NAME; W=/tmp/$NAME-work; T0=$(date +%s); P=$PWD
RECIPE=${RECIPE:-llama-7b}; read -ra TGT <<<"${TARGET:---device cuda --dtype bf16}"
rm -rf "$R" "$W"; mkdir -p "$R"
nvidia-smi --query-gpu=name,driver_version --format=csv > "$R/gpu.txt"
nproc > "$R/nproc.txt"
PYTHONPATH=$P:/tmp/site python3 benchmarks/_bytecode.py > "$R/bytecode.json" 2>&1

spec_id() { echo "$1-$2" | tr ':+=,' '----'; }
spec_extra() {  # the --extra options of a spec
  local rest=${1#*+}; [ "$rest" = "$1" ] && return
  for kv in ${rest//+/ }; do printf -- '--extra %s ' "$kv"; done
}

n=0
for spec in "$@"; do
  n=$((n + 1)); base=${spec%%+*}; b=${base%%:*}; id=$(spec_id $n "$spec"); mkdir -p "$W/$id"
  read -ra X <<<"$(spec_extra "$spec") ${EXTRA:-}"
  PP=$P:/tmp/site; PROF=""
  if [ "$base" != "$b" ]; then PP=$P/benchmarks/workerprofile:$PP; PROF="ACACHE_WORKER_PROFILE=$R/prof-$id"; fi
  (cd /tmp && env $PROF PYTHONPATH=$PP TORCHINDUCTOR_CACHE_DIR=$W/$id/ind \
    TRITON_CACHE_DIR=$W/$id/tri timeout 300 python3 -m artifactcache.cli build "$RECIPE" \
    -b "$b" "${TGT[@]}" "${X[@]}" --cache-dir "$W/$id/ac" --json \
    > "$R/build-$id.json" 2> "$R/build-$id.log")
  echo "$id rc=$? at $(( $(date +%s)-T0 ))s"
  find "$W/$id/ac" -name "$b.json" -exec cp {} "$R/record-$id.json" \;
  python3 benchmarks/build_phases_summary.py record "$R/record-$id.json"
  if [ -n "$PROF" ]; then python3 benchmarks/workerprofile/top.py "$R/prof-$id" --n 40 > "$R/top-$id.txt" 2>&1; fi
done

if [ -n "${BENCH:-}" ]; then
  n=0
  for spec in "$@"; do
    n=$((n + 1)); base=${spec%%+*}; b=${base%%:*}; id=$(spec_id $n "$spec")
    read -ra X <<<"$(spec_extra "$spec") ${EXTRA:-}"
    (cd /tmp && PYTHONPATH=$P:/tmp/site TORCHINDUCTOR_CACHE_DIR=$W/$id/ind-bench \
      TRITON_CACHE_DIR=$W/$id/tri-bench timeout 240 python3 -m artifactcache.cli bench \
      "$RECIPE" -b "$b" "${TGT[@]}" "${X[@]}" --cache-dir "$W/$id/ac" --iters 3 --warmup 1 \
      --json > "$R/bench-$id.json" 2> "$R/bench-$id.log")
    echo "bench $id rc=$? at $(( $(date +%s)-T0 ))s"
    python3 benchmarks/build_phases_summary.py bench "$R/bench-$id.json"
  done
fi
tar czf "$OUT/$NAME.tgz" -C /tmp "$NAME"
