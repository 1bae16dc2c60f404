#!/bin/bash
# One GPU call: BACKEND's llama-7b entries built one after the other, with each set of
# build extras given (";"-separated sets, "" for the defaults), then per entry
# first_result_diag.py and `acache bench --prompt-len` (steady time to first token).
#   bash benchmarks/first_result_call.sh NAME BACKEND "cudnn_prefill=1;" [RUNS]
# Results in /tmp/NAME (tar them into $OUT after, outside any time limit). Run from the
# repository root on the device machine.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/blake3*.whl .whl/platformdirs*.whl .whl/tomli_w*.whl
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 PYTHONPYCACHEPREFIX=/tmp/pyc; unset PYTHONDONTWRITEBYTECODE
NAME=$1; B=$2; SETS=$3; RUNS=${4:-2}; R=/tmp/$NAME; C=/tmp/cache-$NAME; T0=$(date +%s); mkdir -p $R
nvidia-smi --query-gpu=name,driver_version --format=csv > $R/gpu.txt
python3 benchmarks/_bytecode.py > $R/bytecode.json 2>&1
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_models_common.py -k cudnn > $R/pytest.txt 2>&1; echo "pytest rc=$?"; tail -3 $R/pytest.txt
IFS=";" read -ra VS <<< "$SETS"; [ "${SETS: -1}" = ";" ] && VS+=(""); [ -z "$SETS" ] && VS=("")
[ -n "$SKIP_BUILD" ] || i=0; [ -n "$SKIP_BUILD" ] || for v in "${VS[@]}"; do
  X=""; [ -n "$v" ] && X="--extra $v"; echo "== variant $i: '${v}'"
  /usr/bin/time -v timeout 240 python3 -m artifactcache.cli build llama-7b -b $B --device cuda --dtype bf16 $X --cache-dir $C --json > $R/build-$i.json 2> $R/build-$i.log
  echo "build rc=$? at $(( $(date +%s)-T0 ))s"; i=$((i+1)); done
i=0; for v in "${VS[@]}"; do
  X=""; [ -n "$v" ] && X="--extra=$v"
  timeout 200 python3 benchmarks/first_result_diag.py llama-7b --backend $B $X --cache-dir $C --runs $RUNS --out $R/diag-$i > $R/diag-$i.txt 2>&1
  echo "diag $i rc=$? at $(( $(date +%s)-T0 ))s"; tail -6 $R/diag-$i.txt
  X2=""; [ -n "$v" ] && X2="--extra $v"
  timeout 120 python3 -m artifactcache.cli bench llama-7b -b $B --device cuda --dtype bf16 $X2 --cache-dir $C --prompt-len 16,40,100,200 --iters 3 --warmup 1 --json > $R/bench-$i.json 2> $R/bench-$i.log
  echo "bench $i rc=$? at $(( $(date +%s)-T0 ))s"; i=$((i+1)); done
