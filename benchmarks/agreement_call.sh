#!/bin/bash
# One GPU call for issue 32's agreement figures: each seed model's int8wo and int4wo
# against the same model unquantized, by benchmarks/quant_agreement.py (max relative
# logits error over the prompt and 205 teacher-forced positions, top-1 agreement there,
# the first differing greedy token of 200), random weights, eager bf16 on CUDA.
#   bash benchmarks/agreement_call.sh NAME   (carry [".whl"])
# RECIPES and QUANTS narrow the loops; AGREE_ARGS replaces the backend, device and dtype
# (a CPU check: AGREE_ARGS="--device cpu --dtype fp32" RECIPES=tiny-llama QUANTS=int8wo).
# Results in /tmp/NAME (RECIPE-QUANT.json and .log), tarred into $OUT/NAME.tgz; every step
# ends within DEADLINE_S (default 570), so the tar always runs.
. benchmarks/_device_call.sh
start_call "${1:?usage: agreement_call.sh NAME}"
read -ra how <<<"${AGREE_ARGS:---backend eager --device cuda --dtype bf16}"
for recipe in ${RECIPES:-llama-7b phi-3-mini phi-2 mistral-7b llama-3-8b}; do
  for quant in ${QUANTS:-int8wo int4wo}; do
    timeout "$(cap 150)" python3 benchmarks/quant_agreement.py "$recipe" "${how[@]}" \
      --quant "$quant" --cache-dir "$C" --out "$R/$recipe-$quant.json" > "$R/$recipe-$quant.log" 2>&1
    echo "$recipe $quant rc=$? at $((SECONDS - T0)) s: $(tail -n 1 "$R/$recipe-$quant.log")"
  done
done
finish_call
