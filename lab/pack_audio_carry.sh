#!/usr/bin/env bash
# Packs this Debian machine's PulseAudio, speech-dispatcher, PortAudio and ALSA's pulse plugin, with the shared
# libraries they load (not glibc's own), and the sounddevice wheel, into .devcarry/audio/ for lab/gpu_speechd.sh:
# the lent GPU machines have no sound stack and no network. Run here, from the repository's root, once.
set -eu
dest=.devcarry/audio
rm -rf "$dest" && mkdir -p "$dest"
pkgs="pulseaudio pulseaudio-utils speech-dispatcher libspeechd2 libportaudio2 libasound2 libasound2-data libpulse0"
list=$(mktemp)
dpkg -L $pkgs | sort -u | while read -r f; do if [ -f "$f" ] || { [ -L "$f" ] && [ ! -d "$f" ]; }; then echo "$f"; fi; done > "$list"
# Of ALSA's extra plugins only the pulse ones (the others pull FFmpeg and JACK).
dpkg -L libasound2-plugins | grep -E 'pulse|alsa.conf.d' | while read -r f; do if [ -f "$f" ]; then echo "$f"; fi; done >> "$list"
glibc='^(libc|libm|libpthread|libdl|librt|ld-linux-x86-64|libgcc_s|libstdc\+\+|libresolv|libutil)\.so'
while read -r f; do
  if [ -L "$f" ] || ! head -c4 "$f" 2>/dev/null | grep -q ELF; then continue; fi
  ldd "$f" 2>/dev/null | awk '/=> \//{print $3}' || true
done < "$list" | sort -u | while read -r lib; do
  if basename "$lib" | grep -Eq "$glibc"; then continue; fi
  echo "$lib"; real=$(readlink -f "$lib"); if [ "$real" != "$lib" ]; then echo "$real"; fi
done >> "$list"
# /lib is /usr/lib on both systems (merged /usr): name every file under usr/, once.
sed -E 's,^/(lib|bin|sbin)/,/usr/\1/,; s,^/,,' "$list" | sort -u > "$list.rel"
tar cJf "$dest/audio.tar.xz" -C / -T "$list.rel"
rm -f "$list.rel"
python3 -m pip download -q --no-deps --only-binary :all: -d "$dest" sounddevice==0.5.6
echo "$(wc -l < "$list") files; $(du -sh "$dest" | cut -f1) in $dest"
rm -f "$list"
