#!/usr/bin/env bash
# Device call: export speed to M4B against WAV on the GPU (issue 38's target: M4B within 10% of WAV). The same
# hour-long synthetic book (lab/make_book.py --minutes 60) is exported with the synthetic full Spark checkpoint to
# WAV and to M4B, each a fresh `voicectl export` process timed from launch to exit (the file is complete when it
# exits), REPEATS times, the order alternating (wav m4b, m4b wav, ...). Writes $OUT/export_formats.json: every
# run's times, each format's median, and the ratio of the medians; the M4B's duration is checked against the WAV's.
# No vLLM needed. PyAV is not on the device image: carry its wheel.
#   here, once: python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#                 --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 -d .whl av==18.1.0
#   run (carry [".devcarry/vllm-extra/deps.tar.xz", ".whl"]): bash lab/gpu_export_formats.sh [REPEATS]
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
REPEATS=${1:-3}
if [ ! -d /tmp/site/yaml ]; then
  mkdir -p /tmp/site && tar xJf .devcarry/vllm-extra/deps.tar.xz -C /tmp/site || exit 4
fi
python3 -c "import av" 2>/dev/null || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
  --upgrade --target /tmp/site .whl/av-*.whl || exit 4
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
python3 -m compileall -q /tmp/site engine voiceapp >/dev/null 2>&1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/env.txt"
python3 -c "import av, torch; print('av', av.__version__, 'ffmpeg', av.ffmpeg_version_info, 'torch', torch.__version__)" \
  | tee -a "$OUT/env.txt"
nproc | tee -a "$OUT/env.txt"
MODEL=${TMPDIR:-/tmp}/voiceapp-gpu-model
[ -f "$MODEL/config.yaml" ] || python3 -c "import sys; from engine.synthetic import write_checkpoint; write_checkpoint(sys.argv[1], size='full', seed=0)" "$MODEL"
WORK=${TMPDIR:-/tmp}/export-formats; rm -rf "$WORK"; mkdir -p "$WORK"
python3 lab/make_book.py "$WORK/book.txt" --minutes 60

export_once() {  # FORMAT REPEAT: one fresh export; its summary (--json) and launch and exit times to $WORK
  rm -rf "$WORK/book.$1" "$WORK/book.$1".* "$WORK/book.cue"
  local t0=$EPOCHREALTIME
  timeout 580 python3 -m voiceapp.cli export "$WORK/book.txt" -o "$WORK/book.$1" --model "$MODEL" --no-progress \
    --json > "$WORK/run-$2-$1.json" 2> "$WORK/run-$2-$1.err"
  local code=$? t1=$EPOCHREALTIME
  echo "{\"format\": \"$1\", \"repeat\": $2, \"exit\": $code, \"launched\": $t0, \"exited\": $t1}" \
    > "$WORK/time-$2-$1.json"
  tail -2 "$WORK/run-$2-$1.err"
}

for r in $(seq "$REPEATS"); do
  if [ $((r % 2)) -eq 1 ]; then order="wav m4b"; else order="m4b wav"; fi
  for f in $order; do export_once "$f" "$r"; done
done

python3 - "$WORK" "$OUT" "$REPEATS" <<'EOF'
import json, statistics, sys, wave
from pathlib import Path

import av

work, out, repeats = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
runs = []
for r in range(1, repeats + 1):
    for f in ("wav", "m4b"):
        run = json.loads((work / f"time-{r}-{f}.json").read_text())
        run["launch_to_exit_s"] = round(run.pop("exited") - run.pop("launched"), 3)
        summary = work / f"run-{r}-{f}.json"
        try:
            run.update(json.loads(summary.read_text()))
        except (OSError, ValueError):
            run["error"] = (work / f"run-{r}-{f}.err").read_text()[-2000:]
        runs.append(run)
ok = [r for r in runs if r["exit"] == 0]


def median(fmt, key):
    values = [r[key] for r in ok if r["format"] == fmt and key in r]
    return statistics.median(values) if values else None


result = {"book": "lab/make_book.py --minutes 60", "model": "synthetic full Spark checkpoint", "runs": runs,
          "median": {f: {k: median(f, k) for k in ("launch_to_exit_s", "e2e_s", "wall_s", "encode_s",
                                                    "after_last_part_s", "xrt", "audio_s")} for f in ("wav", "m4b")}}
wav, m4b = result["median"]["wav"]["launch_to_exit_s"], result["median"]["m4b"]["launch_to_exit_s"]
result["m4b_over_wav"] = round(m4b / wav, 4) if wav and m4b else None
if (work / "book.wav").exists() and (work / "book.m4b").exists():
    with wave.open(str(work / "book.wav")) as w:
        wav_s = w.getnframes() / w.getframerate()
    with av.open(str(work / "book.m4b")) as c:
        a = c.streams.audio[0]
        result["check"] = {"wav_s": wav_s, "m4b_s": float(a.duration * a.time_base), "chapters": len(c.chapters())}
result["env"] = (out / "env.txt").read_text()
(out / "export_formats.json").write_text(json.dumps(result, indent=1))
print(json.dumps({k: result[k] for k in ("median", "m4b_over_wav")}, indent=1), result.get("check"))
EOF
