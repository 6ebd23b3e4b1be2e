#!/usr/bin/env bash
# Device harness (run with carry [".devcarry/vllm-extra"]; no vLLM needed): the CPU engine on the lent machine's
# CPU with CUDA hidden, and, with PART=say, the say-through-a-warm-server start-up case on its GPU.
#   PART=say   python -m lab.startup --cases import_torch,say_autostart on the GPU (issue 22's client figure)
#   PART=cpu16 the CPU engine on all cores: decoder variants (lab.cpu_decoder_probe) and the pipeline
#              (lab.cpu_figures) with int8 and fp32 LLM weights
#   PART=cpu2  the same pinned to two cores (taskset -c 0,1), with the variants that decide the CPU defaults
#   PART=pools factory.cpu_pools (the default) against one shared sleeping pool, on 16, 8 and 4 cores
#   PART=final16 the shipping CPU engine on 16 cores against the previous int8 one and fp32, three rounds
#   PART=int4  16 cores: --quantize int4 against the default int8
#   PART=share 16 cores: the LLM's share of the split (8 + 8 against 6 + 10)
#   PART=heads 16 cores split as cpu_pools does, with the LM head's pool spinning too, and a larger LLM share
#   PART=spin  all cores: the int8 LLM's threads spinning or sleeping between kernels
#   PART=split all cores: cropped vs whole-window decoding, and the int8 LLM's pool size against torch's
#   PART=read  python -m lab.read_bench --no-sound (the minute's reading, fresh say processes) on all cores with int8,
#              int4 and fp32 weights, then pinned to two cores (taskset -c 0,1) with int8 and int4
#   PART=ttfa  fresh `say --no-server --out` processes on all cores, alternating this tree with one where $PATCH
#              (default .devcarry/head.patch: the LLM's head built at load; carry it) is reversed, then, with
#              TRACES=1 (the default), chunk traces (lab.chunk_trace) of the same texts with int8 and int4 weights,
#              for replaying the pacer here
#   PART=rows  the minute's reading (`python -m lab.read_bench --no-sound --weights int8`) on all cores and pinned to two, this tree
#              against one where $PATCH (carry it) is reversed, alternating, ROUNDS rounds (default 2)
# Results (JSON lines) land in $OUT/<part>.jsonl; the machine's facts in $OUT/env.txt.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; T0=$(date +%s)
if [ ! -d /tmp/site/soundfile ]; then
  mkdir -p /tmp/site && tar xJf .devcarry/vllm-extra/deps.tar.xz -C /tmp/site || exit 4
fi
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
python3 -m compileall -q /tmp/site engine voiceapp lab >/dev/null 2>&1
MODEL=/tmp/voiceapp-gpu-model
[ -f "$MODEL/config.yaml" ] || python3 -c "import sys; from engine.synthetic import write_checkpoint; write_checkpoint(sys.argv[1], size='full', seed=0)" "$MODEL"
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; lscpu | grep -E "Model name|^CPU\(s\)"; python3 -c "import torch, onnxruntime; print('torch', torch.__version__, 'onnxruntime', onnxruntime.__version__)"; } > "$OUT/env.txt" 2>&1
echo "ready at $(( $(date +%s) - T0 )) s"; cat "$OUT/env.txt"
figures() {  # figures LABEL PREFIX... -- ARGS: one lab.cpu_figures run, tagged
  local label=$1; shift; local pre=(); while [ "$1" != "--" ]; do pre+=("$1"); shift; done; shift
  echo "{\"label\": \"$label\", \"result\": $(CUDA_VISIBLE_DEVICES= "${pre[@]}" python3 -m lab.cpu_figures --size full --model "$MODEL" "$@" 2>>"$OUT/err.log" | tail -1)}" | tee -a "$OUT/$PART.jsonl"
  echo "  at $(( $(date +%s) - T0 )) s"
}
case ${PART:-say} in
read)
  CUDA_VISIBLE_DEVICES= python3 -m lab.read_bench --no-sound --model "$MODEL" --weights int8,int4,none \
    --json "$OUT/read-all.json" 2>>"$OUT/err.log"
  echo "  at $(( $(date +%s) - T0 )) s"
  CUDA_VISIBLE_DEVICES= taskset -c 0,1 python3 -m lab.read_bench --no-sound --model "$MODEL" \
    --weights int8,int4 --json "$OUT/read-2.json" 2>>"$OUT/err.log"
  echo "  at $(( $(date +%s) - T0 )) s" ;;
ttfa)
  rm -rf /tmp/before && mkdir /tmp/before \
    && tar -C "$PWD" --exclude=./.devcarry/vllm-extra -cf - . | tar -C /tmp/before -xf - \
    && (cd /tmp/before && patch -p1 -R -s < "${PATCH:-.devcarry/head.patch}") || exit 5
  SHORT="The quick brown fox jumps over the lazy dog."
  LONG=$(python3 -c "from lab.read_bench import READ_TEXT; print(READ_TEXT.split('. ')[0] + '.')")
  for R in $(seq "${ROUNDS:-4}"); do
    for tree in "$PWD" /tmp/before; do
      for text in "$SHORT" "$LONG"; do
        # a cache folder per tree: a converted LLM of another format version would be converted again each time
        line=$(cd "$tree" && CUDA_VISIBLE_DEVICES= XDG_CACHE_HOME=/tmp/cache-$(basename "$tree") PYTHONPATH=/tmp/site:$tree \
          python3 -m voiceapp.cli say --no-server --model "$MODEL" --seed 1 --json --out /tmp/ttfa.wav "$text" \
          2>>"$OUT/err.log" | tail -1)
        echo "{\"tree\": \"$(basename "$tree")\", \"round\": $R, \"chars\": ${#text}, \"say\": $line}" \
          | tee -a "$OUT/ttfa.jsonl"
      done
    done
  done
  echo "  at $(( $(date +%s) - T0 )) s"
  [ "${TRACES:-1}" = 1 ] && for q in int8 int4; do
    CUDA_VISIBLE_DEVICES= python3 -m lab.chunk_trace --model "$MODEL" --quantize $q "$SHORT" \
      "$(python3 -c "from lab.read_bench import READ_TEXT; print(READ_TEXT)")" "$SHORT" >> "$OUT/traces.jsonl" \
      2>>"$OUT/err.log"
  done ;;
rows)
  rm -rf /tmp/before && mkdir /tmp/before \
    && tar -C "$PWD" --exclude=./.devcarry/vllm-extra -cf - . | tar -C /tmp/before -xf - \
    && (cd /tmp/before && patch -p1 -R -s < "$PWD/${PATCH:?carry the patch to reverse}") || exit 5
  for R in $(seq "${ROUNDS:-2}"); do
    for tree in "$PWD" /tmp/before; do
      for pin in "" "taskset -c 0,1"; do
        name=$(basename "$tree")-r$R-$([ -n "$pin" ] && echo 2 || echo all)
        (cd "$tree" && CUDA_VISIBLE_DEVICES= XDG_CACHE_HOME=/tmp/cache-$(basename "$tree") PYTHONPATH=/tmp/site:$tree \
          $pin python3 -m lab.read_bench \
          --no-sound --model "$MODEL" --weights int8 --json "$OUT/read-$name.json" >/dev/null 2>>"$OUT/err.log")
        echo "$name: $(python3 -c "import json,sys; r=json.load(open(sys.argv[1]))['runs'][0]; print(r['rtf'], r['ttfa_s'])" "$OUT/read-$name.json")"
        echo "  at $(( $(date +%s) - T0 )) s"
      done
    done
  done ;;
say)
  python3 -m lab.startup --model "$MODEL" --cases import_torch,say_autostart --repeats 3 \
    --timeout 300 --warm-json docs/benchmarks/latest.json --json "$OUT/startup-say.json" 2>&1 | tail -15 ;;
cpu16)
  CUDA_VISIBLE_DEVICES= python3 -m lab.cpu_decoder_probe --model "$MODEL" --threads 16 --codes 44,82,182 --rounds 3 \
    2>>"$OUT/err.log" | tail -1 | tee -a "$OUT/$PART.jsonl"
  figures int8-16 env -- --threads 16 --tokens 200
  figures fp32-16 env -- --threads 16 --tokens 200 --quantize none ;;
cpu2)
  CUDA_VISIBLE_DEVICES= taskset -c 0,1 python3 -m lab.cpu_decoder_probe --model "$MODEL" --threads 2 --codes 44,82,182 \
    --rounds 3 2>>"$OUT/err.log" | tail -1 | tee -a "$OUT/$PART.jsonl"
  figures int8-bf16 taskset -c 0,1 -- --threads 2 --tokens 150
  figures int8-fp32dec taskset -c 0,1 -- --threads 2 --tokens 150 --decoder-dtype fp32
  figures int8-bf16-passive env OMP_WAIT_POLICY=PASSIVE taskset -c 0,1 -- --threads 2 --tokens 150
  figures int8-bf16-bigwin taskset -c 0,1 -- --threads 2 --tokens 150 --schedule 4,24,3,240
  figures fp32-2 taskset -c 0,1 -- --threads 2 --tokens 150 --quantize none ;;
split)  # the decoder's crops and the LLM's own pool size on all 16 cores; ROUND tags a repeat
  for cfg in "16 16" "16 8" "8 8" "12 4" "16 4"; do
    set -- $cfg; figures "int8-t$1-llm$2-r${ROUND:-1}" env -- --threads "$1" --llm-threads "$2" --tokens 200
  done
  figures "int8-t16-nocrop-r${ROUND:-1}" env -- --threads 16 --tokens 200 --no-crop
  figures "fp32-16-r${ROUND:-1}" env -- --threads 16 --tokens 200 --quantize none ;;
spin)  # the int8 LLM's pool spinning or sleeping between kernels, at two pool sizes; ROUND tags a repeat
  for cfg in "16 16" "16 8" "8 8"; do
    set -- $cfg
    figures "int8-t$1-llm$2-spin-r${ROUND:-1}" env -- --threads "$1" --llm-threads "$2" --tokens 200 --llm-spin
    figures "int8-t$1-llm$2-sleep-r${ROUND:-1}" env -- --threads "$1" --llm-threads "$2" --tokens 200
  done ;;
pools)  # factory.cpu_pools on 16, 8 and 4 cores against one shared pool that sleeps; ROUND tags a repeat
  R=${ROUND:-1}
  figures "int8-16-auto-r$R" env -- --tokens 200
  figures "int8-16-shared-r$R" env -- --threads 16 --tokens 200
  figures "int8-8-auto-r$R" taskset -c 0-7 -- --tokens 200
  figures "int8-8-shared-r$R" taskset -c 0-7 -- --threads 8 --tokens 200
  figures "int8-4-split-r$R" taskset -c 0-3 -- --threads 2 --llm-threads 2 --tokens 200
  figures "int8-4-shared-r$R" taskset -c 0-3 -- --threads 4 --tokens 200
  [ "$R" = 1 ] && figures "fp32-16-r$R" env -- --threads 16 --tokens 200 --quantize none ;;
int4)  # 16 cores: the opt-in 4-bit weights against the default int8, three rounds alternating
  for R in 1 2 3; do
    figures "int8-r$R" env -- --tokens 200
    figures "int4-r$R" env -- --tokens 200 --quantize int4
  done ;;
share)  # 16 cores: the LLM's share of the split, 8 + 8 (cpu_pools) against 6 + 10, three rounds
  for R in 1 2 3; do
    figures "t8-llm8-r$R" env -- --tokens 200
    figures "t6-llm10-r$R" env -- --threads 6 --llm-threads 10 --tokens 200
  done ;;
heads)  # 16 cores split: the LM head's pool spinning too, and a larger LLM share; against one shared pool
  for R in 1 2; do
    figures "int8-16-auto-r$R" env -- --tokens 200
    figures "int8-16-auto-headspin-r$R" env -- --tokens 200 --llm-spin
    figures "int8-16-t4-llm12-headspin-r$R" env -- --threads 4 --llm-threads 12 --tokens 200 --llm-spin
    figures "int8-16-shared-r$R" env -- --threads 16 --tokens 200
  done ;;
final16)  # the figures for docs/benchmarks/cpu.json: the engine as it ships (cpu_pools, finer windows, cropped
  # decoding) against the previous int8 engine (one shared pool, growth-2 windows, whole windows) and fp32
  for R in 1 2 3; do
    figures "ships-r$R" env -- --tokens 200
    figures "before-r$R" env -- --threads 16 --tokens 200 --schedule 4,12,2,96 --no-crop
    figures "fp32-r$R" env -- --threads 16 --tokens 200 --quantize none
    figures "ships-long-r$R" env -- --tokens 600
  done ;;
esac
echo "done at $(( $(date +%s) - T0 )) s"
