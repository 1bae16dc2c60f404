#!/bin/bash
# One GPU call: llama-7b's aoti build by this tree against another tree's, alternating
# (other, this, other, this), each with empty acache, Inductor and Triton caches, so
# neither finds the other's kernels or verdicts. The other tree is a copy of the
# package and its recipes, made before the call (the device has no git):
#   git archive REV artifactcache recipes | (mkdir -p .ab_other && tar -x -C .ab_other)
#   bash benchmarks/aoti_build_ab.sh .ab_other NAME [ROUNDS]       # then rm -rf .ab_other
# With CHILDLOG=1 each build logs its child processes (benchmarks/childlog/), summed by
# childlog_summary.py. Results in /tmp/NAME, tarred into $OUT. Run from the repository
# root on the device machine; builds run from /tmp, so `python -m` cannot pick up the
# package in the working directory instead of the one on PYTHONPATH.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
export PYTHONUNBUFFERED=1 PYTHONPYCACHEPREFIX=/tmp/pyc; unset PYTHONDONTWRITEBYTECODE
OTHER=$(cd "$1" && pwd); NAME=$2; ROUNDS=${3:-2}; R=/tmp/$NAME; W=/tmp/$NAME-work; T0=$(date +%s)
rm -rf "$R" "$W"; mkdir -p "$R"
nvidia-smi --query-gpu=name,driver_version --format=csv > "$R/gpu.txt"
PYTHONPATH=$PWD:/tmp/site python3 benchmarks/_bytecode.py > "$R/bytecode.json" 2>&1
for i in $(seq 1 "$ROUNDS"); do for side in other this; do
  n=$side$i; P=$PWD; [ $side = other ] && P=$OTHER; mkdir -p "$W/$n/cl"
  LOG=""; [ -n "$CHILDLOG" ] && LOG="ACACHE_CHILDLOG=$W/$n/cl" && P=$PWD/benchmarks/childlog:$P
  (cd /tmp && env $LOG PYTHONPATH=$P:/tmp/site TORCHINDUCTOR_CACHE_DIR=$W/$n/ind \
    TRITON_CACHE_DIR=$W/$n/tri timeout 240 python3 -m artifactcache.cli build llama-7b \
    -b aoti --device cuda --dtype bf16 --cache-dir $W/$n/ac --json > $R/build-$n.json 2> $R/build-$n.log)
  echo "$n rc=$? at $(( $(date +%s)-T0 ))s"
  find "$W/$n/ac" -name aoti.json -exec cp {} "$R/aoti-$n.json" \;
  [ -n "$CHILDLOG" ] && python3 benchmarks/childlog_summary.py "$W/$n/cl" > "$R/children-$n.md"
  python3 -c "import json; d=json.load(open('$R/aoti-$n.json'))['compile_seconds']; print('$n', {k: d[k] for k in ('wall', 'prefill', 'extend', 'decode')})"
done; done
tar czf "$OUT/$NAME.tgz" -C /tmp "$NAME"
