"""Provides the TUI's widgets, one per module."""
