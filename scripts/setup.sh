#!/usr/bin/env bash
# Sets up a development checkout from scratch: system audio/terminal packages (when root with apt),
# a virtual environment in .venv, CPU PyTorch, the project with its dev extras, and the upstream
# reference (spark-tts-lib, installed without its dependencies: it declares torchaudio, which pins
# an older torch; the tests only use its decode modules, which need none of that).
#
#   bash scripts/setup.sh [--test [PYTEST ARGS]]
#
# --test then runs the test suite (pytest's own arguments may follow): the one command CI runs (.ci/run).
set -euo pipefail
cd "$(dirname "$0")/.."
run_tests=0
if [ "${1:-}" = --test ]; then run_tests=1; shift; fi

if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  bash .ci/audio-setup.sh
fi

python3 -m venv .venv
py=.venv/bin/python
$py -m pip install -q --upgrade pip
# CPU build unless a torch is already there (a GPU machine brings its own CUDA torch).
torch="torch==2.13.0"
$py -c 'import torch' 2>/dev/null && torch=""
# One resolve for everything. --no-compile: pip would byte-compile every module of torch, Ray and triton; Python
# compiles (and caches) only the ones imported. The Ray extra too: its tests run in CI.
# shellcheck disable=SC2086
$py -m pip install -q --no-compile $torch -e '.[dev,ray]'
$py -m pip install -q --no-compile --no-deps "spark-tts-lib==0.2.1"
$py -c 'import engine, voiceapp, torch; print("voiceapp dev setup ok: torch", torch.__version__)'
echo "voicectl is .venv/bin/voicectl (or: source .venv/bin/activate)"
if [ "$run_tests" = 1 ]; then
  # three workers (pytest-xdist) on CI's two cores: most of the suite waits on real time (audio at 1x, servers,
  # subprocesses), so a third worker fills the cores while the others wait; --dist loadgroup keeps each xdist_group
  # on one worker, and tests marked `serial` run alone (tests/conftest.py). Pytest arguments that follow override
  # these (-n 0: one process).
  exec "$py" -m pytest -n 3 --dist loadgroup "$@"
fi
