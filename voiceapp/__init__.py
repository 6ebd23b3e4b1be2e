"""Provides the voiceapp front ends, a package each: the voicectl CLI (`cli`), the Textual TUI (`tui`), the engine
server and its clients (`server`), the APIs a server adds (`http`, `wyoming`), speech-dispatcher's output module
(`speechd`) and the audio files they write (`audio`); `common`, `limits` and `lockfile` are shared."""
