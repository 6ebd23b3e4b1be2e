#!/usr/bin/env bash
# Device call on a 2-GPU machine: two lab jobs at once, one per GPU, each with an $OUT of its own that comes back
# as one archive ($OUT/NAME.tar.gz, since a call returns at most eight files). Each job runs in a copy of the tree:
# a variant patches files that the other job's processes would import.
#   bash lab/gpu_pair.sh NAME0 'COMMAND0' NAME1 'COMMAND1'
# Each job gets PAIR_S seconds (570), so that both archives come back inside the call's ten minutes.
# e.g. bash lab/gpu_pair.sh variants 'bash lab/gpu_crowd_variants.sh base busy32' load 'bash lab/gpu_load.sh'
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
run_on() {  # GPU NAME COMMAND: in a copy of the tree of its own, since variants patch files as they run
  local dir=/tmp/pair-$2 tree=/tmp/tree-$2; rm -rf "$dir" "$tree"; mkdir -p "$dir"; cp -r . "$tree"
  (cd "$tree" && export CUDA_VISIBLE_DEVICES=$1 OUT=$dir && timeout "${PAIR_S:-570}" bash -c "$3" > "$dir/stdout.txt" 2>&1
   echo "rc=$?" >> "$dir/stdout.txt")
  tar czf "$OUT/$2.tar.gz" -C /tmp "pair-$2"
}
run_on 0 "$1" "$2" & A=$!

run_on 1 "$3" "$4" & B=$!
wait $A $B
for n in "$1" "$3"; do echo "=== $n"; tail -25 "/tmp/pair-$n/stdout.txt"; done
