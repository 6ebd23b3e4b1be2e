#!/usr/bin/env bash
# Device harness (run with carry [".devcarry/vllm-extra"]; no vLLM needed): the CPU engine on the lent machine's
# CPU with CUDA hidden, and, with PART=say, the say-through-a-warm-server start-up case on its GPU.
#   PART=say   voicectl bench --startup --cases import_torch,say_autostart on the GPU (issue 22's client figure)
#   PART=cpu16 the CPU engine on all cores: decoder variants (lab.cpu_decoder_probe) and the pipeline
#              (lab.cpu_figures) with int8 and fp32 LLM weights
#   PART=cpu2  the same pinned to two cores (taskset -c 0,1), with the variants that decide the CPU defaults
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
say)
  python3 -m voiceapp.cli bench --startup --model "$MODEL" --cases import_torch,say_autostart --repeats 3 \
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
esac
echo "done at $(( $(date +%s) - T0 )) s"
