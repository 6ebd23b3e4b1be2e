"""Provides the audio outputs front ends share: atomic WAV files, audiobook containers (FFmpeg) and the lean
speaker of a `say` through a warm server."""
