#!/usr/bin/env bash
# Device call: what holds 384 streams started at once (issue 42). Each variant (lab/variants.sh lists them) patches
# the device's copy of the tree (never committed), runs `voicectl bench --backend torch --levels "${LEVELS:-1,384}"`
# (the lane alone, no vLLM) and restores the tree.
#   run (carry [".devcarry/vllm-extra/deps.tar.xz"]): bash lab/gpu_crowd_variants.sh [VARIANTS...]
# Writes $OUT/bench-VARIANT.json and .log. A fresh machine spends ~130 s capturing the decoder's graphs and ~30 s the
# lane's in the first variant (later ones reuse the compile caches): VARIANT_TIMEOUT (default 300 s) each.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
if ! python3 -c "import yaml, soundfile" 2>/dev/null && [ ! -d /tmp/site/yaml ]; then
  mkdir -p /tmp/site && tar xJf .devcarry/vllm-extra/deps.tar.xz -C /tmp/site || exit 4
fi
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
MODEL=${MODEL:-${TMPDIR:-/tmp}/voiceapp-gpu-model}
[ -f "$MODEL/config.yaml" ] || python3 -c "import sys; from engine.synthetic import write_checkpoint; write_checkpoint(sys.argv[1], size='full', seed=0)" "$MODEL"
source lab/variants.sh
[ $# -gt 0 ] || set -- base noreach
for v in "$@"; do
  variant_patch "$v" || continue
  timeout "${VARIANT_TIMEOUT:-300}" python3 -m voiceapp.cmd_bench --model "$MODEL" --backend torch --levels "${LEVELS:-1,384}" \
      --json "$OUT/bench-$v.json" > "$OUT/bench-$v.log" 2>&1
  echo "$v rc=$?"; grep -E "^\| [0-9]+ " "$OUT/bench-$v.log"
  variant_restore
done
