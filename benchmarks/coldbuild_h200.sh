#!/usr/bin/env bash
# A llama-7b bf16 aoti cold build on one H200, the two steps built concurrently (the
# default on CUDA) and then serially (ACACHE_BUILD_JOBS=1), each alone on the machine
# with empty acache, Inductor and Triton caches; between them, `acache bench` on the
# concurrent build's entry, so a faster build is not bought with a slower artifact.
# Usage: bash benchmarks/coldbuild_h200.sh OUT
set -u
out=${1:?usage: coldbuild_h200.sh OUT}
mkdir -p "$out"
acache() { python3 -m artifactcache.cli "$@"; }
start=$SECONDS
stamp() { echo "[$(date -u +%H:%M:%S) +$((SECONDS - start))s] $*"; }
fresh() {  # empty caches for one build: acache's, Inductor's and Triton's
  rm -rf "/tmp/cb-$1" && mkdir -p "/tmp/cb-$1"
  export TORCHINDUCTOR_CACHE_DIR=/tmp/cb-$1/inductor TRITON_CACHE_DIR=/tmp/cb-$1/triton
}
common=(llama-7b --backend aoti --device cuda --dtype bf16 --json)
timings() {  # the entry's own record of where the build's time went
  python3 -c "import json, sys; p = json.load(open(sys.argv[1]))['path']
m = json.load(open(p + '/aoti.json'))
print(json.dumps({'build_jobs': m.get('build_jobs'), 'compile_seconds': m['compile_seconds']}))" \
    "$out/build-$1.json" > "$out/timings-$1.json" 2>&1
}

fresh concurrent
stamp "build, steps concurrently"
acache build "${common[@]}" --cache-dir /tmp/cb-concurrent/acache \
  > "$out/build-concurrent.json" 2> "$out/build-concurrent.log"
stamp "rc $?"; timings concurrent
stamp "bench the concurrent build's entry"
acache bench "${common[@]}" --cache-dir /tmp/cb-concurrent/acache --iters 3 --warmup 1 \
  > "$out/bench-concurrent.json" 2> "$out/bench-concurrent.log"
stamp "rc $?"
fresh serial
stamp "build, steps serially"
ACACHE_BUILD_JOBS=1 acache build "${common[@]}" --cache-dir /tmp/cb-serial/acache \
  > "$out/build-serial.json" 2> "$out/build-serial.log"
stamp "rc $?"; timings serial; stamp done
