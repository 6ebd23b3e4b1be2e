#!/usr/bin/env bash
# Device call: export determinism and speed on the GPU (no vLLM needed). Results under $OUT.
#   run (carry [".devcarry/vllm-extra"]): bash lab/gpu_export_check.sh
# The carried packages are unpacked fresh on each machine: they are byte-compiled first, as an installed package
# is, so that the measured processes do not compile Python sources at start-up.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
if [ ! -d /tmp/site/yaml ]; then
  mkdir -p /tmp/site && tar xJf .devcarry/vllm-extra/deps.tar.xz -C /tmp/site || exit 4
fi
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
python3 -m compileall -q /tmp/site engine voiceapp lab >/dev/null 2>&1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/env.txt"
MODEL=${TMPDIR:-/tmp}/voiceapp-gpu-model
[ -f "$MODEL/config.yaml" ] || python3 -c "import sys; from engine.synthetic import write_checkpoint; write_checkpoint(sys.argv[1], size='full', seed=0)" "$MODEL"
timeout 420 python3 -m lab.export_check --model "$MODEL" --json "$OUT/export.json" --timeout 240 2>&1 | tail -8
timeout 150 python3 -m lab.startup --cases export --repeats 2 --model "$MODEL" --json "$OUT/startup-export.json" 2>&1 | tail -6
