#!/usr/bin/env bash
# Where a warm inductor (aot_compile) process's time goes, in one GPU call (issue 31):
# build RECIPE's inductor entry, then, in fresh processes with empty framework caches,
# RUNS timed warm starts each followed by an eager start (startup_diag.py warm: phases
# and compile counters, no profiler), twice: as the machine's Python is, and with
# PYTHONPYCACHEPREFIX set (a first, extra run writes the bytecode there, as pip does at
# install time on a normal machine; see bytecode.txt for why), then one cProfile of
# load + first token with that bytecode (startup_diag.py profile).
#
#   benchmarks/inductor_load_call.sh OUT [RECIPE] [BUILD_TIMEOUT_S] [RUNS]
#
# OUT gets bytecode.txt (can this Python cache bytecode for site-packages?), build.json
# and .log, warm-{plain,pyc}.jsonl (a JSON line per process, then the whole result),
# profile-pyc.txt (+ .pstats, the raw stats) and a line per step in steps.log. Exit 1 if
# the build failed (nothing else can run without the entry). LOAD_CALL_CACHE: the cache
# dir to build into (default: a temp dir).
set -uo pipefail
if [ $# -lt 1 ]; then
  echo "usage: $0 OUT [RECIPE] [BUILD_TIMEOUT_S] [RUNS]" >&2
  exit 2
fi
out=$(realpath -m "$1"); recipe=${2:-llama-7b}; build_timeout=${3:-360}; runs=${4:-3}
here=$(cd "$(dirname "$0")" && pwd)
cd "$here/.."
work=$(mktemp -d /tmp/acache-load-XXXX)
cache=${LOAD_CALL_CACHE:-$work/cache}  # set it to measure the entry afterwards too
mkdir -p "$out"
step() { echo "[load-call] $(date -u +%T) $*" | tee -a "$out/steps.log"; }
python3 - >"$out/bytecode.txt" 2>&1 <<'PY'
import os, sys, sysconfig, sympy
site = sysconfig.get_paths()["purelib"]
cached = os.path.join(os.path.dirname(sympy.__file__), "__pycache__")
print("sys.dont_write_bytecode", sys.dont_write_bytecode)
print("PYTHON* env", {k: v for k, v in os.environ.items() if k.startswith("PYTHON")})
print("site-packages", site, "writable", os.access(site, os.W_OK))
print("sympy __pycache__", cached, "exists", os.path.isdir(cached),
      "files", len(os.listdir(cached)) if os.path.isdir(cached) else 0)
PY
step "bytecode: $(tr '\n' ' ' <"$out/bytecode.txt")"
step "build $recipe inductor (timeout ${build_timeout}s)"
start=$SECONDS
TORCHINDUCTOR_CACHE_DIR=$(mktemp -d "$work/inductor-XXXX") timeout "$build_timeout" \
  python3 -m artifactcache.cli build "$recipe" --backend inductor --device cuda --dtype bf16 \
  --cache-dir "$cache" --json >"$out/build.json" 2>"$out/build.log"
rc=$?
step "build exit $rc after $((SECONDS - start)) s"
[ $rc -eq 0 ] || exit 1
start=$SECONDS
timeout 200 python3 benchmarks/startup_diag.py warm "$recipe" --backend inductor \
  --cache-dir "$cache" --runs "$runs" >"$out/warm-plain.jsonl" 2>"$out/warm-plain.log"
step "warm plain exit $? after $((SECONDS - start)) s"
# Bytecode written and read under a prefix of its own: the image's
# PYTHONDONTWRITEBYTECODE=1 would otherwise leave the prefix empty.
unset PYTHONDONTWRITEBYTECODE
export PYTHONPYCACHEPREFIX=$work/pyc
start=$SECONDS
timeout 200 python3 benchmarks/startup_diag.py warm "$recipe" --backend inductor \
  --cache-dir "$cache" --runs $((runs + 1)) >"$out/warm-pyc.jsonl" 2>"$out/warm-pyc.log"
step "warm pyc exit $? after $((SECONDS - start)) s"
start=$SECONDS
timeout 120 python3 benchmarks/startup_diag.py profile "$recipe" --backend inductor \
  --cache-dir "$cache" --out "$out/profile-pyc.txt" >"$out/profile-pyc.json" \
  2>"$out/profile-pyc.log"
step "profile pyc exit $? after $((SECONDS - start)) s: $(head -1 "$out/profile-pyc.txt" 2>/dev/null)"
exit 0
