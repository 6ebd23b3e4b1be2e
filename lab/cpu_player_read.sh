#!/usr/bin/env bash
# A long read through the real player on this machine's CPU: a private PulseAudio with a float32 null sink, then
# `voicectl say --no-server --json` of TEXT_FILE on MODEL (a synthetic full checkpoint) with each QUANTIZE value.
# Prints one JSON line per run: the say metrics (underruns, RTF, TTFA from launch, notices) and the load average.
#   MODEL=DIR TEXT_FILE=F QUANTIZE="auto none" (auto: the default) THREADS=2 BUFFER=3 bash lab/cpu_player_read.sh
# BUFFER: the player's ring in seconds (say --buffer); one longer than the read never fills, so the say metrics'
# wall time is then the engine's synthesis time while the real player plays, not the speakers' pace.
set -u
d=$(mktemp -d /tmp/pa.XXXXXX)
export XDG_RUNTIME_DIR=$d PULSE_SERVER=unix:$d/native PULSE_COOKIE=$d/cookie HOME_SAVED=$HOME
HOME=$d pulseaudio --daemonize=no -n --exit-idle-time=-1 --enable-memfd=no --log-target=file:$d/pulse.log \
  -L "module-native-protocol-unix auth-anonymous=1 socket=$d/native" \
  -L "module-null-sink sink_name=speakers format=float32le rate=16000 channels=1 norewinds=1" &
pa=$!
trap 'kill $pa 2>/dev/null; rm -rf "$d"' EXIT
for _ in $(seq 100); do HOME=$d pactl info >/dev/null 2>&1 && break; sleep 0.1; done
HOME=$d pactl set-default-sink speakers
for q in ${QUANTIZE:-auto none}; do
  start=$(date +%s.%N)
  out=$(python -m voiceapp.cli say --no-server --json --backend torch --compute cpu --threads "${THREADS:-2}" \
        --buffer "${BUFFER:-3}" $([ "$q" = auto ] || echo --quantize "$q") --model "$MODEL" --seed 1 "$(cat "$TEXT_FILE")" 2>"$d/err.log")
  end=$(date +%s.%N)
  echo "{\"quantize\": \"$q\", \"threads\": ${THREADS:-2}, \"buffer_s\": ${BUFFER:-3}, \"process_s\": $(echo "$end - $start" | bc), \"load_avg_1m\": $(cut -d' ' -f1 /proc/loadavg), \"say\": ${out:-null}, \"stderr\": $(python -c 'import json,sys; print(json.dumps(open(sys.argv[1]).read()[-600:]))' "$d/err.log")}"
done
