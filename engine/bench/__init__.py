"""Provides the benchmark behind `voicectl bench` (our pipeline at 1..128 concurrent streams) and the lab's
`python -m lab.bench` (decoder precision/seams/speed, and the upstream reference pipeline (spark_tts_lib) on the
same checkpoint).

Random weights never emit the stop token and sample all over the vocabulary, so every sentence is forced to a
fixed token count: `FixedLengthGenerator` removes the stop ids from the allowed ids and sets max_tokens (the
LLM then does exactly the same work per sentence in every run); the reference gets max/min_new_tokens and the
same restriction to semantic ids (see `reference_pipeline`).

Metrics (per stream = one request of `sentences` sentences):
- TTFA: request start -> first audio chunk yielded by `Synthesizer.synthesize` (samples ready to play).
- steady RTF: (last chunk time - first chunk time) / (audio after the first chunk); <1 is faster than real time.
- underruns: a virtual copy of our player per stream (`simulate_player`) starts once it holds `preroll_s` of
  audio and plays at real time; each moment it runs out before the last chunk is one underrun (it then waits for
  `preroll_s` of audio again). `max_realtime_streams` counts on it, at levels whose streams were also made at RTF
  <= 0.5 (`max_streams_0_underruns`: on it alone). The stricter fixed-delay player of the
  earliest runs (`simulate_playback`: starts `preroll_s` after the first chunk, whatever it holds) is reported
  beside it.
- onset: when that player starts playing (TTFA plus the wait for the pre-roll): the first sound a user hears.
- lane GPU busy / idle: the graph lane's GPU time in the level, and the time its stream sat empty between two
  launches while it had streams (the host late with the next launch, not the GPU slow with the last).
- GC: full runs of Python's cyclic garbage collector during the level, and the longest run of any generation.

Modules, one concern each: `generator` (the fixed workload), `playback` (the listener simulations), `summary`
(a level's numbers, the headline and table), `levels` (running one level), `decoder` (the decoder on its own),
`reference` (the upstream pipeline), `run` (the whole benchmark and its variants) and `load` (the open-loop
load test's arrivals, listener and numbers, `voicectl bench --load`; not re-exported). This package re-exports
what `voicectl bench`, the lab scripts and the tests use. Pure apart from the functions that load models
(torch, spark_tts_lib and vLLM are imported inside them).
"""
from engine.bench.decoder import (call_times, decoder_accuracy, decoder_algorithms, decoder_snake, decoder_speed,
                                  rel_error, stream_decode)
from engine.bench.generator import BENCH_GLOBALS, SENTENCE, FixedLengthGenerator, TokenTimes
from engine.bench.levels import DecodeLog, measure_level, run_streams
from engine.bench.playback import Playback, StreamRecord, simulate_playback, simulate_player
from engine.bench.reference import reference_pipeline
from engine.bench.run import STREAM_LEVELS, BenchOptions, Variant, device_name, run_pipeline_bench, write_voice
from engine.bench.summary import WINDOWS_REPORTED, LevelResult, format_table, headline, percentile, summarize

__all__ = ["BENCH_GLOBALS", "SENTENCE", "STREAM_LEVELS", "WINDOWS_REPORTED", "BenchOptions", "DecodeLog",
           "FixedLengthGenerator", "LevelResult", "Playback", "StreamRecord", "TokenTimes", "Variant",
           "call_times", "decoder_accuracy", "decoder_algorithms", "decoder_snake", "decoder_speed", "device_name",
           "format_table", "headline", "measure_level", "percentile", "reference_pipeline", "rel_error",
           "run_pipeline_bench", "run_streams", "simulate_playback", "simulate_player", "stream_decode",
           "summarize", "write_voice"]
