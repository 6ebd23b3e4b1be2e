"""Provides device shells: token generators, the BiCodec decoder and audio sinks (import torch/vLLM/sounddevice)."""
