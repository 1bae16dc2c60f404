#!/usr/bin/env bash
# `acache doctor` wall time in fresh processes (issue 31's "doctor < 3 s"): twice with no
# cache (the quick checks), then against CACHE_DIR, a cache a build created: quick, --full
# (the full checks, kept there) and once more (read back from the memo). Each report is
# kept as OUT/doctor-NAME.json, the times in OUT/doctor.time.
#
#   benchmarks/doctor_timing.sh OUT CACHE_DIR
set -uo pipefail
if [ $# -ne 2 ]; then
  echo "usage: $0 OUT CACHE_DIR" >&2
  exit 2
fi
out=$(realpath -m "$1"); cache=$(realpath -m "$2")
cd "$(dirname "$0")/.."
mkdir -p "$out"
doctor() {  # NAME ARGS...
  local name=$1; shift
  /usr/bin/time -f "$name %e s" python3 -m artifactcache.cli doctor --json "$@" \
    >"$out/doctor-$name.json" 2>>"$out/doctor.time"
}
doctor quick-1 --cache-dir "$out/no-cache-here"
doctor quick-2 --cache-dir "$out/no-cache-here"
doctor quick-cache --cache-dir "$cache"
doctor full --full --cache-dir "$cache"
doctor memo --cache-dir "$cache"
cat "$out/doctor.time"
