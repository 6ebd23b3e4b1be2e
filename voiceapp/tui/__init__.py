"""Provides the Textual TUI (`voicectl tui`): type text, hear it, watch live metrics and the history."""
