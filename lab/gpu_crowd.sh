#!/usr/bin/env bash
# Device call: crowds at the hardware's limit (issue 42) on the synthetic full Spark checkpoint, with vLLM:
#   1. `voicectl bench --levels 1,192,384` (every level's streams start at once) -> $OUT/bench.json
#   2. `voicectl serve --http`, and at once, while it tunes itself in the background, first audio at 1 client
#      (lab/http_latency.py) -> $OUT/tuning_1.json, $OUT/tuning_status.json
#   3. once it has tuned (or CROWD_TUNE_WAIT s passed), `voicectl bench --load 10,20,40,80 --http` (open loop)
#      -> $OUT/load_http.json
#   4. lab/crowd_report.py -> $OUT/load.json (device, rates: first_ms_p50/p95, underran_share, refused per rate;
#      tuning_first_ms_p95_1) and $OUT/latest_streams.json (max_realtime_streams)
#   run (carry [".devcarry/vllm-extra", ".devcarry/http"]): bash lab/gpu_crowd.sh
# after call 1 of lab/gpu_bench.sh's header (vLLM's core part copied to /tmp); .devcarry/http as in
# lab/gpu_http_latency.sh. Budget about 8 minutes: CROWD_BENCH_TIMEOUT (default 330 s: a fresh machine captures graphs for ~200 s) for step 1, CROWD_TUNE_WAIT
# (default 120 s), CROWD_LOAD_SECONDS (default 10 s per rate). Exit 3: the machine was replaced, repeat call 1.
set -u
source lab/device_env.sh || exit $?
export PYTHONPATH=$PYTHONPATH:$PWD/.devcarry/http VOICEAPP_SOCKET=/tmp/crowd.sock
write_model
step() { echo "== $1 at $(( $(date +%s) - T0 )) s"; }

step "bench --levels"
timeout "${CROWD_BENCH_TIMEOUT:-330}" python3 -m voiceapp.cmd_bench --model "$MODEL" --backend vllm \
    --levels 1,192,384 --json "$OUT/bench.json" > "$OUT/bench.log" 2>&1
echo "bench rc=$?"; grep -E "streams|real time" "$OUT/bench.log" | tail -8

step "serve --http (tuning in the background)"
python3 -m voiceapp.cli serve --model "$MODEL" --http 127.0.0.1:8000 --http-max-streams 2000 2>"$OUT/serve.log" &
SERVE=$!
for _ in $(seq 900); do curl -s -o /dev/null http://127.0.0.1:8000/health && break; sleep 0.1; done
URL=http://127.0.0.1:8000/v1
python3 lab/http_latency.py $URL --clients 1 --rounds 20 --text "The train leaves at seven tonight." \
    > "$OUT/tuning_1.json"
python3 -m voiceapp.cli status --json > "$OUT/tuning_status.json" 2>/dev/null
cat "$OUT/tuning_1.json"

step "waiting for tuning"
for _ in $(seq "${CROWD_TUNE_WAIT:-120}"); do
  python3 -m voiceapp.cli status --json 2>/dev/null | python3 -c "import json,sys; sys.exit(0 if json.load(sys.stdin).get('tuning',{}).get('done') else 1)" && break
  sleep 1
done
python3 -m voiceapp.cli status --json > "$OUT/status_tuned.json" 2>&1

step "bench --load over HTTP"
timeout 200 python3 -m voiceapp.cmd_bench --load 10,20,40,80 --load-seconds "${CROWD_LOAD_SECONDS:-10}" \
    --http http://127.0.0.1:8000 --json "$OUT/load_http.json" > "$OUT/load.log" 2>&1
echo "load rc=$?"; tail -8 "$OUT/load.log"
python3 -m voiceapp.cli status --json > "$OUT/status_after.json" 2>&1
kill $SERVE; wait $SERVE
tail -5 "$OUT/serve.log"

step "report"
python3 lab/crowd_report.py "$OUT"
step "done"
