#!/usr/bin/env bash
# Device call: time from an HTTP speech request to its first audio byte (lab/http_latency.py) on a GPU server,
# at 1 client on the engine that answers first, then at 1 and 32 clients once the server has tuned itself.
#   run (carry [".devcarry/vllm-extra", ".devcarry/http"]): bash lab/gpu_http_latency.sh
# .devcarry/http: the HTTP stack's pure-Python wheels unpacked (starlette, uvicorn, anyio, h11, sniffio, click,
# idna), which the device image lacks.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
[ -d /tmp/site/yaml ] || { mkdir -p /tmp/site && tar xJf .devcarry/vllm-extra/deps.tar.xz -C /tmp/site || exit 4; }
export PYTHONPATH=/tmp/site:$PWD/.devcarry/http:$PWD PYTHONUNBUFFERED=1 VOICEAPP_SOCKET=/tmp/http-bench.sock
python3 -m compileall -q /tmp/site .devcarry/http engine voiceapp >/dev/null 2>&1
MODEL=${TMPDIR:-/tmp}/voiceapp-gpu-model
[ -f "$MODEL/config.yaml" ] || python3 -c "import sys; from engine.synthetic import write_checkpoint; write_checkpoint(sys.argv[1], size='full', seed=0)" "$MODEL"
python3 -m voiceapp.cli serve --model "$MODEL" --http 127.0.0.1:8000 2>"$OUT/serve.log" &
SERVE=$!
for _ in $(seq 600); do curl -s -o /dev/null http://127.0.0.1:8000/health && break; sleep 0.1; done
URL=http://127.0.0.1:8000/v1
python3 lab/http_latency.py $URL --clients 1 --rounds 8 > "$OUT/first-engine-1.json"; cat "$OUT/first-engine-1.json"
for _ in $(seq 240); do
  python3 -m voiceapp.cli status --json 2>/dev/null | python3 -c "import json,sys; sys.exit(0 if json.load(sys.stdin).get('tuning',{}).get('done') else 1)" && break
  sleep 1
done
python3 -m voiceapp.cli status --json > "$OUT/status.json" 2>&1
python3 lab/http_latency.py $URL --clients 1 --rounds 8 > "$OUT/tuned-1.json"; cat "$OUT/tuned-1.json"
python3 lab/http_latency.py $URL --clients 32 --rounds 2 > "$OUT/tuned-32.json"; cat "$OUT/tuned-32.json"
kill $SERVE; wait $SERVE
tail -5 "$OUT/serve.log"
