"""Provides the voiceapp engine: Spark-TTS model loading, token generation, BiCodec decode and streaming synthesis.

Pure modules (text, prompt, tokens, windowing, crossfade, ringbuffer, events, errors, config) import no torch,
vLLM, sounddevice or Textual; device shells live in `engine.backends` and are chosen only by `engine.factory`.
"""
