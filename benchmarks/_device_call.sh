# Sourced by the device call scripts (int4_row_gemv_call.sh, phi2_row_gemv_call.sh) from
# the repository root: the wheels .whl carries installed into /tmp/site, the environment
# every step runs with (bytecode written under /tmp/pyc), T0, DEADLINE_S (default 570)
# and cap.
T0=$SECONDS
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
export PYTHONUNBUFFERED=1 PYTHONPYCACHEPREFIX=/tmp/pyc PYTHONPATH=$PWD:/tmp/site
unset PYTHONDONTWRITEBYTECODE
DEADLINE_S=${DEADLINE_S:-570}
# cap S: S seconds, or fewer where the deadline (less 15 s for the tar) is nearer; >= 1.
cap() { local l=$((DEADLINE_S - 15 - (SECONDS - T0))); echo $(( l < $1 ? (l > 1 ? l : 1) : $1 )); }
