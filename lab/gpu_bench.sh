#!/usr/bin/env bash
# Device calls that produced docs/lab/run-log.md (vLLM carried by ../shared/tools/device-vllm/prepare.sh, packed with
# the reference pipeline's and the GPU tests' packages the image lacks:
#   bash ../shared/tools/device-vllm/prepare.sh spark-tts-lib einx omegaconf antlr4-python3-runtime frozendict \
#       soundfile cffi pycparser soxr retrying pytest-asyncio
# ):
#   call 1: carry [".devcarry/vllm-core"],  command: cp .devcarry/vllm-core/core.part-aa /tmp/ &&
#           python3 -m lab.bench --synthetic full --decoder-only --json $OUT/decoder.json
#           (decoder fp32/bf16 error, seams, eager vs graph speed: needs no vLLM)
#   call 2: carry [".devcarry/vllm-extra"], command: bash lab/gpu_bench.sh --no-decoder-checks
# Call 2 unpacks vLLM, runs `python -m lab.bench` on a synthetic full checkpoint (pipeline at 1..128 streams, export,
# reference), then the GPU tests and (GPU_PROBE=1) the vLLM-only TTFT probe on one shared synthetic checkpoint.
# Env: GPU_BENCH_TIMEOUT (s, default 330), GPU_TEST_TIMEOUT (s, default 150), GPU_TEST_K (pytest -k), GPU_SKIP_TESTS=1,
# GPU_SKIP_BENCH=1, GPU_PROBE=1. Everything worth keeping goes to $OUT. Exit 3: the machine was replaced, repeat call 1.
set -u
source lab/device_env.sh || exit $?
t0=$T0
if [ "${GPU_SKIP_BENCH:-0}" != 1 ]; then
  set -o pipefail
  timeout "${GPU_BENCH_TIMEOUT:-330}" python3 -m lab.bench --synthetic full --backend vllm \
      --json "$OUT/latest.json" "$@" 2>&1 | tee "$OUT/bench.log"
  echo "bench rc=$? at $(( $(date +%s) - t0 )) s"
  set +o pipefail
fi
if [ "${GPU_SKIP_TESTS:-0}" != 1 ] || [ "${GPU_PROBE:-0}" = 1 ]; then
  write_model
  export VOICEAPP_GPU_MODEL=$MODEL
fi
if [ "${GPU_SKIP_TESTS:-0}" != 1 ]; then
  timeout "${GPU_TEST_TIMEOUT:-150}" python3 -m pytest -q -m gpu tests/gpu -p no:cacheprovider -s -rA \
      --timeout 140 ${GPU_TEST_K:+-k "$GPU_TEST_K"} 2>&1 | grep -v EngineCore > "$OUT/gpu_tests.log"
  grep -E "passed|failed|FAILED|streamed vs|^E " "$OUT/gpu_tests.log" | tail -20
  echo "tests done at $(( $(date +%s) - t0 )) s"
fi
