#!/bin/sh
# Installs what real-playback tests (PortAudio + a private PulseAudio null sink, parec), the TUI tmux
# test and the speech-dispatcher module's tests (the daemon, sd_generic and spd-say) need. Idempotent:
# apt-get skips packages already installed. Needs root (or sudo) and apt.
set -eu

PACKAGES="libportaudio2 pulseaudio pulseaudio-utils libasound2-plugins sox tmux speech-dispatcher"

if [ "$(id -u)" -eq 0 ]; then SUDO=""; else SUDO="sudo"; fi

missing=""
for p in $PACKAGES; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -z "$missing" ]; then
    echo "audio-setup: all present ($PACKAGES)"
    exit 0
fi

echo "audio-setup: installing$missing"
$SUDO apt-get update
# shellcheck disable=SC2086
$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $missing
