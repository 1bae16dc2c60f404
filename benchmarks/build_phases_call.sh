#!/bin/bash
# One GPU call: llama-7b cold builds one after another, each with empty acache, Inductor
# and Triton caches, and each build's own phase record (aoti.json / inductor.json) kept.
# A spec is BACKEND or BACKEND:profile; the latter runs the build with
# benchmarks/workerprofile/ on PYTHONPATH, a cProfile of each build worker by its main
# thread's CPU clock (summed by workerprofile/top.py; the .prof files are kept).
#   bash benchmarks/build_phases_call.sh NAME aoti inductor inductor:profile
# EXTRA (optional) is passed to every build, e.g. EXTRA="--extra coordinate_descent_tuning=0";
# RECIPE (default llama-7b) and TARGET (default "--device cuda --dtype bf16") for a CPU check.
# Results in /tmp/NAME, tarred into $OUT/NAME.tgz. Run from the repository root on the
# device machine; the builds run from /tmp, so `python -m` imports the package on
# PYTHONPATH, not the working directory's.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
export PYTHONUNBUFFERED=1 PYTHONPYCACHEPREFIX=/tmp/pyc; unset PYTHONDONTWRITEBYTECODE
NAME=$1; shift; R=/tmp/$NAME; W=/tmp/$NAME-work; T0=$(date +%s); P=$PWD
rm -rf "$R" "$W"; mkdir -p "$R"
nvidia-smi --query-gpu=name,driver_version --format=csv > "$R/gpu.txt"
nproc > "$R/nproc.txt"
PYTHONPATH=$P:/tmp/site python3 benchmarks/_bytecode.py > "$R/bytecode.json" 2>&1
n=0
for spec in "$@"; do
  n=$((n + 1)); b=${spec%%:*}; id=$n-${spec/:/-}; mkdir -p "$W/$id"
  PP=$P:/tmp/site; PROF=""
  if [ "$spec" != "$b" ]; then PP=$P/benchmarks/workerprofile:$PP; PROF="ACACHE_WORKER_PROFILE=$R/prof-$id"; fi
  (cd /tmp && env $PROF PYTHONPATH=$PP TORCHINDUCTOR_CACHE_DIR=$W/$id/ind \
    TRITON_CACHE_DIR=$W/$id/tri timeout 300 python3 -m artifactcache.cli build "${RECIPE:-llama-7b}" \
    -b "$b" ${TARGET:---device cuda --dtype bf16} $EXTRA --cache-dir "$W/$id/ac" --json \
    > "$R/build-$id.json" 2> "$R/build-$id.log")
  echo "$id rc=$? at $(( $(date +%s)-T0 ))s"
  find "$W/$id/ac" -name "$b.json" -exec cp {} "$R/record-$id.json" \;
  python3 - "$R/record-$id.json" <<'EOF'
import json, sys
try:
    d = json.load(open(sys.argv[1])).get("compile_seconds", {})
except OSError as e:
    sys.exit(f"no record: {e}")
print({k: round(v, 1) for k, v in d.items() if isinstance(v, (int, float))})
EOF
  if [ -n "$PROF" ]; then python3 benchmarks/workerprofile/top.py "$R/prof-$id" --n 40 > "$R/top-$id.txt" 2>&1; fi
done
tar czf "$OUT/$NAME.tgz" -C /tmp "$NAME"
