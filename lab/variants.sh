# Sourced by device scripts (lab/gpu_crowd_variants.sh, lab/gpu_load.sh): patches the device's copy of the tree for
# one engine variant (never committed; `variant_restore` puts the files back).
#   dec_hi    the decoder's CUDA stream above the lane's priority
#   first32   busy schedule: first window 32 codes, second 48 (a longer first chunk covers the second's wait)
#   both      dec_hi and first32
#   fp32      Spark's streaming decoder in fp32 (the default before run 39: fp16)
#   b8        the lane reads back every 2 steps up to 8 busy rows only (before run 39: up to 32)
#   noreach   the decoder's cost model extrapolates to any batch (BatchCost.reach before run 39)
#   busy32    busy schedule: second window 32 codes (the default before run 40: 24)
#   second8   the second window 8 codes (today 12): first sound sooner for a lone listener (speechd, issue 37), at
#             10 standard window lengths instead of 5 (start-up's and tuning's graphs)
VARIANT_FILES="engine/backends/qwen2_static.py engine/backends/bicodec.py engine/windowing.py engine/families/spark.py engine/lane_scheduler.py engine/deadlines.py engine/tuning.py"
mkdir -p /tmp/variant-orig && for f in $VARIANT_FILES; do cp "$f" /tmp/variant-orig/"$(basename "$f")"; done
variant_patch() {
  case "$1" in
    base) ;;
    dec_hi) sed -i 's/torch.cuda.Stream(self.device) if cuda else None/torch.cuda.Stream(self.device, priority=-2) if cuda else None/' engine/backends/bicodec.py ;;
    first32) sed -i 's/^    busy_first_new: int = 16/    busy_first_new: int = 32/; s/^    busy_new: int = 32/    busy_new: int = 48/' engine/windowing.py ;;
    both) variant_patch dec_hi; variant_patch first32 ;;
    fp32) sed -i 's/^    gpu_decoder_dtype = "fp16"/    gpu_decoder_dtype = "fp32"/' engine/families/spark.py ;;
    b8) sed -i 's/^CROWD_BURSTS = ((32, BURST), (None, 8))/CROWD_BURSTS = ((8, BURST), (None, 8))/' engine/lane_scheduler.py ;;
    noreach) sed -i 's/^    reach: int = 4$/    reach: int = 1 << 30/' engine/deadlines.py ;;
    busy32) sed -i 's/^    busy_new: int = 24/    busy_new: int = 32/' engine/windowing.py ;;
    second8) sed -i 's/^    new: int = 12$/    new: int = 8/' engine/windowing.py ;;
    *) echo "unknown variant $1"; return 1 ;;
  esac
  for f in $VARIANT_FILES; do cmp -s "$f" /tmp/variant-orig/"$(basename "$f")" || echo "variant $1: $f patched"; done
}
variant_restore() {
  for f in $VARIANT_FILES; do cp /tmp/variant-orig/"$(basename "$f")" "$f"; done
}
