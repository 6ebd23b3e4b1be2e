#!/usr/bin/env bash
# Device call 2 of 2 (call 1: carry [".devcarry/vllm-core"], `cp .devcarry/vllm-core/core.part-aa /tmp/`):
#   run (carry [".devcarry/vllm-extra"]): STARTUP_GROUPS="..." bash lab/gpu_startup_bench.sh
# `python -m lab.startup` on the synthetic full checkpoint, one group of cases per process (CASES:REPEATS:TIMEOUT)
# so that each group's JSON comes back even if a later one runs out of time.
set -u
source lab/device_env.sh || exit $?
write_model
echo "model ready at $(( $(date +%s) - T0 )) s"
if [ "${STARTUP_PREWARM:-1}" = 1 ]; then  # a bare machine has no compile caches: fill them once, untimed
  python3 -m voiceapp.cli say "Warming the caches." --no-server --out /tmp/prewarm.wav --model "$MODEL" 2>&1 | tail -1
  echo "caches warm at $(( $(date +%s) - T0 )) s"
fi
for spec in ${STARTUP_GROUPS:-say_inprocess_first_run,import_torch,say_inprocess:2:150 say_autostart:2:90 serve:1:330}; do
  IFS=: read -r group repeats limit <<< "$spec"
  name=${group%%,*}
  timeout "$limit" python3 -m lab.startup --model "$MODEL" --cases "$group" --repeats "$repeats" \
      --export-sentences 40 --timeout 300 --warm-json docs/benchmarks/latest.json --json "$OUT/startup-$name.json" \
      > "$OUT/startup-$name.log" 2>&1
  echo "$group: exit $? at $(( $(date +%s) - T0 )) s"; grep -vE "^startup bench" "$OUT/startup-$name.log" | tail -12
done
