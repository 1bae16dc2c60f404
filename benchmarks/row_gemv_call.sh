#!/usr/bin/env bash
# acache's row GEMV on one GPU, in one call (issue 32): the CUDA tests, the kernels
# against Inductor's and cuBLAS's (benchmarks/row_gemv.py, under a time limit), the
# decode A/B of the recipes given (each built with the row GEMV, its default, and
# without), and a tiny model's agreement with eager through it (ROW_EVIDENCE=0: not).
#
#   benchmarks/row_gemv_call.sh OUT CACHE_DIR RECIPE...
#
# ROW_KERNEL_ARGS (default "--sweep --quant"): row_gemv.py's options; ROW_KERNEL_S
# (default 200): its time limit, 0 to skip them; ROW_VARIANTS (default "aoti aoti+row_gemv=0"): the
# variants measured per recipe; ROW_EVIDENCE_BACKENDS (default "eager,aoti"): the backends
# of the tiny model's agreement check. OUT gets tests.log, decode/ (decode_call.sh's),
# evidence/ (backend_evidence.py's) and kernels/ (row_gemv.json, kernels.log).
set -uo pipefail
if [ $# -lt 2 ]; then
  echo "usage: $0 OUT CACHE_DIR RECIPE..." >&2
  exit 2
fi
out=$(realpath -m "$1"); cache=$(realpath -m "$2"); shift 2
cd "$(dirname "$0")/.."
mkdir -p "$out"
status=0
start=$SECONDS
# The CUDA tests only: the interpreter cases run in CI (torch 2.11's wrap_triton refuses
# the interpreter's kernels), and test_models_quant.py's compiled cases take minutes.
python3 -m pytest -q -p no:cacheprovider tests/test_models_gemv.py -k "cuda or fresh" \
  >"$out/tests.log" 2>&1 || status=1
tail -1 "$out/tests.log"
read -ra kernel_args <<<"${ROW_KERNEL_ARGS:---sweep --quant}"
if [ "${ROW_KERNEL_S:-200}" != 0 ]; then  # timeout 0 would mean no limit
  timeout "${ROW_KERNEL_S:-200}" python3 benchmarks/row_gemv.py --out "$out/kernels" \
    "${kernel_args[@]}" >"$out/kernels.log" 2>&1 || status=1
  echo "kernels done after $((SECONDS - start)) s"
fi
if [ $# -gt 0 ]; then
  read -ra variants <<<"${ROW_VARIANTS:-aoti aoti+row_gemv=0}"
  specs=()
  for recipe in "$@"; do for v in "${variants[@]}"; do specs+=("$recipe/$v"); done; done
  bash benchmarks/decode_call.sh "$out/decode" "$cache" "${specs[@]}" || status=1
  echo "decode done after $((SECONDS - start)) s"
fi
if [ -n "${ROW_EVIDENCE:-1}" ] && [ "${ROW_EVIDENCE:-1}" != 0 ]; then
  python3 benchmarks/backend_evidence.py tiny-llama --device cuda --dtype bf16 \
    --backends "${ROW_EVIDENCE_BACKENDS:-eager,aoti}" --out "$out/evidence" >"$out/evidence.log" 2>&1 || status=1
  tail -5 "$out/evidence.log"
  echo "evidence done after $((SECONDS - start)) s"
fi
exit $status
