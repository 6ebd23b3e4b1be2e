"""Our SNAC decoder against the `snac` package, its position-keyed noise, windowed decoding and strict loading."""
from __future__ import annotations

import math
import pickle
import shutil

import numpy as np
import pytest
import torch

from engine.backends.base import CodecDecoder, DecodeItem
from engine.errors import GenerationError, ModelFormatError
from engine.families.orpheus import grammar as g
from engine.families.orpheus.snac import (
    IGNORED_KEYS, SnacDecoder, context_windows, measure_context_table, position_noise,
)
from engine.seams import seam_error_db

snac = pytest.importorskip("snac", reason="the reference SNAC (dev extra) is the oracle here")


def random_frames(n: int, seed: int = 0) -> tuple[tuple[int, ...], ...]:
    rng = np.random.default_rng(seed)
    return tuple(tuple(int(c) for c in rng.integers(0, g.CODEBOOK, g.FRAME_TOKENS)) for _ in range(n))


FRAMES = random_frames(14)


def reference(snac_dir, noise_seed: int | None):
    """The package's SNAC on the same files; its NoiseBlocks draw our position noise (or none)."""
    model = snac.SNAC.from_config(str(snac_dir / "config.json"))
    model.load_state_dict(torch.load(snac_dir / "pytorch_model.bin", weights_only=True), strict=True)
    for index, layer in enumerate(model.decoder.model):
        if isinstance(layer, snac.layers.DecoderBlock):
            block = layer.block[2]
            assert type(block).__name__ == "NoiseBlock"

            def forward(x, index=index, block=block):
                if noise_seed is None:
                    return x
                starts = torch.zeros(x.shape[0], dtype=torch.long)
                return x + position_noise(noise_seed, index, starts, x.shape[-1], x.dtype) * block.linear(x)

            block.forward = forward
    return model.eval()


def reference_audio(model, frames) -> np.ndarray:
    with torch.inference_mode():
        return model.decode([torch.tensor([row]) for row in g.split_levels(frames)])[0, 0].numpy()


@pytest.mark.parametrize("noise", [False, True])
def test_matches_the_snac_package_within_1e_4(snac_tiny, snac_decoder, noise):
    ours = snac_decoder if noise else SnacDecoder(snac_tiny, noise=False)
    ref = reference_audio(reference(snac_tiny, 0 if noise else None), FRAMES)
    out = ours.decode([DecodeItem(FRAMES, ())])[0]
    assert out.dtype == np.float32 and out.shape == (len(FRAMES) * 2048,)
    assert float(np.abs(out - ref).max()) <= 1e-4  # measured: docs/orpheus.md
    assert float(np.sqrt(np.mean(ref ** 2))) > 0.01  # not silence


def test_noise_is_keyed_on_absolute_position_and_seed(snac_tiny, snac_decoder):
    full = snac_decoder.decode([DecodeItem(FRAMES, ())])[0]
    k, guard = 6, 3 * 2048  # a window from frame 6 on; skip its first 3 frames (edge effects of its padding)
    keyed = snac_decoder.decode([DecodeItem(FRAMES[k:], (), start=k)])[0]
    unkeyed = snac_decoder.decode([DecodeItem(FRAMES[k:], (), start=0)])[0]
    tail = full[k * 2048 + guard:]
    assert np.abs(keyed[guard:] - tail).max() < 1e-5
    assert np.abs(unkeyed[guard:] - tail).max() > 1e-3
    other_seed = SnacDecoder(snac_tiny, seed=1).decode([DecodeItem(FRAMES, ())])[0]
    quiet = SnacDecoder(snac_tiny, noise=False).decode([DecodeItem(FRAMES, ())])[0]
    assert np.abs(other_seed - full).max() > 1e-3 and np.abs(quiet - full).max() > 1e-3
    again = snac_decoder.decode([DecodeItem(FRAMES, ())])[0]
    assert np.array_equal(again, full)


def test_position_noise_is_standard_normal_and_shift_invariant():
    z = position_noise(7, 2, torch.tensor([0, 1000]), 100_000, torch.float32)
    assert z.shape == (2, 1, 100_000)
    flat = z[0, 0].double()
    assert abs(float(flat.mean())) < 0.02 and abs(float(flat.std()) - 1) < 0.02
    assert torch.equal(z[0, 0, 1000:], z[1, 0, :-1000])
    assert not torch.equal(z[0], position_noise(7, 3, torch.tensor([0]), 100_000, torch.float32)[0])


def test_windowed_decode_with_three_frames_of_context_matches_one_shot(snac_decoder):
    full = snac_decoder.decode([DecodeItem(FRAMES, ())])[0]
    windows = context_windows(FRAMES, new=4, left=3, right=3)
    assert len(windows) == 4 and [w.start for w in windows] == [0, 1, 5, 9]
    db = seam_error_db(np.concatenate(snac_decoder.decode(windows)), full)
    assert db <= -40  # at float rounding, measured: docs/orpheus.md


def test_too_little_context_shows_in_the_seam_error(snac_decoder):
    table = measure_context_table(snac_decoder, FRAMES, [0, 1, 3], new=4)
    assert table[0] > table[1] > -40 > table[3]


def test_a_batch_of_mixed_windows_decodes_each_as_alone(snac_decoder):
    items = [DecodeItem(FRAMES[:8], (), keep_start=2, keep_stop=5), DecodeItem(FRAMES[4:12], (), start=4),
             DecodeItem(FRAMES[:3], (), keep_start=3), DecodeItem(FRAMES[:5], (), keep_stop=4)]
    together = snac_decoder.decode(items)
    alone = [snac_decoder.decode([item])[0] for item in items]
    assert [a.shape[0] for a in together] == [3 * 2048, 8 * 2048, 0, 4 * 2048]
    for a, b in zip(together, alone):
        assert np.abs(a - b).max(initial=0) < 1e-5


def test_it_is_a_codec_decoder_with_orpheus_rates(snac_decoder):
    assert isinstance(snac_decoder, CodecDecoder)
    assert (snac_decoder.sample_rate, snac_decoder.samples_per_code, snac_decoder.fixed_shapes) == (24000, 2048, False)
    assert snac_decoder.batch_limit >= 1


@pytest.mark.parametrize("item, match", [
    (DecodeItem(((1,) * 6,), ()), "7 codes"),
    (DecodeItem(((4096,) * 7,), ()), "0..4095"),
    (DecodeItem(((1,) * 7,), (), keep_start=2), "keep range"),
    (DecodeItem(((1,) * 7,), (), start=-1), "before the sentence"),
])
def test_bad_windows_are_refused(snac_decoder, item, match):
    with pytest.raises(ValueError, match=match):
        snac_decoder.decode([item])


def test_non_finite_audio_is_an_error(snac_tiny):
    broken = SnacDecoder(snac_tiny)
    broken.net.decoder.model[-2].bias.fill_(math.nan)
    with pytest.raises(GenerationError, match="non-finite"):
        broken.decode([DecodeItem(FRAMES[:2], ())])


# ---------------------------------------------------------------------------------------------- strict load

@pytest.fixture
def snac_copy(snac_tiny, tmp_path):
    path = tmp_path / "snac"
    shutil.copytree(snac_tiny, path)
    return path


def rewrite(path, change):
    state = torch.load(path / "pytorch_model.bin", weights_only=True)
    change(state)
    torch.save(state, path / "pytorch_model.bin")


def refusal(path) -> str:
    with pytest.raises(ModelFormatError) as err:
        SnacDecoder(path)
    message = str(err.value)
    assert "\n" not in message and str(path / "pytorch_model.bin") in message
    return message


def test_a_missing_decoder_tensor_is_named(snac_copy):
    rewrite(snac_copy, lambda s: s.pop("decoder.model.3.block.1.parametrizations.weight.original1"))
    assert "missing tensor decoder.model.3.block.1.parametrizations.weight.original1" in refusal(snac_copy)


def test_an_extra_decoder_tensor_is_refused(snac_copy):
    rewrite(snac_copy, lambda s: s.update({"decoder.model.2.block.9.alpha": torch.ones(1, 32, 1)}))
    assert "unexpected tensor decoder.model.2.block.9.alpha" in refusal(snac_copy)


def test_a_wrong_shape_is_refused(snac_copy):
    rewrite(snac_copy, lambda s: s.update({"quantizer.quantizers.1.codebook.weight": torch.zeros(4096, 4)}))
    assert "has shape [4096, 4], expected [4096, 8]" in refusal(snac_copy)


def test_only_the_encoder_and_input_projections_may_go_unread(snac_tiny):
    state = torch.load(snac_tiny / "pytorch_model.bin", weights_only=True)
    unread = {k for k in state if IGNORED_KEYS.fullmatch(k)}
    assert unread and all(k.startswith("encoder.") or ".in_proj." in k for k in unread)
    assert not any(IGNORED_KEYS.fullmatch(k) for k in state if k.startswith(("decoder.", "quantizer"))
                   and ".in_proj." not in k)


class Payload:
    """Unpickling this would run a command: what weights_only loading exists to refuse."""

    def __reduce__(self):
        return (shutil.rmtree, ("/nonexistent-orpheus-test-dir",))


def test_an_arbitrary_pickle_is_refused_in_one_line(snac_copy):
    with open(snac_copy / "pytorch_model.bin", "wb") as f:
        pickle.dump({"decoder.model.0.bias": Payload()}, f, protocol=2)
    message = refusal(snac_copy)
    assert "refused, not a plain tensor file" in message and "shutil.rmtree" in message


def test_a_file_that_is_no_pickle_is_refused(snac_copy):
    (snac_copy / "pytorch_model.bin").write_bytes(b"not a torch file")
    assert "refused, not a plain tensor file" in refusal(snac_copy)


def test_legacy_weight_norm_names_load_the_same(snac_copy, snac_decoder):
    def legacy(state):
        for key in [k for k in state if k.endswith("parametrizations.weight.original0")]:
            stem = key[: -len("parametrizations.weight.original0")]
            state[stem + "weight_g"] = state.pop(key)
            state[stem + "weight_v"] = state.pop(stem + "parametrizations.weight.original1")

    rewrite(snac_copy, legacy)
    out = SnacDecoder(snac_copy).decode([DecodeItem(FRAMES[:4], ())])[0]
    assert np.array_equal(out, snac_decoder.decode([DecodeItem(FRAMES[:4], ())])[0])


def test_a_short_last_window_padded_before_the_sentence_keeps_its_audio(snac_decoder):
    """Orpheus's short last window padded on the left (widen_left) starts before its sentence: the noise of the
    frames it keeps stays keyed to their own positions, so they match the one-shot decode."""
    from engine.batching import lengths_for, widen_left
    from engine.families.orpheus import SCHEDULE

    rng = np.random.default_rng(1)
    n = next(n for n in range(SCHEDULE.left + 2, 40) if n not in lengths_for(SCHEDULE))  # no standard length
    frames = tuple(tuple(int(c) for c in rng.integers(0, g.CODEBOOK, g.FRAME_TOKENS)) for _ in range(n))
    last = DecodeItem(frames, (), SCHEDULE.left, n, 0)
    wide = widen_left(last, frames, 0, lengths_for(SCHEDULE), pad_after=SCHEDULE.left)
    assert len(wide.codes) > n and wide.start < 0
    padded, = snac_decoder.decode([wide])
    one = snac_decoder.decode([DecodeItem(frames, ())])[0][SCHEDULE.left * g.SAMPLES_PER_FRAME:]
    assert seam_error_db(padded, one) < -80
    with pytest.raises(ValueError, match="before the sentence"):
        snac_decoder.decode([DecodeItem(frames, (), 0, n, -1)])  # keeping a frame that is not the sentence's
