#!/usr/bin/env bash
# Device call: where first audio goes under open-loop load (lab/load_phases.py) on the synthetic full Spark
# checkpoint, the engine a tuned `voicectl serve` runs, in process. RATES (default 10,20), SECONDS_PER_RATE
# (default 20), SEEDS (default 0,1), VARIANTS (lab/load_phases.py VARIANTS, default base); NO_TUNE=1 for the one
# listener's engine as it starts. PROFILE=1: py-spy (a wheel in .whl2) records the loaded process twice for
# PROFILE_S seconds (default 15), the threads holding the interpreter, then every busy thread -> $OUT/prof_gil.txt,
# $OUT/prof_busy.txt (collapsed stacks, thread ids).
#   run (carry [".devcarry/vllm-extra/deps.tar.xz", ".whl2"]): bash lab/gpu_load_phases.sh
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
[ -d /tmp/site/yaml ] || { mkdir -p /tmp/site && tar xJf .devcarry/vllm-extra/deps.tar.xz -C /tmp/site; } || exit 4
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
MODEL=${MODEL:-/tmp/voiceapp-gpu-model}
[ -f "$MODEL/config.yaml" ] || python3 -c "import sys; from engine.synthetic import write_checkpoint; write_checkpoint(sys.argv[1], size='full', seed=0)" "$MODEL"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/env.txt"
READY=/tmp/load-phases-ready.$$; rm -f "$READY"
python3 -m lab.load_phases --model "$MODEL" --rates "${RATES:-10,20}" --seconds "${SECONDS_PER_RATE:-20}" \
    --seeds "${SEEDS:-0,1}" --variants "${VARIANTS:-base}" ${NO_TUNE:+--no-tune} --ready-file "$READY" \
    --json "$OUT/load_phases${NO_TUNE:+_notune}.json" > "$OUT/load_phases.log" 2>&1 &
PID=$!
if [ -n "${PROFILE:-}" ]; then
  pip install -q --no-deps --target /tmp/spy .whl2/py_spy-*.whl >/dev/null 2>&1
  while kill -0 $PID 2>/dev/null && [ ! -f "$READY" ]; do sleep 0.2; done
  sleep 1.5
  /tmp/spy/bin/py-spy record --pid $PID --duration "${PROFILE_S:-15}" --rate 250 --gil --threads --nonblocking \
      --format raw --output "$OUT/prof_gil.txt" > "$OUT/prof_gil.log" 2>&1
  /tmp/spy/bin/py-spy record --pid $PID --duration "${PROFILE_S:-15}" --rate 250 --threads --nonblocking \
      --format raw --output "$OUT/prof_busy.txt" > "$OUT/prof_busy.log" 2>&1
  tail -2 "$OUT/prof_gil.log" "$OUT/prof_busy.log"
fi
wait $PID; echo "rc=$?"
grep -v "^   tail" "$OUT/load_phases.log" | tail -20
