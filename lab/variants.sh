# Sourced by device scripts (lab/gpu_crowd_variants.sh, lab/gpu_load.sh): patches the device's copy of the tree for
# one engine variant (never committed; `variant_restore` puts the files back).
#   dec_hi    the decoder's CUDA stream above the lane's priority
#   first32   busy schedule: first window 32 codes, second 48 (a longer first chunk covers the second's wait)
#   both      dec_hi and first32
#   new16     busy schedule: second window 16 codes like the first (windows 16, 16, 32, 64, 96)
#   g15       windows grow by 1.5 (busy: 16, 32, 48, 72, 96)
#   dec16     the decoder in fp16 on the GPU (GPU_DECODER_DTYPE)
#   dec16b32  dec16 and burst32
#   burst32   the lane reads back every 2 steps up to 32 busy rows (not 8): a newcomer's prefill waits for fewer
#             steps already queued, at more read-backs
VARIANT_FILES="engine/backends/bicodec.py engine/windowing.py engine/factory.py engine/lane_scheduler.py"
mkdir -p /tmp/variant-orig && for f in $VARIANT_FILES; do cp "$f" /tmp/variant-orig/"$(basename "$f")"; done
variant_patch() {
  case "$1" in
    base) ;;
    dec_hi) sed -i 's/torch.cuda.Stream(self.device) if cuda else None/torch.cuda.Stream(self.device, priority=-2) if cuda else None/' engine/backends/bicodec.py ;;
    first32) sed -i 's/^    busy_first_new: int = 16/    busy_first_new: int = 32/; s/^    busy_new: int = 32/    busy_new: int = 48/' engine/windowing.py ;;
    both) variant_patch dec_hi; variant_patch first32 ;;
    dec16b32) variant_patch dec16; variant_patch burst32 ;;
    new16) sed -i 's/^    busy_new: int = 32/    busy_new: int = 16/' engine/windowing.py ;;
    g15) sed -i 's/^    growth: float = 2.0/    growth: float = 1.5/' engine/windowing.py ;;
    dec16) sed -i 's/^GPU_DECODER_DTYPE = "fp32"/GPU_DECODER_DTYPE = "fp16"/' engine/factory.py ;;
    burst32) sed -i 's/^CROWD_BURSTS = ((8, BURST), (None, 8))/CROWD_BURSTS = ((32, BURST), (None, 8))/' engine/lane_scheduler.py ;;
    *) echo "unknown variant $1"; return 1 ;;
  esac
  for f in $VARIANT_FILES; do cmp -s "$f" /tmp/variant-orig/"$(basename "$f")" || echo "variant $1: $f patched"; done
}
variant_restore() {
  for f in $VARIANT_FILES; do cp /tmp/variant-orig/"$(basename "$f")" "$f"; done
}
