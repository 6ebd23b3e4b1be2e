"""The upstream reference pipeline (spark_tts_lib) on the same checkpoint and workload as ours. torch,
transformers and spark_tts_lib are imported inside it."""
from __future__ import annotations

import math
import statistics
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from engine.bench.generator import SENTENCE

def reference_pipeline(model_dir: Path, tokens: int, globals_: Sequence[int], text: str = SENTENCE,
                       runs: int = 1, device: str = "cuda") -> dict[str, Any]:
    """The upstream reference, `spark_tts_lib.SparkTTS.inference()` (HF transformers `generate()` + its BiCodec
    detokenize), on the same checkpoint. What is changed, and why:

    - its speaker path (`BiCodecTokenizer.tokenize`: wav2vec2 + encoder on a reference clip) is replaced by the
      same stored 32 globals our pipeline uses, put into the prompt exactly as `process_prompt` formats them
      (format b'); `BiCodecTokenizer` is built without wav2vec2 (synthetic checkpoints have none; inference()
      with given globals never runs it);
    - `generate()` gets max_new_tokens = min_new_tokens = `tokens` and a logits processor that keeps only
      semantic ids (applied before its temperature/top-k/top-p warpers): random weights would otherwise sample
      anywhere in the 166k vocabulary and never stop. Everything else runs as shipped.
    Not streaming: its time to first audio is its whole run.
    """
    import importlib

    import torch
    from transformers import LogitsProcessor, LogitsProcessorList

    sparktts_module: Any = importlib.import_module("spark_tts_lib.SparkTTS")  # the module (the package rebinds the name)
    from spark_tts_lib.models.audio_tokenizer import BiCodecTokenizer
    from spark_tts_lib.models.bicodec import BiCodec

    class DecodeOnlyTokenizer(BiCodecTokenizer):
        def _initialize_model(self) -> None:
            self.model = BiCodec.load_from_checkpoint(f"{self.model_dir}/BiCodec").to(self.device)

    sparktts_module.BiCodecTokenizer = DecodeOnlyTokenizer
    t_load = time.perf_counter()
    tts = sparktts_module.SparkTTS(Path(model_dir), device=torch.device(device))
    load_s = time.perf_counter() - t_load
    semantic_base = tts.tokenizer.convert_tokens_to_ids("<|bicodec_semantic_0|>")

    class SemanticOnly(LogitsProcessor):
        def __init__(self) -> None:
            self.bias: torch.Tensor | None = None

        def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
            if self.bias is None or self.bias.shape[-1] != scores.shape[-1]:
                bias = torch.full((scores.shape[-1],), float("-inf"), device=scores.device, dtype=scores.dtype)
                bias[semantic_base: semantic_base + 8192] = 0
                self.bias = bias
            return scores + self.bias

    original_generate = tts.model.generate
    forced = {"n": tokens}

    def fixed_generate(**kwargs: Any) -> Any:
        kwargs.update(max_new_tokens=forced["n"], min_new_tokens=forced["n"],
                      logits_processor=LogitsProcessorList([SemanticOnly()]))
        return original_generate(**kwargs)

    tts.model.generate = fixed_generate
    global_tokens = "".join(f"<|bicodec_global_{g}|>" for g in globals_)
    prompt = "".join(["<|task_tts|>", "<|start_content|>", text, "<|end_content|>", "<|start_global_token|>",
                      global_tokens, "<|end_global_token|>"])
    global_ids = torch.tensor(list(globals_), dtype=torch.long)[None, None]
    tts.process_prompt = lambda text, prompt_speech_path, prompt_text=None: (prompt, global_ids)

    def sync() -> None:
        if device.startswith("cuda"):
            torch.cuda.synchronize()

    forced["n"] = 8
    tts.inference(text, prompt_speech_path=Path("unused.wav"))  # warm-up (CUDA init, kernels)
    forced["n"] = tokens
    walls, samples = [], 0
    gen_s = []
    for _ in range(runs):
        sync()
        t = time.perf_counter()
        tg = {}

        def timed_generate(**kwargs: Any) -> Any:
            t0 = time.perf_counter()
            result = fixed_generate(**kwargs)
            sync()
            tg["s"] = time.perf_counter() - t0
            return result

        tts.model.generate = timed_generate
        wav = tts.inference(text, prompt_speech_path=Path("unused.wav"))
        walls.append(time.perf_counter() - t)
        gen_s.append(tg.get("s", math.nan))
        samples = int(np.asarray(wav).size)
    audio_s = samples / 16000
    wall = statistics.median(walls)
    return {"tokens": tokens, "audio_s": audio_s, "wall_s": wall, "ttfa_ms": wall * 1e3, "rtf": wall / audio_s,
            "generate_s": statistics.median(gen_s), "llm_tok_s": tokens / statistics.median(gen_s),
            "load_s": load_s, "llm_dtype": str(next(tts.model.parameters()).dtype).replace("torch.", ""),
            "runs": runs, "rtf_runs": [round(w / audio_s, 4) for w in walls]}
