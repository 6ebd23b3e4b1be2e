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
# NAME:FLAG,FLAG,...[:VAR=VALUE]. Run 44 (docs/lab/run-log.md): the test's case and `fresh` fault or stop; the
# tuning thread sits in cuKernelGetFunction (cuDNN loading a new shape's kernels in an eager warm-up) while the live
# thread waits on its graph's replay. Default: those two cases, then the same with the warm-ups kept apart from the
# live decodes (the candidate fix), then everything apart (passed 2 of 2 in run 44).
CASES=${CASES:-"test:--live,--eager-first fresh:--live warm:--live,--eager-first,--apart,warmups warmfresh:--live,--apart,warmups warm2:--live,--eager-first,--apart,warmups all:--live,--eager-first,--apart,all"}
for case in $CASES; do
  name=${case%%:*}; rest=${case#*:}; flags=${rest%%:*}; flags=${flags//,/ }
  envs=(); [ "$rest" != "${rest#*:}" ] && envs=("${rest#*:}")
  echo "== $name ($flags${envs[*]:+; ${envs[*]}})"
  env "${envs[@]}" timeout 150 python3 -m lab.capture_hang_probe --model "$MODEL" --json "$OUT/$name.json" \
      --timeout "${PROBE_TIMEOUT:-60}" $flags > "$OUT/$name.txt" 2>&1
  echo "rc=$?"; tail -3 "$OUT/$name.txt"
done
