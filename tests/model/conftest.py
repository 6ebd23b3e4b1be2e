"""Fixtures for the BiCodec model tests: a tiny synthetic BiCodec folder, our decoder on it, and the upstream
reference BiCodec (spark_tts_lib) loaded without torchaudio."""
from __future__ import annotations

import importlib.util
import sys
import types
import warnings
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file


@pytest.fixture(scope="session")
def tiny_bicodec_dir(tmp_path_factory) -> Path:
    """`.../BiCodec` of a tiny synthetic checkpoint (seed 0), written once per session."""
    from engine.synthetic.bicodec import write_bicodec

    root = tmp_path_factory.mktemp("bicodec-tiny")
    write_bicodec(root, "tiny", seed=0)
    return root / "BiCodec"


@pytest.fixture(scope="session")
def tiny_decoder(tiny_bicodec_dir):
    """Our BiCodecDecoder on the tiny checkpoint, with the speaker encoder (fp32, CPU)."""
    from engine.backends.bicodec import BiCodecDecoder

    return BiCodecDecoder(tiny_bicodec_dir, with_encoder=True)


@pytest.fixture(scope="session")
def load_upstream_bicodec():
    """`upstream_bicodec` below, as a fixture (test modules here are not a package, so they cannot import it)."""
    return upstream_bicodec


def upstream_bicodec_class() -> type:
    """spark_tts_lib's BiCodec, made importable and constructible without torchaudio.

    Why the detour: the package's `__init__` imports its end-to-end TTS wrapper and downloader, which import
    torchaudio, and torchaudio cannot be installed against our torch. So we register a bare package module whose
    `__path__` is the installed folder: every submodule (quantizer, speaker encoder, prenet, wave generator)
    imports and runs exactly as shipped; only the unrelated `__init__` is skipped. Second, `BiCodec.__init__`
    calls `init_mel_transformer`, which builds a torchaudio MelSpectrogram; the subclass overrides only that one
    method. Decoding never touches the mel transform, and its buffers are not part of the checkpoint.
    Skips the calling test when spark_tts_lib is not installed.
    """
    if "spark_tts_lib" not in sys.modules:
        spec = importlib.util.find_spec("spark_tts_lib")  # locates the package without running __init__
        if spec is None or not spec.submodule_search_locations:
            pytest.skip("spark_tts_lib (the upstream reference) is not installed")
        package = types.ModuleType("spark_tts_lib")
        package.__path__ = list(spec.submodule_search_locations)
        package.__spec__ = spec
        sys.modules["spark_tts_lib"] = package
    with warnings.catch_warnings():  # upstream's torch.jit.script(snake) warns on new torch
        warnings.simplefilter("ignore", DeprecationWarning)
        from spark_tts_lib.models.bicodec import BiCodec

    class BiCodecWithoutMel(BiCodec):
        def init_mel_transformer(self, config):  # torchaudio-only; unused by decode
            self.mel_transformer = None

    return BiCodecWithoutMel


def upstream_bicodec(bicodec_dir: Path, *, meta: bool = False) -> torch.nn.Module:
    """Upstream BiCodec built from `config.yaml` and loaded from `model.safetensors` with STRICT key matching.

    (Upstream's own `load_from_checkpoint` loads with strict=False and only prints mismatches.) `meta=True`
    builds on the meta device and assigns the loaded tensors: a key/shape check without the random init.
    """
    cls = upstream_bicodec_class()
    from spark_tts_lib.modules.encoder_decoder.feat_decoder import Decoder
    from spark_tts_lib.modules.encoder_decoder.feat_encoder import Encoder
    from spark_tts_lib.modules.encoder_decoder.wave_generator import WaveGenerator
    from spark_tts_lib.modules.speaker.speaker_encoder import SpeakerEncoder
    from spark_tts_lib.modules.vq.factorized_vector_quantize import FactorizedVectorQuantize

    cfg = yaml.safe_load((bicodec_dir / "config.yaml").read_text())["audio_tokenizer"]
    with torch.device("meta" if meta else "cpu"):
        model = cls(
            mel_params=cfg["mel_params"],
            encoder=Encoder(**cfg["encoder"]),
            decoder=WaveGenerator(**cfg["decoder"]),
            quantizer=FactorizedVectorQuantize(**cfg["quantizer"]),
            speaker_encoder=SpeakerEncoder(**cfg["speaker_encoder"]),
            prenet=Decoder(**cfg["prenet"]),
            postnet=Decoder(**cfg["postnet"]),
        )
    model.load_state_dict(load_file(bicodec_dir / "model.safetensors"), strict=True, assign=meta)
    return model.eval()
