#!/usr/bin/env bash
# Device call on a machine with 2 GPUs: what issue 39's targets ask (docs/scale.md), written to $OUT/scale.json with
# the keys of docs/benchmarks/scale.json (device, gpus, streams_1gpu, streams_2gpu, export_xrt_1gpu, export_xrt_2gpu,
# ray_first_byte_overhead_ms_p50, cold_start_s) and the raw runs beside it.
#   run (kind nvidia-h100-x2; the lead sets PYTHONPATH so that `import ray` works, e.g. Ray's wheels unpacked under
#   .devcarry/ray, and the HTTP stack as lab/gpu_http_latency.sh has it): bash lab/gpu_scale.sh
# Each part: a plain server or export on GPU 0 alone (CUDA_VISIBLE_DEVICES=0), then the same through Ray on both.
# - streams: `voicectl bench --load` over HTTP at each rate of $LOAD_RATES for $LOAD_SECONDS; the number is the
#   highest peak concurrency of a rate with no underrun, no refusal and no failure.
# - export: an hour of text (lab/make_book.py --minutes 60), its end-to-end x real time (`export --json` e2e_xrt),
#   and whether the two outputs are the same bytes.
# - first byte: lab/http_latency.py at 1 client, p50, Ray's server minus the plain one.
# - cold start: `serve --ray --min-replicas 0`, idle until it has no replica, then one request: the wait it logs.
# Env: PARTS (default serve,zero,export: a subset when one call cannot hold all three; the JSON at the end is
# written by the export part), BACKEND (default torch: the crowd's lane sized to the GPU, built before answering, no vLLM needed),
# LOAD_RATES (default 8,16,32,48,64,96), LOAD_SECONDS (default 20), BOOK_MINUTES (default 60), MODEL (default: the
# synthetic full checkpoint, written once under $TMPDIR), PORT (the servers' HTTP port, default 8000).
# A dry run on a machine without GPUs runs every step (CPU replicas and workers; nvidia-smi absent, device null):
#   MODEL=DIR_OF_A_TINY_CHECKPOINT LOAD_RATES=1 LOAD_SECONDS=3 BOOK_MINUTES=1 PORT=18731 OUT=DIR bash lab/gpu_scale.sh
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
BACKEND=${BACKEND:-torch}; RATES=${LOAD_RATES:-8,16,32,48,64,96}; SECONDS_PER_RATE=${LOAD_SECONDS:-20}
MODEL=${MODEL:-${TMPDIR:-/tmp}/voiceapp-gpu-model}; PORT=${PORT:-8000}; URL=http://127.0.0.1:$PORT
WORK=${TMPDIR:-/tmp}/voiceapp-scale; mkdir -p "$WORK"
python3 -c "import ray; print('ray', ray.__version__)" || { echo "ray is not importable: set PYTHONPATH"; exit 5; }
[ -f "$MODEL/config.yaml" ] || python3 -c "import sys; from engine.synthetic import write_checkpoint; write_checkpoint(sys.argv[1], size='full', seed=0)" "$MODEL"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/env.txt"
ENGINE=(--model "$MODEL" --backend "$BACKEND")

serve_up() {  # NAME ARGS...: a server on 127.0.0.1:$PORT with its own socket; waits until it answers
  local name=$1; shift
  # the stream limit far above what a GPU holds: refusals then come from the admission, which is what is measured
  VOICEAPP_SOCKET=$WORK/$name.sock python3 -m voiceapp.cli serve "${ENGINE[@]}" --http 127.0.0.1:$PORT \
      --http-max-streams 4000 --http-max-connections 4000 "$@" \
      2>"$OUT/serve-$name.log" &
  SERVER=$!
  for _ in $(seq 1800); do curl -s -o /dev/null $URL/health && return 0; sleep 0.2; done
  echo "server $name did not answer"; tail -5 "$OUT/serve-$name.log"; return 1
}
serve_down() { kill "$SERVER"; wait "$SERVER"; sleep 2; }
measure() {  # NAME: first byte at 1 client, then the load test
  local name=$1
  python3 lab/http_latency.py $URL/v1 --clients 1 --rounds 16 > "$OUT/first-byte-$name.json"
  VOICEAPP_SOCKET=$WORK/$name.sock python3 -m voiceapp.cli bench --load "$RATES" --load-seconds "$SECONDS_PER_RATE" \
      --http $URL --json "$OUT/load-$name.json" > "$OUT/load-$name.txt" 2>&1
  tail -12 "$OUT/load-$name.txt"
}

PARTS=${PARTS:-serve,zero,export}
part() { case ",$PARTS," in *",$1,"*) return 0 ;; *) return 1 ;; esac; }

# serving: one GPU, plain; two GPUs, through Ray (one replica each)
part serve && CUDA_VISIBLE_DEVICES=0 serve_up direct && { measure direct; serve_down; }
part serve && serve_up ray --ray && { measure ray; VOICEAPP_SOCKET=$WORK/ray.sock python3 -m voiceapp.cli status --json > "$OUT/status-ray.json"; serve_down; }

# scale to zero: no replica while idle, then one request
part zero && serve_up zero --ray --min-replicas 0 --max-replicas 1 --scale-down-after 5 && {
  for _ in $(seq 120); do  # until Serve has removed the replica (Ray's own view of the deployment)
    python3 -c "
from ray import serve; import logging, ray, sys
ray.init(address='auto', logging_level=logging.ERROR)
d = serve.status().applications['voiceapp'].deployments['voiceapp-engine']
sys.exit(0 if sum(d.replica_states.values()) == 0 else 1)" 2>/dev/null && break
    sleep 2
  done
  python3 lab/http_latency.py $URL/v1 --clients 1 --rounds 1 > "$OUT/cold.json"
  VOICEAPP_SOCKET=$WORK/zero.sock python3 -m voiceapp.cli status --json > "$OUT/status-zero.json"
  grep "cold start" "$OUT/serve-zero.log"
  serve_down
}

# export: an hour of text on one GPU, then on both through Ray Data
part export || exit 0
python3 lab/make_book.py $WORK/book.txt --minutes "${BOOK_MINUTES:-60}"
CUDA_VISIBLE_DEVICES=0 python3 -m voiceapp.cli export $WORK/book.txt -o $WORK/1.wav "${ENGINE[@]}" \
    --no-progress --json > "$OUT/export-1gpu.json" 2>"$OUT/export-1gpu.log"
python3 -m voiceapp.cli export $WORK/book.txt -o $WORK/2.wav "${ENGINE[@]}" --ray --no-progress --json \
    > "$OUT/export-2gpu.json" 2>"$OUT/export-2gpu.log"
cmp -s $WORK/1.wav $WORK/2.wav && SAME=true || SAME=false

SAME=$SAME python3 - "$OUT" <<'EOF'
import json, os, subprocess, sys
from pathlib import Path

out = Path(sys.argv[1])


def read(name):
    try:
        return json.loads((out / name).read_text())
    except (OSError, ValueError):
        return None


def streams(name):
    """The highest peak concurrency of a rate every stream of which played through (no underrun, refusal, failure)."""
    data = read(f"load-{name}.json")
    if not data:
        return None
    clean = [r["peak_concurrency"] for r in data["rates"] if r["underruns"] == 0 and not r["refused"] and not r["failed"]]
    return max(clean, default=0)


def first_byte(name):
    data = read(f"first-byte-{name}.json")
    return data["first_byte_ms"]["p50"] if data else None


def xrt(name):
    data = read(f"export-{name}.json")
    return round(data["e2e_xrt"], 2) if data else None


direct, ray = first_byte("direct"), first_byte("ray")
zero = read("status-zero.json") or {}
cold = zero.get("cold_starts") or []
try:
    gpus = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True).stdout.strip().splitlines()
except FileNotFoundError:  # a dry run on a machine without GPUs
    gpus = []
result = {"device": gpus[0].split(":", 1)[1].split("(")[0].strip() if gpus else None, "gpus": len(gpus),
          "streams_1gpu": streams("direct"), "streams_2gpu": streams("ray"),
          "export_xrt_1gpu": xrt("1gpu"), "export_xrt_2gpu": xrt("2gpu"),
          "ray_first_byte_overhead_ms_p50": round(ray - direct, 2) if None not in (ray, direct) else None,
          "cold_start_s": cold[-1]["wait_s"] if cold else None,
          "export_identical": os.environ["SAME"] == "true", "backend": os.environ.get("BACKEND", "torch")}
(out / "scale.json").write_text(json.dumps(result, indent=2) + "\n")
print(json.dumps(result, indent=2))
EOF
