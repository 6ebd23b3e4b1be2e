#!/usr/bin/env bash
# Device call: lab/gpu_load_phases.sh on the tree and on a copy of it with an engine change reversed, one after the
# other on one machine, so the two compare within a run. PATCH (default .devcarry/ab.patch, carried: `git diff
# BEFORE AFTER -- engine > .devcarry/ab.patch`) is the change. RATES, SECONDS_PER_RATE, SEEDS, VARIANTS as
# gpu_load_phases.sh. Writes $OUT/after/ and $OUT/before/.
#   run (carry [".devcarry/vllm-extra/deps.tar.xz", ".devcarry/ab.patch"]): bash lab/gpu_phases_ab.sh
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
PATCH=$(realpath "${PATCH:-.devcarry/ab.patch}")
rm -rf /tmp/before && mkdir -p /tmp/before \
    && tar -C "$PWD" --exclude=./.devcarry/vllm-core -cf - . | tar -C /tmp/before -xf - \
    && (cd /tmp/before && patch -p1 -R -s < "$PATCH") || exit 5
for side in after before; do
  dir=$PWD; [ $side = before ] && dir=/tmp/before
  echo "== $side"
  (cd "$dir" && OUT=$OUT/$side bash lab/gpu_load_phases.sh)
done
