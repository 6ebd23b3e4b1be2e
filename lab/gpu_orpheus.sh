#!/usr/bin/env bash
# Device calls that produced docs/benchmarks/orpheus.json: Orpheus on one GPU with the synthetic full checkpoint
# (the real 3B shapes, random weights). vLLM and the packages the image lacks are carried by
#   bash ../shared/tools/device-vllm/prepare.sh soundfile cffi pycparser soxr snac tomli_w
# and the snac wheel travels in .whl (carry it too). One PART per call, back to back on one warm machine:
#   call 1: carry [".devcarry/vllm-core"], command: cp .devcarry/vllm-core/core.part-aa /tmp/ && bash lab/gpu_orpheus.sh decoder
#   call 2: carry [".devcarry/vllm-extra"], command: bash lab/gpu_orpheus.sh bench
#   call 3: bash lab/gpu_orpheus.sh fresh
# crowd (ONE call on a fresh machine, no vLLM: carry [".devcarry/vllm-extra/deps.tar.xz"], whose packages include
#   snac): bash lab/gpu_orpheus.sh crowd
#   the crowd lane alone (`--backend torch`, sized by the family: ModelFamily.lane) at LEVELS (1,32,128,216,256);
#   while the checkpoint is written on the CPU, lab/gpu_lane3b.py's crowd part (torch's total memory, the lane's rows,
#   its step per row bucket and span) and penalty part (timeboxed) on the GPU. All within CROWD_S (470) seconds.
#   BENCH_ARGS go to lab.bench as they are (e.g. "--decoder-dtype fp16"); VARIANTS names lab.bench's variants to run
#   after the levels (e.g. orpheus_again,orpheus_busy_growth_1_15), none without it.
# ckpt: only the synthetic checkpoint (call 1 of a run without the decoder probe).
# decoder: our SNAC against the snac package, the pipeline's seams, time per window (lab/orpheus_snac_gpu.py);
# bench: `python -m lab.bench` at 1..256 streams all at once; fresh: an export and a `say` through a warm server, each a
# fresh process from launch. Everything worth keeping goes to $OUT. Exit 3: the machine was replaced.
set -u
PART=${1:?ckpt, decoder, bench, fresh or crowd}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
ORPH=/tmp/voiceapp-orpheus-full
t0=$(date +%s)
if [ "$PART" = decoder ] || [ "$PART" = ckpt ]; then
  export PYTHONPATH=$PWD
  [ -f "$ORPH/config.json" ] || python3 -c "import sys; from engine.families.orpheus.synthetic import write_checkpoint; write_checkpoint(sys.argv[1], size='full', seed=0)" "$ORPH" || exit 5
  echo "checkpoint at $(( $(date +%s) - t0 )) s"
  [ "$PART" = ckpt ] && exit 0
  python3 -m pip install -q --no-deps --target /tmp/snac-site .whl/snac-*.whl && export PYTHONPATH=/tmp/snac-site:$PWD
  python3 lab/orpheus_snac_gpu.py "$ORPH" "$OUT/decoder.json" 2>&1 | tail -30
  echo "decoder done at $(( $(date +%s) - t0 )) s"
  exit 0
fi
write_ckpt() {
  [ -f "$ORPH/config.json" ] || python3 -c "import sys; from engine.families.orpheus.synthetic import write_checkpoint; write_checkpoint(sys.argv[1], size='full', seed=0)" "$ORPH"
}
if [ "$PART" = crowd ]; then
  left() { local s=$(( ${CROWD_S:-470} - ($(date +%s) - t0) )); echo $(( s > 60 ? s : 60 )); }
  if [ ! -d /tmp/site/snac ]; then
    mkdir -p /tmp/site && tar xJf .devcarry/vllm-extra/deps.tar.xz -C /tmp/site || exit 4
  fi
  export PYTHONPATH=/tmp/site:$PWD
  nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv > "$OUT/env.txt" 2>&1
  (write_ckpt > "$OUT/ckpt.log" 2>&1; echo "checkpoint rc=$? at $(( $(date +%s) - t0 )) s" >> "$OUT/ckpt.log") &
  ckpt=$!
  # the GPU is idle while the CPU writes the checkpoint: the probes' own random 3B needs none
  timeout "${PROBE_S:-120}" python3 lab/gpu_lane3b.py "$OUT/lane3b.json" --parts crowd,penalty 2>&1 \
      | grep -v Warning | tail -25
  echo "probes rc=$? at $(( $(date +%s) - t0 )) s"
  wait $ckpt; cat "$OUT/ckpt.log"
  set -o pipefail
  timeout "$(left)" python3 -m lab.bench --model "$ORPH" --backend torch --no-reference \
      $([ -n "${VARIANTS:-}" ] && echo --variants "$VARIANTS" || echo --no-variants) \
      --levels "${LEVELS:-1,32,128,216,256}" --tokens 413 --rounds-1 3 --export-sentences 0 ${BENCH_ARGS:-} \
      --json "$OUT/orpheus_crowd.json" 2>&1 | tee "$OUT/crowd.log" | tail -40
  echo "bench rc=$? at $(( $(date +%s) - t0 )) s"
  exit 0
fi
source lab/device_env.sh || exit $?
if [ "$PART" = bench ]; then
  set -o pipefail
  timeout "${BENCH_TIMEOUT:-540}" python3 -m lab.bench --model "$ORPH" --no-reference --no-variants \
      --levels "${LEVELS:-1,8,32,64,128,192,256}" --tokens 413 --rounds-1 3 --export-sentences 0 \
      --json "$OUT/orpheus_bench.json" 2>&1 | grep -v EngineCore | tee "$OUT/bench.log" | tail -60
  echo "bench rc=$? at $(( $(date +%s) - t0 )) s"
fi
if [ "$PART" = fresh ]; then
  timeout 280 python3 -m lab.bench --model "$ORPH" --no-reference --export-sentences "${EXPORT_SENTENCES:-60}" --levels 1 \
      --rounds-1 1 --no-variants --tokens 100 --json "$OUT/orpheus_export.json" 2>&1 | grep -v EngineCore | tail -15
  echo "export at $(( $(date +%s) - t0 )) s"
  timeout 240 python3 -m lab.startup --model "$ORPH" --cases say_autostart --repeats 3 \
      --json "$OUT/orpheus_startup.json" 2>&1 | grep -v EngineCore | tail -25
  echo "startup at $(( $(date +%s) - t0 )) s"
fi
