#!/usr/bin/env bash
# Cold / warm / eager and steady state for every CPU-capable backend on tiny-llama,
# on this repository's CPU machine (2 cores, no GPU). Backs the CPU figures quoted in
# docs/backends.md. Usage: bash benchmarks/cpu_tiny_compare.sh [OUTDIR]
set -eu
cd "$(dirname "$0")/.."
out=${1:-benchmarks/results/cpu-tiny}
python3 -m artifactcache.cli compare --recipes tiny-llama --backends eager,inductor,aoti,ort \
  --device cpu --dtype fp32 --runs 1 --new-tokens 16 --out "$out"
