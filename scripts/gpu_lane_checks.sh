#!/usr/bin/env bash
# One device call: the graph lane's step profile (scripts/lane_profile.py, compiled and plain graphs; skip with
# LANE_SKIP_PROFILE=1) and `voicectl say --backend torch` with and without the lane (the lane in front of the
# torch generator: a GPU without vLLM). Results under $OUT. `say` writes a WAV, so it needs soundfile: run it after
# scripts/device_env.sh has unpacked the carried packages into /tmp/site (any call after gpu_bench.sh's first).
#   run: bash scripts/gpu_lane_checks.sh
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
[ -d /tmp/site ] && export PYTHONPATH=/tmp/site:$PWD
T0=$(date +%s)
MODEL=${TMPDIR:-/tmp}/voiceapp-gpu-model
[ -f "$MODEL/config.yaml" ] || python3 -c "import sys; from engine.synthetic import write_checkpoint; write_checkpoint(sys.argv[1], size='full', seed=0)" "$MODEL"
if [ "${LANE_SKIP_PROFILE:-0}" != 1 ]; then
  for flag in "" "--no-compile"; do
    timeout 200 python3 scripts/lane_profile.py "$MODEL" $flag --json "$OUT/lane_profile${flag}.json" 2>&1 \
        | grep -v "Loading weights" | head -30
  done
  echo "profiles done at $(( $(date +%s) - T0 )) s"
fi
TEXT="Hello there, this is a quick test of the first audio."
for flag in "" "--no-graph-lane"; do
  timeout 240 python3 -m voiceapp.cli say "$TEXT" --backend torch --model "$MODEL" --seed 1 --json --no-server \
      --out /tmp/lane-check.wav $flag > "$OUT/say_torch${flag}.json" 2> "$OUT/say_torch${flag}.log"
  echo "say --backend torch $flag: rc=$? $(cut -c1-300 "$OUT/say_torch${flag}.json")"
  grep -i "lane\|error" "$OUT/say_torch${flag}.log" | head -3
done
echo "done at $(( $(date +%s) - T0 )) s"
