#!/usr/bin/env bash
# Device calls for the warm server and the GPU export (docs/benchmarks.md, "Warm server" and "Export"), after
# call 1 of scripts/gpu_bench.sh (cp .devcarry/vllm-core/core.part-aa /tmp/), each carrying .devcarry/vllm-extra:
#   bash scripts/gpu_issue6.sh say      voicectl say TTFA through a warm `voicectl serve` (5 runs) vs in-process
#                                       (1 run: each builds the engine), scripts/say_ttfa.py
#   bash scripts/gpu_issue6.sh export   voicectl export of a one-hour text (scripts/make_book.py), then
#                                       scripts/export_determinism.py on export's engine (GPU_DET_FAST=1: and on
#                                       the default engine too)
#   bash scripts/gpu_issue6.sh probe    scripts/vllm_invariance_probe.py with VLLM_BATCH_INVARIANT=1
# Several modes run in turn: `bash scripts/gpu_issue6.sh probe say`.
# Everything worth keeping goes to $OUT (the WAVs do not: they stay in /tmp).
set -u
source scripts/device_env.sh || exit $?
write_model
[ $# -gt 0 ] || set -- usage
for mode in "$@"; do
case "$mode" in
  probe)
    timeout 200 python3 scripts/vllm_invariance_probe.py "$MODEL" --invariant --json "$OUT/invariance.json" 2>&1 \
        | grep -v EngineCore | tail -4
    echo "probe done at $(( $(date +%s) - T0 )) s"
    ;;
  say)
    timeout 560 python3 scripts/say_ttfa.py --backend vllm --model "$MODEL" --runs 5 --inproc-runs 1 --json \
        > "$OUT/say_ttfa.json" 2> "$OUT/say_ttfa.log"
    echo "say_ttfa rc=$? at $(( $(date +%s) - T0 )) s"; cat "$OUT/say_ttfa.json"; tail -5 "$OUT/say_ttfa.log"
    ;;
  export)
    python3 scripts/make_book.py /tmp/book.txt --minutes 60 2>&1 | tee "$OUT/export.log"
    rm -rf /tmp/export && mkdir -p /tmp/export
    t=$(date +%s.%N)
    timeout 330 python3 -m voiceapp.cli export /tmp/book.txt -o /tmp/export/book.wav --backend vllm \
        --model "$MODEL" --no-progress 2>&1 | grep -v EngineCore | tee -a "$OUT/export.log"
    echo "export rc=${PIPESTATUS[0]}, process wall $(python3 -c "import time,sys; print(round(time.time()-float(sys.argv[1]),1))" "$t") s" | tee -a "$OUT/export.log"
    ls -la /tmp/export | tee -a "$OUT/export.log"; cp /tmp/export/book.cue "$OUT/" 2>/dev/null
    python3 -c "import soundfile as sf; i = sf.info('/tmp/export/book.wav'); print('wav', i.samplerate, i.channels, i.subtype, round(i.duration, 1), 's')" | tee -a "$OUT/export.log"
    rm -rf /tmp/export
    echo "export done at $(( $(date +%s) - T0 )) s"
    timeout 230 python3 scripts/export_determinism.py --backend vllm --model "$MODEL" --sentences 24 \
        --json "$OUT/determinism.json" 2>&1 | grep -v EngineCore | tail -3
    echo "determinism done at $(( $(date +%s) - T0 )) s"
    if [ "${GPU_DET_FAST:-0}" = 1 ]; then
      timeout 200 python3 scripts/export_determinism.py --backend vllm --model "$MODEL" --sentences 24 --fast \
          --json "$OUT/determinism_fast.json" 2>&1 | grep -v EngineCore | tail -3
    fi
    ;;
  *) echo "usage: gpu_issue6.sh say|export|probe ..."; exit 2 ;;
esac
done
