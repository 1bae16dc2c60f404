#!/bin/bash
# Issue 31's targets on one GPU, in as many calls as it takes on one held machine:
#   1. `acache doctor`'s wall time in fresh processes (doctor_timing.sh);
#   2. llama-7b through `acache compare` (seed_table.py): eager, inductor and aoti, one
#      build and three warm processes of its entry each (--runs 3 --builds 1): cold build,
#      warm first result, what each warm process compiled, tokens against the build;
#   3. the other four seed models' inductor through the same, one run each;
#   4. warm starts from a 13.5 GB Llama-2-7B-shaped checkpoint folder in the page cache,
#      inductor then aoti (checkpoint_folder.py, 3 fresh processes per spelling).
# A step whose results are there already is skipped, so the same command on the same
# machine goes on where the last call stopped; seed_table.py resumes by unit itself.
# SEED_UNITS=DIR seeds step 2-3's finished units from an earlier call's results (a new
# machine). Every step ends within DEADLINE_S (default 570), so the tar always runs.
#   bash benchmarks/warm_targets_call.sh NAME
# Results in /tmp/NAME (entries, checkpoint and framework caches left out), tarred into
# $OUT/NAME.tgz.
T0=$SECONDS
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
export PYTHONUNBUFFERED=1 PYTHONPYCACHEPREFIX=/tmp/pyc PYTHONPATH=$PWD:/tmp/site
unset PYTHONDONTWRITEBYTECODE
NAME=${1:?usage: warm_targets_call.sh NAME}; R=/tmp/$NAME
DEADLINE_S=${DEADLINE_S:-570}
# A step's limit: its own cap, or what is left before DEADLINE_S less 15 s (the tar).
left() { echo $((DEADLINE_S - 15 - (SECONDS - T0))); }
cap() { local l; l=$(left); echo $(( l < $1 ? (l > 1 ? l : 1) : $1 )); }
mkdir -p "$R/seed/units"
if [ -n "${SEED_UNITS:-}" ] && [ -d "$SEED_UNITS" ]; then cp -rn "$SEED_UNITS"/. "$R/seed/units/"; fi
nvidia-smi --query-gpu=name,driver_version --format=csv > "$R/gpu-$SECONDS.txt"
timeout "$(cap 120)" python3 benchmarks/_bytecode.py > "$R/bytecode-$SECONDS.json" 2>&1
echo "bytecode at $((SECONDS - T0)) s"
# The doctor's cache has no build in it: the quick checks, --full and the memo, on their own.
if ! grep -q '^memo ' "$R/doctor/doctor.time" 2>/dev/null; then
  rm -rf "$R/doctor" "$R/doctor-cache"
  timeout "$(cap 60)" bash benchmarks/doctor_timing.sh "$R/doctor" "$R/doctor-cache" > "$R/doctor.log" 2>&1
  echo "doctor rc=$? at $((SECONDS - T0)) s"; cat "$R/doctor/doctor.time"
fi
seed() {  # LOG ARGS...: seed_table.py within what is left of the call
  local log=$1; shift
  [ "$(left)" -gt 60 ] || { echo "$log: not started, $(left) s left"; return; }
  timeout "$(cap 560)" python3 benchmarks/seed_table.py --out "$R/seed" --budget-s "$(left)" \
    --probe-timeout-s 400 "$@" >> "$R/$log.log" 2>&1
  echo "$log rc=$? at $((SECONDS - T0)) s"
}
seed seed-llama --recipes llama-7b --backends eager,inductor,aoti --runs 3 --builds 1
seed seed-others --recipes phi-2,phi-3-mini,mistral-7b,llama-3-8b --backends eager,inductor
CF=(--dir /tmp/ckpt --cache-dir /tmp/acache-ckpt --runs 3 --no-sweep)
for b in inductor aoti; do
  if [ ! -s "$R/ckpt-$b/checkpoint_folder.json" ] && [ "$(left)" -gt 150 ]; then
    timeout "$(cap 300)" python3 benchmarks/checkpoint_folder.py --out "$R/ckpt-$b" --backend "$b" \
      "${CF[@]}" >> "$R/ckpt-$b.log" 2>&1
    echo "checkpoint $b rc=$? at $((SECONDS - T0)) s"
    grep -s -A8 '^| path | run' "$R/ckpt-$b/checkpoint_folder.md"
  fi
done
tail -n 12 "$R"/seed-*.log
tar czf "$OUT/$NAME.tgz" --exclude='*-cache' --exclude='*.pstats' --exclude=work \
  --exclude=acache -C /tmp "$NAME"
ls -la "$OUT"
