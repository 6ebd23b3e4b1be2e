"""Text of any length: a 20,000-word text renders one unit per split sentence, none lost, none repeated."""
import random

import numpy as np

from engine.config import SamplingOptions, SynthesisRequest
from engine.events import ChunkDecoded, SentenceFinished
from engine.fakes import ScriptedGenerator, ToneDecoder
from engine.families.spark import SparkGrammar
from engine.pipeline import JoinConfig, Synthesizer
from engine.text import is_speakable, normalize, split_sentences
from engine.tokens import TokenIds
from engine.voices import VoiceBank

WORDS = ("the quick brown fox jumps over a lazy dog while seven engineers measure latency in milliseconds and "
         "nobody hears a click").split()


def make_text(n_words: int, seed: int = 0) -> str:
    rng = random.Random(seed)
    out, count = [], 0
    while count < n_words:
        n = rng.randint(3, 40) if rng.random() < 0.97 else rng.randint(200, 400)  # a few run-on sentences
        words = [rng.choice(WORDS) for _ in range(n)]
        if rng.random() < 0.2:
            words.insert(rng.randint(0, n), f"{rng.randint(1, 9999)}")
        sep = rng.choice([". ", "! ", "? ", ".\n", "; ", ", "])
        out.append(" ".join(words).capitalize() + sep)
        count += n
    return "".join(out)


async def test_twenty_thousand_words_render_every_sentence_once():
    text = make_text(20_000)
    expected = [normalize(s) for s in split_sentences(text, max_chars=JoinConfig().max_sentence_chars)]
    expected = [s for s in expected if is_speakable(s)]
    events = []
    ids = TokenIds()
    gen = ScriptedGenerator(ids, tokens_per_sentence=3)
    synth = Synthesizer(gen, ToneDecoder(), SparkGrammar(ids, lambda t: [ord(c) % 1000 for c in t]), VoiceBank(),
                        events=events.append)
    chunks = [c async for c in synth.synthesize(SynthesisRequest(text, options=SamplingOptions(seed=0)))]
    finished = [e.sentence_index for e in events if isinstance(e, SentenceFinished)]
    assert len(expected) > 500
    assert finished == list(range(len(expected)))
    sentence_prompts = [r for r in gen.started if not r.startswith("globals")]
    assert len(sentence_prompts) == len(set(sentence_prompts)) == len(expected)
    speech = [c for c in chunks if not c.pause]
    assert sorted({c.sentence_index for c in speech}) == list(range(len(expected)))
    assert sum(len(c.samples) for c in speech) == 3 * 320 * len(expected)
    assert sum(e.codes for e in events if isinstance(e, ChunkDecoded)) == 3 * len(expected)
    assert sum(c.pause for c in chunks) == len(expected) - 1
    assert np.isfinite(np.concatenate([c.samples for c in chunks])).all()
