# Sourced by the device call scripts (int4_row_gemv_call.sh, phi2_row_gemv_call.sh,
# phi2_default_call.sh, phi2_gemv_call.sh, int8_ptx_call.sh) from the repository root: the wheels .whl
# carries installed into /tmp/site, the environment every step runs with (bytecode
# written under /tmp/pyc), T0, DEADLINE_S (default 570), cap, start_call, gpu_test,
# kernel_runs and finish_call.
T0=$SECONDS
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
export PYTHONUNBUFFERED=1 PYTHONPYCACHEPREFIX=/tmp/pyc PYTHONPATH=$PWD:/tmp/site
unset PYTHONDONTWRITEBYTECODE
DEADLINE_S=${DEADLINE_S:-570}
# cap S: S seconds, or fewer where the deadline (less 15 s for the tar) is nearer; >= 1.
cap() { local l=$((DEADLINE_S - 15 - (SECONDS - T0))); echo $(( l < $1 ? (l > 1 ? l : 1) : $1 )); }
# start_call NAME: R=/tmp/NAME (emptied) for the results, C=/tmp/NAME-cache for acache's
# cache, the GPU's name, driver, UUID and PCI bus in R/gpu.txt (the UUID tells whether
# two calls ran on one machine).
start_call() {
  NAME=$1; R=/tmp/$NAME; C=/tmp/$NAME-cache
  rm -rf "$R"; mkdir -p "$R"
  nvidia-smi --query-gpu=name,driver_version,uuid,pci.bus_id --format=csv > "$R/gpu.txt"
}
# gpu_test: the decode kernels' GPU tests (the row GEMV's and the split-KV attention's,
# `-k on_cuda`), their log in R/gpu-test.log, their status and last lines printed.
gpu_test() {
  timeout "$(cap 150)" python3 -m pytest -q -p no:cacheprovider tests/test_models_gemv.py \
    tests/test_models_decode_attention.py -k on_cuda > "$R/gpu-test.log" 2>&1
  echo "gpu test rc=$? at $((SECONDS - T0)) s"; tail -n 3 "$R/gpu-test.log"
}
# kernel_runs: benchmarks/row_gemv.py once for each '|'-separated argument list in
# KERNEL_RUNS (none: nothing), R/kernels-N/row_gemv.json and R/kernels-N.log; each run
# within KERNEL_S (default 200) and the deadline.
kernel_runs() {
  local n=0 run args runs
  IFS='|' read -ra runs <<<"${KERNEL_RUNS:-}"
  for run in "${runs[@]}"; do
    n=$((n + 1)); read -ra args <<<"$run"
    [ ${#args[@]} -gt 0 ] || continue  # an empty piece ("a||b"): nothing to run
    timeout "$(cap "${KERNEL_S:-200}")" python3 benchmarks/row_gemv.py --out "$R/kernels-$n" \
      "${args[@]}" > "$R/kernels-$n.log" 2>&1
    echo "kernels $n ($run) rc=$? at $((SECONDS - T0)) s"
  done
}
# finish_call: R tarred into $OUT/NAME.tgz (framework caches and profiles' pstats left
# out, as $OUT comes back small, but the entries' Inductor tuning winners kept, in
# R/best-configs.tgz: which config each build's coordinate descent chose), $OUT listed.
finish_call() {
  find "$C"* -name '*.best_config' 2>/dev/null |
    tar czf "$R/best-configs.tgz" -T - 2>/dev/null
  tar czf "$OUT/$NAME.tgz" --exclude='*-cache' --exclude='*.pstats' -C /tmp "$NAME"
  ls -la "$OUT"
}
