#!/usr/bin/env bash
# A/B on one machine (machine-to-machine spread was ~15-20% per LLM step between runs, docs/lab/run-log.md):
# the streaming bench with every decoder graph autotuned (--decoder-autotune all) and then with only batch-1
# graphs autotuned (what in-process front ends use), plus the busy-window variants at 128 streams. Device call 2 of the usual two
# (call 1: cp .devcarry/vllm-core/core.part-aa /tmp/), carrying .devcarry/vllm-extra. Results under $OUT.
set -u
source lab/device_env.sh || exit $?
common="--synthetic full --backend vllm --no-decoder-checks --no-reference --export-sentences 0
        --levels 1,8,32,64,128"
for policy in all batch1; do
  extra="--no-variants"
  [ "$policy" = batch1 ] && extra="--variants ${GPU_AB_VARIANTS:-busy8_24,busy16_16,busy24_24}"
  # shellcheck disable=SC2086
  timeout "${GPU_AB_TIMEOUT:-270}" python3 -m lab.bench $common --decoder-autotune $policy $extra \
      --json "$OUT/ab_$policy.json" > "$OUT/ab_$policy.log" 2>&1
  echo "$policy rc=$? at $(( $(date +%s) - T0 )) s"
  grep -E "streams:|\[engine\] (decoder|vLLM ready)" "$OUT/ab_$policy.log"
done
