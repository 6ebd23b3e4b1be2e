"""Provides the voiceapp front ends: the voicectl CLI and the Textual TUI."""
