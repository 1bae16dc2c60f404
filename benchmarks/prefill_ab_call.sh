#!/usr/bin/env bash
# Issue 30's same-run A/B on one GPU, in one call: llama-7b as built now (prompt-sized
# prefill passes) against the same model with the 16-token passes it had before
# (benchmarks/recipes/llama-7b-p16.toml), each built alone with empty caches and benched
# (benchmarks/coldbuild.py --against: build wall time, decode tok/s, TTFT by prompt
# length); then the new entry's logits and greedy tokens against eager's
# (benchmarks/backend_evidence.py, which finds the aoti entry in the same cache).
#
#   benchmarks/prefill_ab_call.sh OUT WORK_DIR
#
# AB_PROMPT_LENS (default 16,64,128,240: the recipes' context is 256): bench's
# --prompt-len. AB_EVIDENCE=0 skips the agreement check. OUT gets coldbuild/ and evidence/.
set -uo pipefail
if [ $# -ne 2 ]; then
  echo "usage: $0 OUT WORK_DIR" >&2
  exit 2
fi
out=$(realpath -m "$1"); work=$(realpath -m "$2")
cd "$(dirname "$0")/.."
mkdir -p "$out"
status=0
start=$SECONDS
python3 benchmarks/coldbuild.py --out "$out/coldbuild" --work-dir "$work" \
  --against benchmarks/recipes/llama-7b-p16.toml --prompt-lens "${AB_PROMPT_LENS:-16,64,128,240}" \
  >"$out/coldbuild.log" 2>&1 || status=1
grep -E "^(build|bench)-" "$out/coldbuild.log"
echo "A/B done after $((SECONDS - start)) s"
if [ "${AB_EVIDENCE:-1}" != 0 ]; then
  python3 benchmarks/backend_evidence.py llama-7b --device cuda --dtype bf16 --backends eager,aoti \
    --cache-dir "$work/a/acache" --out "$out/evidence" >"$out/evidence.log" 2>&1 || status=1
  tail -4 "$out/evidence.log"
  echo "evidence done after $((SECONDS - start)) s"
fi
exit $status
