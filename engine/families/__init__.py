"""Provides the model families behind the engine's seam, one self-contained folder each."""
