#!/usr/bin/env bash
# Spark before and after the model-family seam on one warm GPU machine: the warm bench at 1 and 32 streams with
# the tree under test (PART new) or the tree before the seam (PART old: `git archive 69bb990 engine voiceapp
# assets` unpacked into .devcarry/base and carried), on one synthetic full checkpoint. Calls, back to back:
#   carry [".devcarry/vllm-core"], command: cp .devcarry/vllm-core/core.part-aa /tmp/   (if the machine is fresh)
#   carry [".devcarry/vllm-extra", ".devcarry/base"], command: bash lab/gpu_spark_ab.sh old
#   carry [".devcarry/vllm-extra"], command: bash lab/gpu_spark_ab.sh new
set -u
PART=${1:?old or new}
source lab/device_env.sh || exit $?
write_model
[ "$PART" = old ] && export PYTHONPATH=/tmp/site:$PWD/.devcarry/base
BENCH="python3 -m lab.bench"
[ "$PART" = old ] && BENCH="python3 -m voiceapp.cli bench"  # the base tree predates lab/: its bench had these flags
cd /tmp  # the tree under test comes from PYTHONPATH alone
# shellcheck disable=SC2086
timeout "${BENCH_TIMEOUT:-420}" $BENCH --model "$MODEL" --no-reference --no-variants \
    --no-decoder-checks --levels 1,32 --rounds-1 5 --export-sentences 0 --decoder-autotune none \
    --json "$OUT/spark_$PART.json" 2>&1 | grep -v EngineCore | tail -12
echo "done at $(( $(date +%s) - T0 )) s"
