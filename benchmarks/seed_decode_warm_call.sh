#!/bin/bash
# One GPU call: each seed model's inductor entry on today's defaults built and benched
# (decode_call.sh: tok/s and % of the copy roofline; one decode step profiled for the
# recipes in PROFILE), then llama-7b's warm start from that entry: RUNS fresh warm
# processes each followed by an eager one (startup_diag.py warm, the probe's phases and
# subphases, what each compiled), and one warm load under cProfile (startup_diag.py
# profile). Bytecode primed first (benchmarks/README.md, "Bytecode on the GPU machine").
#   bash benchmarks/seed_decode_warm_call.sh NAME [RECIPE/VARIANT...]
# Default variants: the five seed models' inductor entries. Results in /tmp/NAME,
# tarred into $OUT/NAME.tgz. WARM_ENV (optional, e.g. "ACACHE_X=1") is set for the warm
# processes of a second round (warm-alt.json), against the same entry. Every step ends
# within DEADLINE_S (default 570), so the tar always runs.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
export PYTHONUNBUFFERED=1 PYTHONPYCACHEPREFIX=/tmp/pyc PYTHONPATH=$PWD:/tmp/site
unset PYTHONDONTWRITEBYTECODE
NAME=${1:?usage: seed_decode_warm_call.sh NAME [RECIPE/VARIANT...]}; shift
R=/tmp/$NAME; C=/tmp/$NAME-cache; T0=$SECONDS; DEADLINE_S=${DEADLINE_S:-570}
# A step's limit: its own cap, or what is left before DEADLINE_S (less 10 s for the tar).
cap() { local left=$((DEADLINE_S - 10 - (SECONDS - T0))); echo $(( left < $1 ? (left > 1 ? left : 1) : $1 )); }
RUNS=${RUNS:-3}; PROFILE=${PROFILE:-"phi-2/inductor phi-3-mini/inductor"}
SPECS=("$@"); [ ${#SPECS[@]} -gt 0 ] || SPECS=(llama-7b/inductor phi-2/inductor \
  llama-3-8b/inductor phi-3-mini/inductor mistral-7b/inductor)
rm -rf "$R" "$C"; mkdir -p "$R"
nvidia-smi --query-gpu=name,driver_version --format=csv > "$R/gpu.txt"
python3 benchmarks/_bytecode.py > "$R/bytecode.json" 2>&1
echo "bytecode at $((SECONDS - T0)) s"
DECODE_JOBS=${DECODE_JOBS:-2} DECODE_PROFILE=$PROFILE timeout "$(cap "${DECODE_LIMIT_S:-400}")" \
  bash benchmarks/decode_call.sh "$R/decode" "$C" "${SPECS[@]}" > "$R/decode.log" 2>&1
echo "decode rc=$? at $((SECONDS - T0)) s"; grep -h -A12 '^| variant' "$R"/decode/*.log
timeout "$(cap 150)" python3 benchmarks/startup_diag.py warm llama-7b --backend inductor \
  --cache-dir "$C" --runs "$RUNS" > "$R/warm.json" 2> "$R/warm.log"
echo "warm rc=$? at $((SECONDS - T0)) s"
if [ -n "${WARM_ENV:-}" ]; then
  env $WARM_ENV timeout "$(cap 150)" python3 benchmarks/startup_diag.py warm llama-7b --backend inductor \
    --cache-dir "$C" --runs "$RUNS" > "$R/warm-alt.json" 2> "$R/warm-alt.log"
  echo "warm-alt rc=$? at $((SECONDS - T0)) s"
fi
timeout "$(cap 90)" python3 benchmarks/startup_diag.py profile llama-7b --backend inductor \
  --cache-dir "$C" --out "$R/profile.txt" > "$R/profile.json" 2> "$R/profile.log"
echo "profile rc=$? at $((SECONDS - T0)) s"
tar czf "$OUT/$NAME.tgz" --exclude='*-cache' --exclude='*.pstats' -C /tmp "$NAME"
