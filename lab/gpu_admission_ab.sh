#!/usr/bin/env bash
# Device call: refusals under open-loop HTTP load (issue 42), the admission before and after a change, on the same
# machine: for each tree (OLD, NEW: checkouts of this repository), `voicectl serve --http` on the synthetic full
# Spark checkpoint (graph lane, no vLLM), tuned, then `voicectl bench --load RATES --http` with NEW's load bench
# (it records each 429's reason) -> $OUT/load_old.json, $OUT/load_new.json, and the serve logs.
#   run (carry [".devcarry/http", ".devcarry/admit"]): OLD=. NEW=.devcarry/admit bash .devcarry/admit/lab/gpu_admission_ab.sh
# .devcarry/http as in lab/gpu_http_latency.sh; .devcarry/admit: `git archive` of the change. ADMIT_RATES (default
# 10,20,40,80), ADMIT_SECONDS (default 10) per rate, ADMIT_TUNE_WAIT (default 150 s).
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
HTTP_SITE=$PWD/.devcarry/http
OLD=$(cd "${OLD:-.}" && pwd); NEW=$(cd "${NEW:?NEW: the changed tree}" && pwd)
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
MODEL=${TMPDIR:-/tmp}/voiceapp-gpu-model
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/env.txt"
(cd "$NEW" && PYTHONPATH=$HTTP_SITE:$NEW python3 -c "import sys; from engine.synthetic import write_checkpoint; write_checkpoint(sys.argv[1], size='full', seed=0)" "$MODEL") || exit 4
T0=$(date +%s)

one() {  # one() NAME TREE: serve from TREE, tune, load with NEW's bench
  local name=$1 tree=$2 sock=/tmp/admit-$1.sock
  echo "== $name at $(( $(date +%s) - T0 )) s"
  (cd "$tree" && PYTHONPATH=$HTTP_SITE:$tree VOICEAPP_SOCKET=$sock exec python3 -m voiceapp.cli serve --model "$MODEL" \
      --http 127.0.0.1:8000 --http-max-streams 2000 2>"$OUT/serve_$name.log") &
  local serve=$!
  for _ in $(seq 900); do curl -s -o /dev/null http://127.0.0.1:8000/health && break; sleep 0.1; done
  for _ in $(seq "${ADMIT_TUNE_WAIT:-150}"); do
    (cd "$tree" && PYTHONPATH=$HTTP_SITE:$tree VOICEAPP_SOCKET=$sock python3 -m voiceapp.cli status --json 2>/dev/null) \
      | python3 -c "import json,sys; sys.exit(0 if json.load(sys.stdin).get('tuning',{}).get('done') else 1)" && break
    sleep 1
  done
  echo "tuned at $(( $(date +%s) - T0 )) s"
  (cd "$NEW" && PYTHONPATH=$HTTP_SITE:$NEW timeout 240 python3 -m voiceapp.cmd_bench --load "${ADMIT_RATES:-10,20,40,80}" \
      --load-seconds "${ADMIT_SECONDS:-10}" --http http://127.0.0.1:8000 --json "$OUT/load_$name.json") 2>&1 | tail -20
  (cd "$tree" && PYTHONPATH=$HTTP_SITE:$tree VOICEAPP_SOCKET=$sock python3 -m voiceapp.cli status --json \
      > "$OUT/status_$name.json" 2>&1)
  kill $serve; wait $serve
  grep -v "it/s\]" "$OUT/serve_$name.log" | tail -4
}
one old "$OLD"
one new "$NEW"
echo "== done at $(( $(date +%s) - T0 )) s"
