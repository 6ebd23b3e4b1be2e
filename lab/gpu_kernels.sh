#!/usr/bin/env bash
# One device call for work on the fused decode step, without vLLM (no install call: ~3 minutes of device time):
# the GPU tests (vLLM's skip), a lane probe of the named plans, and `voicectl say` twice on the graph lane.
#   run (carry [".devcarry/vllm-extra"], packed by ../shared/tools/device-vllm/prepare.sh as in gpu_bench.sh):
#     bash lab/gpu_kernels.sh
# Only the carried pure-Python packages are unpacked (deps.tar.xz: pytest-asyncio for the async tests, soundfile for
# `say`'s WAV). Env: KERNELS_LANES (default "run28,attend_pre": lab/decode_kernels_probe.py --lanes names),
# KERNELS_ROWS (the probe's --rows, default 2), KERNELS_SKIP_TESTS=1, KERNELS_SKIP_SAY=1. Results under $OUT.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
T0=$(date +%s)
if [ ! -d /tmp/site/pytest_asyncio ]; then
  mkdir -p /tmp/site
  tar xJf .devcarry/vllm-extra/deps.tar.xz -C /tmp/site || { echo "carry .devcarry/vllm-extra"; exit 4; }
fi
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
if [ "${KERNELS_SKIP_TESTS:-0}" != 1 ]; then
  timeout 240 python3 -m pytest -q -m gpu tests/gpu/test_gpu.py -p no:cacheprovider --tb=short 2>&1 \
      > "$OUT/gpu_tests.log"
  grep -E "^E |passed|failed|FAILED" "$OUT/gpu_tests.log" | tail -15
  echo "tests done at $(( $(date +%s) - T0 )) s"
fi
(cd lab && timeout 300 python3 decode_kernels_probe.py --rows "${KERNELS_ROWS:-2}" \
    --lanes "${KERNELS_LANES:-run28,attend_pre}" --json "$OUT/lanes.json" 2>&1 | grep -E "^lane|rows [0-9]")
echo "lanes done at $(( $(date +%s) - T0 )) s"
if [ "${KERNELS_SKIP_SAY:-0}" != 1 ]; then
  MODEL=${TMPDIR:-/tmp}/voiceapp-gpu-model
  [ -f "$MODEL/config.yaml" ] || python3 -c "import sys; from engine.synthetic import write_checkpoint; write_checkpoint(sys.argv[1], size='full', seed=0)" "$MODEL"
  for i in 1 2; do
    timeout 120 python3 -m voiceapp.cli say "Hello there. This is a start-up test." --no-server --stats \
        --max-tokens 250 --model "$MODEL" --out "$OUT/say$i.wav" 2>&1 | grep -E "TTFA|error"
  done
fi
echo "done at $(( $(date +%s) - T0 )) s"
