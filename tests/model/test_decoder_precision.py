"""A bf16 CPU decoder against fp32 on the tiny checkpoint: within the SNR bound (and a coarser decoder is not);
streaming in bf16 adds no error beyond bf16's own; the engine picks bf16 only where the CPU multiplies it natively
and the user did not ask for full precision; a GPU streams in the family's precision and exports in fp32."""
import numpy as np
import pytest
import torch

from engine.backends.base import DecodeItem
from engine.backends.bicodec import BiCodecDecoder
from lab.decoder_agreement import TINY_BOUND_DB, compare, random_items
from engine.config import SamplingOptions, SynthesisRequest
from engine.crossfade import fade_edges
from engine.cpu_pools import cpu_decodes_bf16, cpu_decoder_dtype
from engine.errors import GenerationError
from engine.events import Notice
from engine.factory import EngineConfig, build_synthesizer, full_precision_if_lost, gpu_decoder_dtype
from engine.families.orpheus import OrpheusFamily
from engine.families.spark import SparkFamily
from engine.pipeline import sentence_seed
from engine.prompt import build_globals_prompt
from engine.seams import seam_error_db
from engine.tokens import parse_all

STREAM_MARGIN_DB = 3.0
"""How much worse than a bf16 one-shot decode (against fp32) a bf16 stream (against that one-shot) may be."""


@pytest.fixture(scope="module")
def decoders(tiny_model):
    path = tiny_model / "BiCodec"
    return (BiCodecDecoder(path, device="cpu", num_threads=2),
            BiCodecDecoder(path, device="cpu", dtype=torch.bfloat16, num_threads=2))


def items(decoder, count=4, codes=150):
    return random_items(count, codes, decoder.codebook_size, decoder.global_count, decoder.global_codebook)


def test_bf16_is_within_the_bound_one_shot_and_in_windows(decoders):
    fp32, bf16 = decoders
    whole = items(fp32)
    windows = [DecodeItem(i.codes[:44], i.global_tokens, 16, 28) for i in whole]
    for agreement in (compare(fp32, bf16, whole), compare(fp32, bf16, windows)):
        assert agreement.within(TINY_BOUND_DB), agreement
        assert agreement.snr_db_min < 80  # it is bf16 (fp32 against itself would be exact)


def test_a_coarser_decoder_fails_the_bound(tiny_model, decoders):
    fp32, _ = decoders
    coarse = BiCodecDecoder(tiny_model / "BiCodec", device="cpu", num_threads=2)
    with torch.no_grad():  # the upsampling decoder's weights on a 6-bit grid
        for name, p in coarse.model.named_parameters():
            if p.dim() >= 2 and name.startswith("decoder."):
                step = p.abs().max() / 31
                p.copy_((p / step).round() * step)
    assert not compare(fp32, coarse, items(fp32)).within(TINY_BOUND_DB)
    assert compare(fp32, fp32, items(fp32)).snr_db_min == float("inf")


async def test_streaming_in_bf16_adds_nothing_beyond_bf16s_own_error(tiny_model, tmp_path, decoders):
    fp32, _ = decoders
    synth = build_synthesizer(EngineConfig(model=str(tiny_model), backend="torch", threads=2, decoder_dtype="bf16",
                                           cache_dir=str(tmp_path)))
    assert synth.decoder.dtype == torch.bfloat16
    req = SynthesisRequest("Streaming must match the offline decode.", voice="leo",
                           options=SamplingOptions(seed=11, max_tokens=150))
    streamed = np.concatenate([c.samples async for c in synth.synthesize(req)])
    globals_ = await synth.voice_globals("leo")
    prompt = build_globals_prompt(req.text, globals_, synth.grammar.token_ids, synth.grammar.encode)
    opts = SamplingOptions(seed=sentence_seed(11, 0), max_tokens=150)
    codes, _ = parse_all([t async for d in synth.generator.stream(prompt, opts, "x") for t in d], synth.grammar.token_ids)
    fade = int(synth.join.fade_s * synth.sample_rate)
    item = [DecodeItem(tuple(codes), globals_)]
    (one_bf16,), (one_fp32,) = synth.decoder.decode(item), fp32.decode(item)
    one_bf16, one_fp32 = fade_edges(one_bf16, fade, fade), fade_edges(one_fp32, fade, fade)
    own = seam_error_db(one_bf16, one_fp32)
    assert seam_error_db(streamed, one_bf16) <= own + STREAM_MARGIN_DB
    await synth.close()


@pytest.mark.parametrize("quantize, asked, native, want", [
    ("auto", "auto", True, "bf16"), ("int8", "auto", True, "bf16"), ("none", "auto", True, "fp32"),
    ("auto", "auto", False, "fp32"), ("auto", "fp32", True, "fp32"), ("none", "bf16", False, "bf16"),
])
def test_the_cpu_decoder_precision_follows_the_cpu_and_the_users_choice(monkeypatch, quantize, asked, native,
                                                                         want):
    monkeypatch.setattr("engine.cpu_pools.cpu_decodes_bf16", lambda: native)
    assert cpu_decoder_dtype(EngineConfig(quantize=quantize, decoder_dtype=asked)) == want
    assert isinstance(cpu_decodes_bf16(), bool)


def test_fp16_is_closer_to_fp32_than_bf16_one_shot_and_in_windows(tiny_model, decoders):
    """fp16 (the option for a GPU decoder that must go faster than fp32) keeps 3 more mantissa bits than bf16: its
    error against fp32 is well below bf16's, whole or in windows."""
    fp32, bf16 = decoders
    fp16 = BiCodecDecoder(tiny_model / "BiCodec", device="cpu", dtype=torch.float16, num_threads=2)
    whole = items(fp32)
    windows = [DecodeItem(i.codes[:44], i.global_tokens, 16, 28) for i in whole]
    for batch in (whole, windows):
        half, brain = compare(fp32, fp16, batch), compare(fp32, bf16, batch)
        assert half.within(TINY_BOUND_DB), half
        assert half.snr_db_min > brain.snr_db_min + 10, (half, brain)


@pytest.mark.parametrize("family, asked, deterministic, want", [
    (SparkFamily, "auto", False, "fp16"), (SparkFamily, "auto", True, "fp32"), (SparkFamily, "bf16", True, "bf16"),
    (OrpheusFamily, "auto", False, "fp32"), (OrpheusFamily, "fp16", False, "fp16"),
])
def test_the_gpu_decoder_streams_in_the_familys_precision_and_exports_in_fp32(family, asked, deterministic, want):
    assert gpu_decoder_dtype(EngineConfig(decoder_dtype=asked, deterministic=deterministic), family()) == want


def test_a_lower_precision_that_overflows_on_the_checkpoint_gives_way_to_fp32(tiny_model):
    """fp16 whose probe window decodes to NaN or inf (a checkpoint whose activations pass 65,504) is replaced by an
    fp32 decoder, said once; one that decodes it to finite audio is kept."""
    class Overflowing:
        def decode(self, items):
            raise GenerationError("the decoder produced non-finite audio (NaN/inf)")

    built, events = [], []
    fp16 = BiCodecDecoder(tiny_model / "BiCodec", device="cpu", dtype=torch.float16, num_threads=2)
    probe = DecodeItem(tuple(range(40)), tuple([0] * fp16.global_count))
    kept = full_precision_if_lost(fp16, "fp16", lambda p: built.append(p), probe, events.append)
    assert kept == (fp16, "fp16") and built == [] and events == []
    decoder, dtype = full_precision_if_lost(Overflowing(), "fp16", lambda p: built.append(p) or p, probe,
                                            events.append)
    assert (decoder, dtype, built) == ("fp32", "fp32", ["fp32"])
    assert len(events) == 1 and isinstance(events[0], Notice) and "fp16 overflows" in events[0].message


async def test_an_engine_takes_fp16_by_name_and_refuses_an_unknown_precision(tiny_model, tmp_path):
    synth = build_synthesizer(EngineConfig(model=str(tiny_model), backend="torch", threads=2, decoder_dtype="fp16",
                                           cache_dir=str(tmp_path)))
    try:
        assert synth.decoder.dtype == torch.float16
    finally:
        await synth.close()
    with pytest.raises(ValueError, match="unknown decoder dtype 'fp8'"):
        EngineConfig(model=str(tiny_model), decoder_dtype="fp8")
