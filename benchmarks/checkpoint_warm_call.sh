#!/bin/bash
# One GPU call: warm starts from a 13.5 GB Llama-2-7B-shaped checkpoint folder in the page
# cache (checkpoint_folder.py, 2 fresh processes per spelling): inductor, then the same
# entry under LOAD_ENV if set (a load-time setting to compare), then aoti; then, while
# DEADLINE_S (default 560) allows, decode_call.sh on the RECIPE/VARIANT specs given,
# profiling those in PROFILE. Bytecode primed first (benchmarks/README.md, "Bytecode on the GPU machine").
#   bash benchmarks/checkpoint_warm_call.sh NAME [RECIPE/VARIANT...]
# Results in /tmp/NAME (framework caches left out), tarred into $OUT/NAME.tgz.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
export PYTHONUNBUFFERED=1 PYTHONPYCACHEPREFIX=/tmp/pyc PYTHONPATH=$PWD:/tmp/site
unset PYTHONDONTWRITEBYTECODE
NAME=${1:?usage: checkpoint_warm_call.sh NAME [RECIPE/VARIANT...]}; shift; R=/tmp/$NAME
T0=$SECONDS; DEADLINE_S=${DEADLINE_S:-560}
# A step's limit: its own cap, or what is left before DEADLINE_S less 10 s (the tar at the
# end always runs).
cap() { local left=$((DEADLINE_S - 10 - (SECONDS - T0))); echo $(( left < $1 ? (left > 1 ? left : 1) : $1 )); }
CF=(--dir /tmp/ckpt --cache-dir /tmp/acache-ckpt --runs 2 --no-sweep)
rm -rf "$R"; mkdir -p "$R"
nvidia-smi --query-gpu=name,driver_version --format=csv > "$R/gpu.txt"
python3 benchmarks/_bytecode.py > "$R/bytecode.json" 2>&1
echo "bytecode at $((SECONDS - T0)) s"
timeout "$(cap 220)" python3 benchmarks/checkpoint_folder.py --out "$R/ckpt-inductor" --backend inductor \
  "${CF[@]}" > "$R/ckpt-inductor.log" 2>&1
echo "inductor rc=$? at $((SECONDS - T0)) s"
if [ -n "${LOAD_ENV:-}" ]; then
  # shellcheck disable=SC2086  # LOAD_ENV is NAME=VALUE words, split on purpose
  env $LOAD_ENV timeout "$(cap 90)" python3 benchmarks/checkpoint_folder.py \
    --out "$R/ckpt-inductor-env" --backend inductor "${CF[@]}" > "$R/ckpt-inductor-env.log" 2>&1
  echo "inductor under $LOAD_ENV rc=$? at $((SECONDS - T0)) s"
fi
timeout "$(cap 200)" python3 benchmarks/checkpoint_folder.py --out "$R/ckpt-aoti" --backend aoti \
  "${CF[@]}" > "$R/ckpt-aoti.log" 2>&1
echo "aoti rc=$? at $((SECONDS - T0)) s"
for d in ckpt-inductor ckpt-inductor-env ckpt-aoti; do grep -s -A6 '^| path | run' "$R/$d/checkpoint_folder.md"; done
left=$((DEADLINE_S - (SECONDS - T0) - 10))  # 10 s kept for the tar
if [ $# -gt 0 ] && [ "$left" -gt 90 ]; then
  DECODE_JOBS=2 DECODE_PROFILE=${PROFILE:-0} timeout "$left" bash benchmarks/decode_call.sh \
    "$R/decode" /tmp/acache-decode "$@" > "$R/decode.log" 2>&1
  echo "decode rc=$? at $((SECONDS - T0)) s"; grep -h -A14 '^| variant' "$R"/decode/*.log
fi
tar czf "$OUT/$NAME.tgz" --exclude='*-cache' --exclude='*.pstats' --exclude=ckpt -C /tmp "$NAME"
ls -la "$OUT"
