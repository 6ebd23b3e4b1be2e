#!/usr/bin/env bash
# Device call: speech-dispatcher's first sound through voiceapp's module and a warm server on a GPU host
# (docs/integrations.md). The lent machines have no sound stack: lab/pack_audio_carry.sh packs this machine's, which
# is unpacked here beside the host's own files (never over them). The synthetic full Spark checkpoint on the graph
# lane (FAMILY=orpheus: Orpheus's, voice tara at 24 kHz), then the fake engine for the client's side on this host
# (FAKE_S=0: not). carry [".devcarry/vllm-extra/deps.tar.xz",
# ".devcarry/audio"]. Writes $OUT/speechd_gpu.json, $OUT/speechd_fake.json and their logs.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
t0=$(date +%s)
if [ ! -f /tmp/site/soundfile.py ]; then
  mkdir -p /tmp/site && tar xJf .devcarry/vllm-extra/deps.tar.xz -C /tmp/site || exit 4
fi
python3 -m zipfile -e .devcarry/audio/sounddevice-*.whl /tmp/site || exit 4
if ! command -v pulseaudio > /dev/null; then
  mkdir -p /tmp/audio-stage && tar xJf .devcarry/audio/audio.tar.xz -C /tmp/audio-stage || exit 4
  cp -rn /tmp/audio-stage/. / && ldconfig || exit 4
fi
[ -s /etc/machine-id ] || python3 -c "import uuid; print(uuid.uuid4().hex)" > /etc/machine-id
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
python3 -m compileall -q -j 0 engine voiceapp lab tests > /dev/null
if [ "${FAMILY:-spark}" = orpheus ]; then
  MODEL=${TMPDIR:-/tmp}/voiceapp-orpheus-full WRITER=engine.families.orpheus.synthetic
  VOICE=(--voice tara --rate 24000 --max-tokens 120)
else
  MODEL=${TMPDIR:-/tmp}/voiceapp-gpu-model WRITER=engine.synthetic VOICE=()
fi
[ -f "$MODEL/config.json" ] || python3 -c "import sys; from $WRITER import write_checkpoint; write_checkpoint(sys.argv[1], size='full', seed=0)" "$MODEL" || exit 5
echo "ready at $(( $(date +%s) - t0 )) s; $(pulseaudio --version) $(speech-dispatcher --version | head -1)"
timeout "${GPU_S:-400}" python3 lab/speechd_latency.py --backend torch --model "$MODEL" "${VOICE[@]}" \
    --runs "${RUNS:-9}" > "$OUT/speechd_gpu.json" 2> "$OUT/speechd_gpu.log"
echo "gpu: exit $? at $(( $(date +%s) - t0 )) s"; tail -5 "$OUT/speechd_gpu.log"
[ "${FAKE_S:-150}" = 0 ] || timeout "${FAKE_S:-150}" python3 lab/speechd_latency.py --backend fake --runs "${RUNS:-9}" \
    > "$OUT/speechd_fake.json" 2> "$OUT/speechd_fake.log"
echo "fake: exit $? at $(( $(date +%s) - t0 )) s"; tail -5 "$OUT/speechd_fake.log"
python3 -c "
import json, sys
for f in sys.argv[1:]:
    try: print(f, json.load(open(f))['median_ms'])
    except Exception as e: print(f, 'unreadable:', e)" "$OUT/speechd_gpu.json" "$OUT/speechd_fake.json"
