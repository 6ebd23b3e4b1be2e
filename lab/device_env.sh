# Sourced by the lab/gpu_*.sh device scripts: unpacks vLLM (carried by ../shared/tools/device-vllm/prepare.sh
# into .devcarry/; call 1 copies core.part-aa to /tmp, the next call carries .devcarry/vllm-extra), sets the
# environment, records the machine in $OUT/env.txt and writes the shared synthetic full checkpoint ($MODEL).
# Returns 3 when the machine was replaced (repeat call 1), 4 when unpacking failed.
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
T0=$(date +%s)
test -f /tmp/core.part-aa || { echo "vllm core part missing: repeat call 1"; return 3; }
if [ ! -d /tmp/site/vllm ]; then
  mkdir -p /tmp/site
  cat /tmp/core.part-aa .devcarry/vllm-extra/core.part-a[b-z] | tar xJ -C /tmp/site || return 4
  for f in .devcarry/vllm-extra/*.tar.xz; do tar xJf "$f" -C /tmp/site || return 4; done
fi
export PYTHONPATH=/tmp/site:$PWD VLLM_USE_FLASHINFER_SAMPLER=0 PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
echo "unpacked in $(( $(date +%s) - T0 )) s"
{
  nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version,clocks.sm,clocks.max.sm --format=csv
  python3 -c "import torch, vllm, transformers, torchaudio; print('torch', torch.__version__, 'vllm', vllm.__version__, 'transformers', transformers.__version__, 'torchaudio', torchaudio.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name())"
  python3 -c "import spark_tts_lib, einx, omegaconf, soundfile, soxr; print('spark_tts_lib ok')"
  nproc; free -g | head -2
} 2>&1 | tee "$OUT/env.txt"
MODEL=${TMPDIR:-/tmp}/voiceapp-gpu-model
write_model() {
  [ -f "$MODEL/config.yaml" ] || python3 -c "import sys; from engine.synthetic import write_checkpoint; write_checkpoint(sys.argv[1], size='full', seed=0)" "$MODEL"
}
