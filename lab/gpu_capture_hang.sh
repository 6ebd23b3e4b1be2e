#!/usr/bin/env bash
# Device call: where a background decoder capture beside live decodes stops (lab/capture_hang_probe.py; run 42's
# GPU test hung in capture_graph's stream.synchronize()). Runs the probe once per case of $CASES, each in a fresh
# process with its own limit; a stuck case leaves its threads' Python and native stacks (py-spy, from a wheel in
# .whl2) in $OUT/CASE.json.
#   run (carry [".devcarry/vllm-extra/deps.tar.xz", ".whl2"]): bash lab/gpu_capture_hang.sh
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
[ -d /tmp/site/yaml ] || { mkdir -p /tmp/site && tar xJf .devcarry/vllm-extra/deps.tar.xz -C /tmp/site; } || exit 4
pip install -q --no-deps --target /tmp/spy .whl2/py_spy-*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/spy/bin:$PATH PYTHONUNBUFFERED=1
MODEL=${MODEL:-/tmp/voiceapp-gpu-model}
[ -f "$MODEL/config.yaml" ] || python3 -c "import sys; from engine.synthetic import write_checkpoint; write_checkpoint(sys.argv[1], size='full', seed=0)" "$MODEL"
# NAME:FLAG,FLAG,...[:VAR=VALUE]: the test's case first, then one switch off at a time, then a server's order (a
# foreground capture first), then the test's case with CUDA's modules loaded up front (is it lazy loading, a kernel
# first needed by the capture's warm-ups while the other thread decodes?)
CASES=${CASES:-"test:--live,--eager-first quiet:--eager-first fresh:--live fp16:--live,--eager-first,--dtype,fp16 server:--live,--foreground-first,--dtype,fp16 eagerload:--live,--eager-first:CUDA_MODULE_LOADING=EAGER"}
for case in $CASES; do
  name=${case%%:*}; rest=${case#*:}; flags=${rest%%:*}; flags=${flags//,/ }
  envs=(); [ "$rest" != "${rest#*:}" ] && envs=("${rest#*:}")
  echo "== $name ($flags${envs[*]:+; ${envs[*]}})"
  env "${envs[@]}" timeout 150 python3 -m lab.capture_hang_probe --model "$MODEL" --json "$OUT/$name.json" \
      --timeout 60 $flags > "$OUT/$name.txt" 2>&1
  echo "rc=$?"; tail -3 "$OUT/$name.txt"
done
