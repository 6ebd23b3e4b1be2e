#!/usr/bin/env bash
# Device call: what holds 384 streams started at once (issue 42) now that the 512-row lane carries a crowd in this
# process (run 37: steady RTF 0.53, yet 336 of 384 streams underran after their first chunk). Each variant patches the
# device's copy of the tree (never committed), runs `voicectl bench --backend torch --levels "${LEVELS:-1,384}"` (the lane alone,
# no vLLM) and restores the tree:
#   base      as committed
#   dec_hi    the decoder's CUDA stream above the lane's priority (in one process, unlike run 37's vLLM overflow)
#   first32   busy schedule: first window 32 codes, second 48 (a longer first chunk covers the second's wait)
#   both      dec_hi and first32
#   new16     busy schedule: second window 16 codes like the first (windows 16, 16, 32, 64, 96): each window's
#             audio outlasts the next one's generation down to ~1.9x real time per stream
#   g15       busy schedule: windows grow by 1.5 (16, 32, 48, 72, 96)
#   dec16     the decoder in fp16 on the GPU (GPU_DECODER_DTYPE): ~2x a call's throughput if it runs at bf16's speed
#   run (carry [".devcarry/vllm-extra/deps.tar.xz"]): bash lab/gpu_crowd_variants.sh [VARIANTS...]
# Writes $OUT/bench-VARIANT.json and .log. A fresh machine spends ~100 s capturing the decoder's graphs and ~110 s the
# lane's in the first variant (later ones reuse the compile caches): give it the whole 600 s, two variants a call.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
if [ ! -d /tmp/site/yaml ]; then
  mkdir -p /tmp/site && tar xJf .devcarry/vllm-extra/deps.tar.xz -C /tmp/site || exit 4
fi
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
MODEL=${TMPDIR:-/tmp}/voiceapp-gpu-model
[ -f "$MODEL/config.yaml" ] || python3 -c "import sys; from engine.synthetic import write_checkpoint; write_checkpoint(sys.argv[1], size='full', seed=0)" "$MODEL"
patch_variant() {
  case "$1" in
    base) ;;
    dec_hi) sed -i 's/torch.cuda.Stream(self.device) if cuda else None/torch.cuda.Stream(self.device, priority=-2) if cuda else None/' engine/backends/bicodec.py ;;
    first32) sed -i 's/^    busy_first_new: int = 16/    busy_first_new: int = 32/; s/^    busy_new: int = 32/    busy_new: int = 48/' engine/windowing.py ;;
    both) patch_variant dec_hi; patch_variant first32 ;;
    new16) sed -i 's/^    busy_new: int = 32/    busy_new: int = 16/' engine/windowing.py ;;
    dec16) sed -i 's/^GPU_DECODER_DTYPE = "fp32"/GPU_DECODER_DTYPE = "fp16"/' engine/factory.py ;;
    g15) sed -i 's/^    growth: float = 2.0/    growth: float = 1.5/' engine/windowing.py ;;
    *) echo "unknown variant $1"; return 1 ;;
  esac
}
[ $# -gt 0 ] || set -- base dec_hi
mkdir -p /tmp/variant-orig && cp engine/backends/bicodec.py engine/windowing.py engine/factory.py /tmp/variant-orig/
for v in "$@"; do
  patch_variant "$v" || continue
  diff -q /tmp/variant-orig/bicodec.py engine/backends/bicodec.py; diff -q /tmp/variant-orig/windowing.py engine/windowing.py
  timeout "${VARIANT_TIMEOUT:-300}" python3 -m voiceapp.cmd_bench --model "$MODEL" --backend torch --levels "${LEVELS:-1,384}" \
      --json "$OUT/bench-$v.json" > "$OUT/bench-$v.log" 2>&1
  echo "$v rc=$?"; grep -E "^\| (1|384) " "$OUT/bench-$v.log"
  cp /tmp/variant-orig/bicodec.py engine/backends/; cp /tmp/variant-orig/windowing.py engine/; cp /tmp/variant-orig/factory.py engine/
done
