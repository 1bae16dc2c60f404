#!/bin/bash
# One GPU call: llama-7b aoti and inductor entries built one after the other (the build
# records), then first_result_diag.py on each. Results tarred to $OUT/r1.tgz.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/blake3*.whl .whl/platformdirs*.whl .whl/tomli_w*.whl; export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1; unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
R=/tmp/r1; mkdir -p $R; C=/tmp/c1; T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version --format=csv > $R/gpu.txt; git log -1 --format=%H > $R/commit.txt 2>/dev/null
python3 benchmarks/_bytecode.py > $R/bytecode.json 2>&1
for b in aoti inductor; do /usr/bin/time -v timeout 230 python3 -m artifactcache.cli build llama-7b -b $b --device cuda --dtype bf16 --cache-dir $C --json > $R/build-$b.json 2> $R/build-$b.log; echo "$b build rc=$? at $(( $(date +%s)-T0 ))s"; done
for b in aoti inductor; do timeout 150 python3 benchmarks/first_result_diag.py llama-7b --backend $b --cache-dir $C --runs 2 --out $R/diag-$b > $R/diag-$b.txt 2>&1; echo "$b diag rc=$? at $(( $(date +%s)-T0 ))s"; tail -6 $R/diag-$b.txt; done
find $C -name manifest.json | while read f; do cp $f $R/manifest-$(basename $(dirname $f)).json; done
tar czf $OUT/r1.tgz -C /tmp r1
