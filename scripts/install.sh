#!/usr/bin/env bash
# Installs voicectl for a user from this checkout: its own virtual environment, PyTorch (the CPU build where no
# NVIDIA GPU is found), the app without test extras (with its transformers extra where a GPU is), and a `voicectl`
# link in a bin folder; then fetches the default Spark-TTS checkpoint unless one is found, and says "Hello". The app
# is installed editable: it runs from this checkout (assets/ holds the voice presets), so keep the checkout there.
#
# A plain venv and a link rather than pipx or `uv tool`: those would take torch from the package index's default
# build, which on Linux x86_64 is the CUDA one (gigabytes a CPU user never runs), and torch must come first.
#
#   bash scripts/install.sh [--dry-run] [--no-model] [--no-say] [--venv DIR] [--bin DIR]
#
# --dry-run prints each step's command and changes nothing. VOICEAPP_TORCH_INDEX=URL adds a package index for the
# torch step (where pip's own sources have no CPU build of torch, give PyTorch's CPU wheel index).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

# The torch release the tests run on (scripts/setup.sh installs the same).
TORCH_VERSION=2.13.0

dry_run=0
fetch_model=1
say_hello=1
venv="${XDG_DATA_HOME:-$HOME/.local/share}/voiceapp/venv"
bin_dir="$HOME/.local/bin"
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) dry_run=1 ;;
    --no-model) fetch_model=0 ;;
    --no-say) say_hello=0 ;;
    --venv) venv="${2:?--venv needs a directory}"; shift ;;
    --bin) bin_dir="${2:?--bin needs a directory}"; shift ;;
    -h|--help) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "install: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done

say() { echo "install: $*"; }
step() {
  if [ "$dry_run" = 1 ]; then echo "+ $*"; else "$@"; fi
}

python_ok() {
  python3 -c 'import sys; sys.exit(sys.version_info < (3, 10))' 2>/dev/null
}

has_nvidia_gpu() {
  command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU'
}

# The torch requirement: the CUDA build where a GPU is, else the CPU build. Only Linux x86_64 has both under one
# version number; elsewhere the index's build is the CPU one already.
torch_requirement() {
  if has_nvidia_gpu; then
    echo "torch==$TORCH_VERSION"
  elif [ "$(uname -s)" = Linux ] && [ "$(uname -m)" = x86_64 ]; then
    echo "torch==$TORCH_VERSION+cpu"
  else
    echo "torch==$TORCH_VERSION"
  fi
}

# What pip installs of this checkout: on a GPU, with the transformers extra (the LLM's forward there, where vLLM is
# absent); a CPU reads the checkpoint without it (pyproject.toml)
app_requirement() {
  if has_nvidia_gpu; then echo "$root[transformers]"; else echo "$root"; fi
}

python_ok || { echo "install: needs python3 3.10 or newer on PATH" >&2; exit 1; }
torch_req=$(torch_requirement)
case "$torch_req" in
  *+cpu) say "no NVIDIA GPU found: the CPU build of PyTorch ($torch_req)" ;;
  *) say "PyTorch: $torch_req" ;;
esac
torch_index=()
[ -n "${VOICEAPP_TORCH_INDEX:-}" ] && torch_index=(--extra-index-url "$VOICEAPP_TORCH_INDEX")
py="$venv/bin/python"

say "into $venv, with voicectl linked in $bin_dir"
step python3 -m venv "$venv"
# --no-compile: pip would byte-compile every module it installs, a fifth of the venv (docs/performance.md);
# Python compiles, and caches, only the modules a run imports
step "$py" -m pip install -q --no-compile --upgrade pip
if ! step "$py" -m pip install -q --no-compile "${torch_index[@]}" "$torch_req"; then
  # pip's sources may hold only the default build (PyPI has no +cpu one): that one runs on a CPU too, only larger
  [ "$torch_req" = "torch==$TORCH_VERSION+cpu" ] || { echo "install: pip could not install $torch_req (above)" >&2; exit 1; }
  say "no CPU build of PyTorch in pip's package sources: the default build instead (larger: it brings CUDA" \
      "libraries; VOICEAPP_TORCH_INDEX set to PyTorch's CPU wheel index gives the smaller one)"
  step "$py" -m pip install -q --no-compile "torch==$TORCH_VERSION" \
    || { echo "install: pip could not install torch==$TORCH_VERSION either (above)" >&2; exit 1; }
fi
# The wheel ships libtorch's own C++ unit tests (gtest programs: torch/test, torch/bin/test_*, torch/bin/*Test), a
# seventh of the CPU venv (docs/performance.md); no Python code runs them, and pip uninstalls torch without them.
# Without a GPU its C++ headers go too: they serve only compiling (torch.compile, C++ extensions), and the app
# compiles on a GPU alone (the graph lane)
torch_dir=("$venv"/lib/python3*/site-packages/torch)
step rm -rf "${torch_dir[0]}/test" "${torch_dir[0]}"/bin/test_* "${torch_dir[0]}"/bin/*Test
has_nvidia_gpu || step rm -rf "${torch_dir[0]}/include"
step "$py" -m pip install -q --no-compile -e "$(app_requirement)"
step mkdir -p "$bin_dir"
step ln -sf "$venv/bin/voicectl" "$bin_dir/voicectl"
[ "$dry_run" = 1 ] && exit 0

voicectl="$bin_dir/voicectl"
"$voicectl" --help >/dev/null
case ":$PATH:" in
  *":$bin_dir:"*) say "voicectl is on your PATH" ;;
  *) say "voicectl is in $bin_dir, which is not on your PATH: add it with" \
         "export PATH=\"$bin_dir:\$PATH\" (in ~/.profile to keep it)" ;;
esac

if [ "$fetch_model" = 1 ] && ! "$voicectl" model info >/dev/null 2>&1; then
  say "fetching the default checkpoint, Spark-TTS-0.5B (its licence is non-commercial)"
  # download_model's failure is one line that names the offline way (a copied checkpoint, or a synthetic one)
  "$voicectl" model download || { say "installed without a model; voicectl say needs one (see above)"; exit 0; }
fi
if [ "$say_hello" = 1 ]; then
  say 'voicectl say "Hello"'
  "$voicectl" say "Hello" || say "installed, but voicectl say did not speak (see the line above)"
fi
