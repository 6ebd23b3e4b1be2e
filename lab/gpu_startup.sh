#!/usr/bin/env bash
# Device call: where a fresh engine's start-up goes on the GPU (no vLLM needed). Results under $OUT.
#   run (carry [".devcarry/vllm-extra"]): bash lab/gpu_startup.sh
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
T0=$(date +%s)
if [ ! -d /tmp/site/pytest_asyncio ]; then
  mkdir -p /tmp/site && tar xJf .devcarry/vllm-extra/deps.tar.xz -C /tmp/site || exit 4
fi
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/env.txt"
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)" | tee -a "$OUT/env.txt"
MODEL=${TMPDIR:-/tmp}/voiceapp-gpu-model
[ -f "$MODEL/config.yaml" ] || python3 -c "import sys; from engine.synthetic import write_checkpoint; write_checkpoint(sys.argv[1], size='full', seed=0)" "$MODEL"
echo "model at $(( $(date +%s) - T0 )) s"
for what in "import torch" "import torch; torch.zeros(1, device='cuda')" "import transformers; from transformers import AutoModelForCausalLM, AutoTokenizer"; do
  s=$(date +%s.%N); python3 -c "$what"; echo "$what: $(echo "$(date +%s.%N) - $s" | bc) s" | tee -a "$OUT/imports.txt"
done
for v in ${STARTUP_VARIANTS:-say say say autotune_none eager_decoder no_lane eager_all}; do
  timeout 200 python3 lab/startup_probe.py "$v" "$MODEL" 2>>"$OUT/probe.err" | tee -a "$OUT/probe.jsonl"
  echo "$v at $(( $(date +%s) - T0 )) s"
done
echo "done at $(( $(date +%s) - T0 )) s"
