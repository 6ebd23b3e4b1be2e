"""Provides the BiCodec decoder backend: checkpoint loading into our modules, and a batched CodecDecoder.

`load_bicodec` reads `config.yaml` (top key `audio_tokenizer`) and `model.safetensors`, folds the stored
weight norm into plain conv weights, and loads only what the task needs. `BiCodecDecoder` turns windows of
semantic codes plus a voice's 32 global codes into float32 audio; `extract_globals` turns a reference
recording into those 32 codes (needs `with_encoder=True`).
"""
from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import torch
import yaml
from safetensors import safe_open

from engine.backends.base import DecodeItem
from engine.backends.cuda_graphs import capture_graph
from engine.config import DECODER_AUTOTUNE
from engine.backends.bicodec_modules import BiCodecModel, fold_weight_norm, mel_spectrogram, weight_normed_keys
from engine.batching import DECODE_BATCHES
from engine.errors import GenerationError, InputError, ModelFormatError
from engine.seams import seam_error_db

CONFIG_FILE = "config.yaml"
WEIGHTS_FILE = "model.safetensors"

_REQUIRED = {
    "mel_params": ("sample_rate", "n_fft", "win_length", "hop_length", "num_mels"),
    "quantizer": ("input_dim", "codebook_size", "codebook_dim"),
    "speaker_encoder": ("input_dim", "out_dim", "latent_dim", "token_num", "fsq_levels"),
    "prenet": ("input_channels", "vocos_dim", "vocos_intermediate_dim", "vocos_num_layers", "out_channels"),
    "decoder": ("input_channel", "channels", "rates", "kernel_sizes"),
}
"""Keys the decode and speaker paths read; anything else in the file is ignored."""


def read_bicodec_config(path: Path) -> dict[str, Any]:
    """The `audio_tokenizer` mapping of a BiCodec `config.yaml`; raises ModelFormatError naming the file."""
    if not path.is_file():
        raise ModelFormatError(f"{path}: missing (every BiCodec folder has {CONFIG_FILE} + {WEIGHTS_FILE})")
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as err:
        raise ModelFormatError(f"{path}: not valid YAML ({' '.join(str(err).split())})") from None
    cfg = doc.get("audio_tokenizer") if isinstance(doc, dict) else None
    if not isinstance(cfg, dict):
        raise ModelFormatError(f"{path}: no `audio_tokenizer` section")
    for section, keys in _REQUIRED.items():
        if not isinstance(cfg.get(section), dict):
            raise ModelFormatError(f"{path}: missing section audio_tokenizer.{section}")
        for key in keys:
            if key not in cfg[section]:
                raise ModelFormatError(f"{path}: missing key audio_tokenizer.{section}.{key}")
    return cfg


def load_bicodec(
    bicodec_dir: str | Path, *, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32,
    with_encoder: bool = False,
) -> BiCodecModel:
    """Build our BiCodec modules from a checkpoint folder, in eval mode, without gradients.

    Decode-side tensors only (quantizer codebook/out_project, speaker project/project_out, prenet, decoder);
    `with_encoder` also loads the speaker tower (ECAPA, perceiver, FSQ project_in) and quantizer.in_project.
    """
    bicodec_dir = Path(bicodec_dir)
    config_path = bicodec_dir / CONFIG_FILE
    cfg = read_bicodec_config(config_path)
    try:
        with torch.device("meta"):
            model = BiCodecModel(cfg, with_encoder=with_encoder)
    except (TypeError, ValueError, KeyError) as err:
        raise ModelFormatError(f"{config_path}: unusable BiCodec config ({err})") from None
    state = _read_state(bicodec_dir / WEIGHTS_FILE, model)
    model.load_state_dict(state, strict=True, assign=True)
    return model.to(device=device, dtype=dtype).eval().requires_grad_(False)


def _read_state(path: Path, model: BiCodecModel) -> dict[str, torch.Tensor]:
    """Tensors for every key of `model`, weight norm folded; ModelFormatError names file and tensor."""
    if not path.is_file():
        raise ModelFormatError(f"{path}: missing (the BiCodec weights)")
    try:
        handle = safe_open(str(path), framework="pt", device="cpu")
    except Exception as err:  # safetensors raises its own error types for bad headers
        raise ModelFormatError(f"{path}: not a readable safetensors file ({' '.join(str(err).split())})") from None
    wn_keys = weight_normed_keys(model)
    with handle as f:
        names = set(f.keys())

        def take(key: str, shape: Sequence[int]) -> torch.Tensor:
            found = list(f.get_slice(key).get_shape())
            if found != list(shape):
                raise ModelFormatError(f"{path}: tensor {key} has shape {found}, expected {list(shape)}")
            return f.get_tensor(key)

        state: dict[str, torch.Tensor] = {}
        for key, ref in model.state_dict().items():
            shape = list(ref.shape)
            if key in wn_keys and key not in names:
                g_name, v_name = _weight_norm_names(key, names)
                for name, want in ((g_name, [shape[0]] + [1] * (len(shape) - 1)), (v_name, shape)):
                    if name not in names:
                        raise ModelFormatError(f"{path}: missing tensor {name} (expected shape {want})")
                g = take(g_name, [shape[0]] + [1] * (len(shape) - 1)).float()
                state[key] = fold_weight_norm(g, take(v_name, shape).float())
            elif key in names:
                state[key] = take(key, shape)
            elif key.endswith("num_batches_tracked"):  # BatchNorm bookkeeping, unused in eval
                state[key] = torch.zeros((), dtype=torch.long)
            else:
                raise ModelFormatError(f"{path}: missing tensor {key} (expected shape {shape})")
    return state


def _weight_norm_names(key: str, names: set[str]) -> tuple[str, str]:
    """(g, v) tensor names for a weight-normed `...weight`: legacy `weight_g/_v` (the release) or the
    `parametrizations.weight.original0/1` form a newer torch writes."""
    stem = key[: -len("weight")]
    new = (f"{stem}parametrizations.weight.original0", f"{stem}parametrizations.weight.original1")
    if new[0] in names or new[1] in names:
        return new
    return f"{stem}weight_g", f"{stem}weight_v"


# ----------------------------------------------------------------------------------------------------------
# Reference-audio preparation (spec §4 steps 2-3)


def volume_normalize(wav: np.ndarray, target: float = 0.2) -> np.ndarray:
    """Upstream's loudness normalisation of a reference recording (float64 in, float64 out).

    Peak < 0.1 is first scaled to 0.1; the level is the mean of the 90th-99th percentile of |x| > 0.01
    (percentiles taken on the ORIGINAL magnitudes, as upstream does); gain = clip(target/level, 0.1, 10);
    finally the peak is kept <= 1.
    """
    x = np.asarray(wav, dtype=np.float64)
    mags = np.sort(np.abs(x))
    if mags[-1] < 0.1:
        x = x / max(mags[-1], 1e-3) * 0.1
    loud = mags[mags > 0.01]
    if loud.size <= 10:
        return x
    level = np.mean(loud[int(0.9 * loud.size): int(0.99 * loud.size)])
    x = x * np.clip(target / level, 0.1, 10.0)
    peak = np.max(np.abs(x))
    return x / peak if peak > 1 else x


def reference_clip(wav: np.ndarray, length: int) -> np.ndarray:
    """The first `length` samples, tiling a shorter recording end to end until it is long enough."""
    if wav.size < length:
        wav = np.tile(wav, length // wav.size + 1)
    return wav[:length]


# ----------------------------------------------------------------------------------------------------------
# The CodecDecoder




class BiCodecDecoder:
    """CodecDecoder over our BiCodec modules; batches windows of equal length into one forward pass.

    `num_threads` sets torch's intra-op CPU threads (process-wide, as torch offers no per-model knob).
    On CUDA every decode runs on the decoder's own stream (never the default stream, so it cannot serialize
    with other GPU work in this process); `warmup(lengths, batches)` captures CUDA graphs for those window
    shapes (a small decode is mostly kernel launches eagerly, a fraction of that as a graph replay); other shapes
    run eagerly. `dtype=torch.bfloat16` halves memory traffic, at an error against fp32 (ModelFamily.gpu_decoder_dtype).
    """

    def __init__(
        self, bicodec_dir: str | Path, *, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32,
        num_threads: int | None = None, with_encoder: bool = False, max_batch: int = 16,
        ref_seconds: float = 6.0, deterministic: bool = False, autotune: str = "batch1",
    ) -> None:
        if num_threads is not None:
            torch.set_num_threads(num_threads)
        self.deterministic = deterministic
        """cuDNN's fixed, deterministic algorithms instead of the fastest ones timed at warm-up (that timing can
        pick differently in another process, so a resumed export could differ in the last bits)."""
        if deterministic:
            torch.backends.cudnn.deterministic = True
        if autotune not in DECODER_AUTOTUNE:
            raise ValueError(f"unknown decoder autotune policy {autotune!r}")
        self.autotune = "none" if deterministic else autotune
        """Captured graphs that get cuDNN's timed algorithms: batch1 | all | none (see _pick_algorithms)."""
        self.model = load_bicodec(bicodec_dir, device=device, dtype=dtype, with_encoder=with_encoder)
        self.weights_path = Path(bicodec_dir) / WEIGHTS_FILE
        """The weights decoded with, named when they turn out broken (non-finite audio)."""
        cfg = self.model.config
        self.device = torch.device(device)
        self.dtype = dtype
        self.with_encoder = with_encoder
        self.max_batch = max_batch
        self.sample_rate: int = int(cfg["mel_params"]["sample_rate"])
        self.samples_per_code: int = int(self.model.samples_per_code)
        self.codebook_size: int = int(cfg["quantizer"]["codebook_size"])
        self.global_count: int = int(cfg["speaker_encoder"]["token_num"])
        self.global_codebook: int = int(np.prod(cfg["speaker_encoder"]["fsq_levels"]))
        self._mel = cfg["mel_params"]
        hop = int(self._mel["hop_length"])
        self._ref_samples = int(self.sample_rate * ref_seconds) // hop * hop
        cuda = self.device.type == "cuda"
        self._stream = torch.cuda.Stream(self.device) if cuda else None
        self._graphs = _GraphCache(self.model, self.device, self._stream) if cuda else None
        self.fixed_shapes = cuda
        """Windows of equal length batch into one pass (and may replay a graph): the pipeline widens to them."""
        self.crops = not cuda
        """Decode only what a window keeps at the high sample rates (BiCodecModel.decode_kept): the CPU's time is
        the decoder's arithmetic. Not on CUDA, where a graph replays the whole window of a captured shape."""
        self._batch_limit = 128 if cuda else 16

    @property
    def batch_limit(self) -> int:
        """Most windows worth handing over in one decode() call (engine.batching.DecodeBatcher): once graphs are
        captured, the largest captured batch, so that a call is one graph replay per length and its windows
        come back after it, not after a second replay for the overflow."""
        if self._graphs is not None and self._graphs.batches:
            return self._graphs.batches[-1]
        return self._batch_limit

    def warmup(self, lengths: Sequence[int], batches: Sequence[int] = DECODE_BATCHES,
               background: bool = False) -> float:
        """Capture CUDA graphs for every (batch, length) (CPU: one eager decode per length). Returns seconds.
        `background`: from a serving engine's tuning thread, while the decoder's own thread decodes (see
        engine.backends.cuda_graphs).

        No batch-2 graph: two windows replay the batch-4 one (small batches are launch-bound, so it costs little)."""
        import time

        t = time.perf_counter()
        glob = tuple([0] * self.global_count)
        if self._graphs is None:
            for n in lengths:
                self.decode([DecodeItem(tuple([0] * n), glob)])
            return time.perf_counter() - t
        flags = torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic
        try:
            for n in sorted(set(lengths)):
                for b in sorted(set(batches)):
                    if not background:  # a background capture keeps cuDNN's fixed algorithms: timing them would
                        # flip process-wide flags under the serving threads' own decodes
                        self._pick_algorithms(autotune=self.autotune == "all" or (self.autotune == "batch1" and b == 1))
                    self._graphs.capture(b, n, self.global_count, background)
        finally:
            # eager (odd) shapes: no per-shape autotuning stalls
            torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic = flags
        self.max_batch = max(self.max_batch, max(batches))
        return time.perf_counter() - t

    def _pick_algorithms(self, autotune: bool) -> None:
        """cuDNN algorithms for the graph captured next: timed (autotuned) or cuDNN's fixed deterministic ones.
        Autotuning every captured shape costs much start-up and is redone in every process, for faster graphs.
        Hence `autotune`: none for in-process front ends, all for the server."""
        torch.backends.cudnn.benchmark = autotune
        torch.backends.cudnn.deterministic = not autotune

    def decode(self, items: Sequence[DecodeItem]) -> list[np.ndarray]:
        """Audio for each item's kept codes: float32, (keep_stop - keep_start) · samples_per_code samples."""
        spans = [self._check(item) for item in items]
        out: list[np.ndarray] = [np.zeros(0, np.float32)] * len(items)
        # windows batch together when they have the same length (and, when cropping, the same kept span)
        groups: dict[tuple[int, ...], list[int]] = defaultdict(list)
        for i, item in enumerate(items):
            if spans[i][1] > spans[i][0]:
                groups[(len(item.codes), *spans[i]) if self.crops else (len(item.codes),)].append(i)
        spc = self.samples_per_code
        with torch.inference_mode(), _on(self._stream):
            for group in groups.values():
                for at in range(0, len(group), self.max_batch):
                    batch = group[at: at + self.max_batch]
                    codes = torch.tensor([items[i].codes for i in batch], dtype=torch.long)
                    globs = torch.tensor([items[i].global_tokens for i in batch], dtype=torch.long)
                    kept = spans[batch[0]] if self.crops else None
                    audio = self._require_finite(self._forward(codes, globs, kept))
                    for row, i in enumerate(batch):
                        start, stop = spans[i]
                        first = 0 if kept is None else start  # a cropped decode starts at its kept span
                        out[i] = np.ascontiguousarray(audio[row, (start - first) * spc: (stop - first) * spc])
        return out

    def _forward(self, codes: torch.Tensor, globs: torch.Tensor, kept: tuple[int, int] | None = None) -> np.ndarray:
        """(B,T) codes, (B,32) globals (CPU tensors) -> (B, T·spc) float32 numpy audio, or only the codes
        [start, stop) of `kept` (eager only)."""
        if kept is not None:
            audio = self.model.decode_kept(codes.to(self.device), globs.to(self.device), *kept)
            return audio.float().cpu().numpy()
        if self._graphs is not None and self._stream is not None:  # graphs are captured on the decoder's stream
            graphed = self._graphs.run(codes, globs)
            audio = graphed if graphed is not None else self.model.decode(
                codes.to(self.device, non_blocking=True), globs.to(self.device, non_blocking=True))
            host = audio.float().to("cpu", non_blocking=True)
            self._stream.synchronize()
            return host.numpy()
        return self.model.decode(codes.to(self.device), globs.to(self.device)).float().cpu().numpy()

    def _require_finite(self, audio: np.ndarray) -> np.ndarray:
        """`audio`, unless it holds NaN or inf: that comes from broken weights, never from any codes, and must not
        reach a file or a speaker."""
        if not np.isfinite(audio).all():
            if self.dtype == torch.float16:  # fp16's range (65,504), not the weights, may be what broke
                raise GenerationError(f"the decoder produced non-finite audio (NaN/inf) in fp16: its range is too "
                                      f"narrow for the BiCodec weights in {self.weights_path}, or they are broken; "
                                      f"try --decoder-dtype fp32")
            raise GenerationError(f"the decoder produced non-finite audio (NaN/inf): the BiCodec weights in "
                                  f"{self.weights_path} are broken; download or convert the checkpoint again")
        return audio

    def _check(self, item: DecodeItem) -> tuple[int, int]:
        n = len(item.codes)
        stop = n if item.keep_stop is None else item.keep_stop
        if not 0 <= item.keep_start <= stop <= n:
            raise ValueError(f"keep range [{item.keep_start}, {item.keep_stop}) outside {n} codes")
        if n and not (0 <= min(item.codes) and max(item.codes) < self.codebook_size):
            raise ValueError(f"semantic codes must be in 0..{self.codebook_size - 1}")
        g = item.global_tokens
        if len(g) != self.global_count or not (0 <= min(g) and max(g) < self.global_codebook):
            raise ValueError(f"need {self.global_count} global codes in 0..{self.global_codebook - 1}, got {len(g)}")
        return item.keep_start, stop

    def extract_globals(self, wav_16k: np.ndarray) -> list[int]:
        """The 32 speaker codes of a mono 16 kHz recording: volume-normalise, 6 s clip (tiled), mel, tokenize."""
        if not self.with_encoder:
            raise ValueError("extract_globals needs BiCodecDecoder(..., with_encoder=True)")
        wav = np.asarray(wav_16k, dtype=np.float64).reshape(-1)
        if wav.size == 0 or not np.all(np.isfinite(wav)):
            raise InputError("reference audio is empty or not finite")
        clip = reference_clip(volume_normalize(wav), self._ref_samples)
        mel = mel_spectrogram(
            torch.from_numpy(clip).float()[None], sample_rate=self.sample_rate, n_fft=int(self._mel["n_fft"]),
            win_length=int(self._mel["win_length"]), hop_length=int(self._mel["hop_length"]),
            n_mels=int(self._mel["num_mels"]), f_min=float(self._mel.get("mel_fmin") or 0.0),
            f_max=self._mel.get("mel_fmax"))
        with torch.inference_mode():
            tokens = self.model.global_tokens(mel.to(device=self.device, dtype=self.dtype))
        return [int(t) for t in tokens[0].tolist()]


class _GraphCache:
    """CUDA graphs of `model.decode` for fixed (batch, length) shapes, all captured on the decoder's stream and
    sharing one memory pool (they never run concurrently). A batch of B windows replays the graph of the
    smallest captured batch >= B; rows past B hold stale codes and are ignored (rows are independent)."""

    def __init__(self, model: BiCodecModel, device: torch.device, stream: Any) -> None:
        self.model, self.device, self.stream = model, device, stream
        self.pool = torch.cuda.graph_pool_handle()
        self.aside: Any = None
        """The stream background captures run on (created by the first)."""
        self.graphs: dict[tuple[int, int], tuple[Any, torch.Tensor, torch.Tensor, torch.Tensor]] = {}
        self.batches: list[int] = []

    def capture(self, batch: int, length: int, global_count: int, background: bool = False) -> None:
        """`background`: from the tuning thread while the decoder's thread serves (engine.backends.cuda_graphs), on a
        stream of the cache's own; the graph is published for the decoder's thread once captured."""
        if (batch, length) in self.graphs:
            return
        if background and self.aside is None:
            self.aside = torch.cuda.Stream(self.device)
        codes = torch.zeros((batch, length), dtype=torch.long, device=self.device)
        globs = torch.zeros((batch, global_count), dtype=torch.long, device=self.device)
        graph, out = capture_graph(lambda: self.model.decode(codes, globs), pool=self.pool,
                                   stream=self.aside if background else self.stream, background=background)
        self.graphs[(batch, length)] = (graph, codes, globs, out)
        if batch not in self.batches:
            self.batches = sorted([*self.batches, batch])

    def run(self, codes: torch.Tensor, globs: torch.Tensor) -> torch.Tensor | None:
        """Replay on the current (decoder) stream; None if no graph fits this shape."""
        b, n = codes.shape
        bucket = next((x for x in self.batches if x >= b), None)
        entry = self.graphs.get((bucket, n)) if bucket is not None else None
        if entry is None:
            return None
        graph, codes_in, globs_in, out = entry
        codes_in[:b].copy_(codes, non_blocking=True)
        globs_in[:b].copy_(globs, non_blocking=True)
        graph.replay()
        return out[:b]


class _on:
    """`with _on(stream)`: run on a CUDA stream, or do nothing for None (CPU)."""

    def __init__(self, stream: Any) -> None:
        self._ctx = torch.cuda.stream(stream) if stream is not None else None

    def __enter__(self) -> None:
        if self._ctx is not None:
            self._ctx.__enter__()

    def __exit__(self, *exc: Any) -> None:
        if self._ctx is not None:
            self._ctx.__exit__(*exc)


# ----------------------------------------------------------------------------------------------------------
# Windowed-decode accuracy


def context_windows(
    codes: Sequence[int], global_tokens: Sequence[int], *, new: int, context: int,
) -> list[DecodeItem]:
    """Split `codes` into windows of `new` kept codes with up to `context` codes each side (clamped at the ends).

    Not the pipeline's windows (engine.windowed_decode), on purpose: equal windows with symmetric context and hard
    cuts, no crossfade, so the seam error it gives measures the decoder's receptive field alone (a test oracle:
    with the full context it must equal one-shot decoding)."""
    codes, glob, n = tuple(codes), tuple(global_tokens), len(codes)
    items = []
    for start in range(0, n, new):
        lo, hi = max(0, start - context), min(n, start + new + context)
        items.append(DecodeItem(codes[lo:hi], glob, keep_start=start - lo, keep_stop=min(start + new, n) - lo))
    return items


def measure_context_table(
    decoder: BiCodecDecoder, globals: Sequence[int], codes: Sequence[int],
    contexts: Sequence[int] = (8, 16, 24, 32, 67), new: int = 12,
) -> dict[int, float]:
    """Seam error (dB, see engine.seams) of window-by-window decoding vs one-shot decoding, per context size."""
    full = decoder.decode([DecodeItem(tuple(codes), tuple(globals))])[0]
    table = {}
    for ctx in contexts:
        pieces = decoder.decode(context_windows(codes, globals, new=new, context=ctx))
        table[ctx] = seam_error_db(np.concatenate(pieces), full)
    return table


def config_summary(cfg: Mapping[str, Any]) -> str:
    """One line describing a BiCodec config (for logs and docs)."""
    d, p = cfg["decoder"], cfg["prenet"]
    return (f"decoder channels {d['channels']} rates {list(d['rates'])}, prenet dim {p['vocos_dim']} × "
            f"{p['vocos_num_layers']} layers")
