#!/usr/bin/env bash
# Device call: `voicectl say` through a warm server on a GPU host, with this tree's bytecode compiled first, as an
# installed package has it (pip compiles at install; the lent machine sets PYTHONDONTWRITEBYTECODE, so without this
# every launch compiled our modules from source), beside the host's own floor (`python3 -c pass` and what its site
# imports). No vLLM: the graph lane serves one listener. The synthetic full Spark checkpoint (FAMILY=orpheus:
# Orpheus's); carry [".devcarry/vllm-extra/deps.tar.xz"]. Writes $OUT/floor.txt, $OUT/say.json and $OUT/say.log.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
t0=$(date +%s)
if [ ! -f /tmp/site/soundfile.py ]; then
  mkdir -p /tmp/site && tar xJf .devcarry/vllm-extra/deps.tar.xz -C /tmp/site || exit 4
fi
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
python3 -m compileall -q -j 0 engine voiceapp lab > /dev/null
if [ "${FAMILY:-spark}" = orpheus ]; then
  MODEL=${TMPDIR:-/tmp}/voiceapp-orpheus-full WRITER=engine.families.orpheus.synthetic
else
  MODEL=${TMPDIR:-/tmp}/voiceapp-gpu-model WRITER=engine.synthetic
fi
[ -f "$MODEL/config.json" ] || [ -f "$MODEL/config.yaml" ] || python3 -c "import sys; from $WRITER import write_checkpoint; write_checkpoint(sys.argv[1], size='full', seed=0)" "$MODEL" || exit 5
echo "model ready at $(( $(date +%s) - t0 )) s"
{
  for _ in 1 2 3 4 5; do /usr/bin/time -f "python3 -c pass: %e s" python3 -c pass; done
  for _ in 1 2 3; do /usr/bin/time -f "python3 -S -c pass: %e s" python3 -S -c pass; done
  echo "site's own imports (us, cumulative), then the lean say path's:"
  python3 -X importtime -c pass 2>&1 | sort -t'|' -k2 -n | tail -4
  python3 -X importtime -c "import voiceapp.cli, voiceapp.cli.lean_say" 2>&1 | sort -t'|' -k2 -n | tail -6
} > "$OUT/floor.txt" 2>&1
timeout "${SAY_S:-300}" python3 -m lab.startup --model "$MODEL" --cases say_autostart --repeats "${SAY_REPEATS:-5}" \
    --timeout 280 --json "$OUT/say.json" > "$OUT/say.log" 2>&1
echo "say: exit $? at $(( $(date +%s) - t0 )) s"; tail -15 "$OUT/say.log"; cat "$OUT/floor.txt"
