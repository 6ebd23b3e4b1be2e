#!/usr/bin/env bash
# Device call: open-loop load over HTTP (issue 42) on the synthetic full Spark checkpoint, the engine as it ships
# (`--backend auto`: a crowd lane sized to the GPU and no vLLM behind it), so no vLLM carry is needed:
#   1. `voicectl serve --http`, and at once, while it tunes itself in the background, first audio at 1 client until
#      it is tuned, at most TUNING_1_S seconds (default 400; lab/http_latency.py) -> $OUT/tuning_1.json,
#      $OUT/tuning_status.json
#   2. once tuned (or LOAD_TUNE_WAIT s passed), `voicectl bench --load $LOAD_RATES --http` -> $OUT/load_http.json
#   3. lab/crowd_report.py -> $OUT/load.json (the keys of docs/benchmarks/load.json)
#   run (carry [".devcarry/vllm-extra/deps.tar.xz", ".devcarry/http"]): bash lab/gpu_load.sh
# VARIANT: an engine variant of lab/variants.sh served instead of the tree as committed (default base).
# CUDA_VISIBLE_DEVICES picks the GPU (another job may hold the other one); PORT, the server's (default 8000 + the GPU's
# index, so that a pair of these runs side by side). LOAD_RATES (default 10,20,40,80),
# LOAD_SECONDS (default 10 s per rate), LOAD_TUNE_WAIT (default 240 s: a fresh machine captures graphs for minutes).
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
T0=$(date +%s)
if ! python3 -c "import yaml, soundfile" 2>/dev/null && [ ! -d /tmp/site/yaml ]; then
  mkdir -p /tmp/site && tar xJf .devcarry/vllm-extra/deps.tar.xz -C /tmp/site || exit 4
fi
export PYTHONPATH=/tmp/site:$PWD:$PWD/.devcarry/http PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
export VOICEAPP_SOCKET=/tmp/load-$$.sock
GPU=${CUDA_VISIBLE_DEVICES:-0}; PORT=${PORT:-$((8000 + ${GPU%%,*}))}; URL=http://127.0.0.1:$PORT
MODEL=${MODEL:-${TMPDIR:-/tmp}/voiceapp-gpu-model}
[ -f "$MODEL/config.yaml" ] || python3 -c "import sys; from engine.synthetic import write_checkpoint; write_checkpoint(sys.argv[1], size='full', seed=0)" "$MODEL"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv -i "${CUDA_VISIBLE_DEVICES:-0}" > "$OUT/env.txt"
step() { echo "== $1 at $(( $(date +%s) - T0 )) s"; }
source lab/variants.sh
variant_patch "${VARIANT:-base}" || exit 2
trap variant_restore EXIT

step "serve --http (tuning in the background)"
python3 -m voiceapp.cli serve --model "$MODEL" --http 127.0.0.1:$PORT --http-max-streams 2000 2>"$OUT/serve.log" &
SERVE=$!
for _ in $(seq 1800); do curl -s -o /dev/null $URL/health && break; sleep 0.1; done
tuned() { python3 -m voiceapp.cli status --json 2>/dev/null | python3 -c "import json,sys; sys.exit(0 if json.load(sys.stdin).get('tuning',{}).get('done') else 1)"; }
step "first audio at 1 client while tuning"
STOP=/tmp/tuned-$$; rm -f $STOP
( for _ in $(seq "${TUNING_1_S:-400}"); do tuned && break; sleep 1; done; touch $STOP ) &
python3 lab/http_latency.py $URL/v1 --clients 1 --rounds 100000 --seconds "${TUNING_1_S:-400}" --stop-file $STOP \
    --text "The train leaves at seven tonight." > "$OUT/tuning_1.json"
python3 -c "
import json, sys
r = json.load(open(sys.argv[1])); s = sorted(ms for at, ms in r['series'] if at < 150)
print('while tuning', r['first_byte_ms'], 'for', r['wall_s'], 's; its first 150 s: p95', s[round(0.95 * (len(s) - 1))] if s else None)
" "$OUT/tuning_1.json"
python3 -m voiceapp.cli status --json > "$OUT/tuning_status.json" 2>/dev/null
python3 -c "import json, sys; t = json.load(open(sys.argv[1])).get('tuning', {}); print('tuning pieces', t.get('pieces'))" \
    "$OUT/tuning_status.json"

step "waiting for tuning"
for _ in $(seq "${LOAD_TUNE_WAIT:-240}"); do
  tuned && break
  sleep 1
done
python3 -m voiceapp.cli status --json > "$OUT/status_tuned.json" 2>&1
python3 -c "import json, sys; s = json.load(open(sys.argv[1])); print('all pieces', s.get('tuning', {}).get('pieces'), 'gc', s.get('gc'), 'loop', s.get('loop'))" \
    "$OUT/status_tuned.json"

step "bench --load over HTTP"
timeout 200 python3 -m voiceapp.cmd_bench --load "${LOAD_RATES:-10,20,40,80}" --load-seconds "${LOAD_SECONDS:-10}" \
    --http $URL --json "$OUT/load_http.json" > "$OUT/load.log" 2>&1
echo "load rc=$?"; tail -8 "$OUT/load.log"
python3 -m voiceapp.cli status --json > "$OUT/status_after.json" 2>&1
python3 -c "import json, sys; s = json.load(open(sys.argv[1])); print('server gc', s.get('gc'), 'loop', s.get('loop'), 'decoder', s.get('decoder'))" "$OUT/status_after.json"
kill $SERVE; wait $SERVE
tail -3 "$OUT/serve.log"
python3 lab/crowd_report.py "$OUT"
step "done"
