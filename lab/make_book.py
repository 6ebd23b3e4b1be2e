"""Write a seeded, book-shaped plain text for export benchmarks: chapters of ordinary English-like sentences.

    python lab/make_book.py OUT.txt --minutes 60      # ~9,000 words: an hour read aloud at 150 words/minute

The words are drawn from a fixed vocabulary, so the text is deterministic for a seed and free of copyright. With a
random-weight checkpoint the audio's length is not the reading time: every sentence runs to its length cap
(engine.text.sentence_token_cap), about twice as long.
"""
from __future__ import annotations

import argparse
import random
import sys

WORDS_PER_MINUTE = 150
SUBJECTS = ("the old miller", "a tired traveller", "the harbour master", "my grandmother", "the youngest sister",
            "a stranger in a grey coat", "the schoolteacher", "the baker's son", "nobody in the village", "the captain")
VERBS = ("walked slowly towards", "could not forget", "looked for", "wrote a letter about", "argued about",
         "carried a lantern past", "sang quietly near", "remembered", "painted", "waited all night by")
OBJECTS = ("the river", "the broken gate", "the lighthouse", "a field of barley", "the empty station",
           "the market square", "an orchard of pears", "the church on the hill", "the frozen pond", "the ferry")
TAILS = ("before the rain came", "while the bells were ringing", "as the sun went down", "without a word",
         "for the third time that week", "although it was late", "and then turned back", "in the early morning",
         "long after everyone had gone", "with a heavy heart")


def sentence(rng: random.Random) -> str:
    parts = [rng.choice(SUBJECTS), rng.choice(VERBS), rng.choice(OBJECTS)]
    if rng.random() < 0.7:
        parts.append(rng.choice(TAILS))
    text = " ".join(parts)
    end = rng.choices((".", "!", "?"), (0.85, 0.08, 0.07))[0]
    return text[0].upper() + text[1:] + end


def book(words: int, chapters: int, seed: int) -> str:
    rng = random.Random(seed)
    per_chapter = max(1, words // chapters)
    out = ["# A Quiet Year", ""]
    for c in range(1, chapters + 1):
        out += [f"## Chapter {c}", ""]
        written, paragraph = 0, []
        while written < per_chapter:
            s = sentence(rng)
            written += len(s.split())
            paragraph.append(s)
            if len(paragraph) >= rng.randint(3, 6):
                out += [" ".join(paragraph), ""]
                paragraph = []
        if paragraph:
            out += [" ".join(paragraph), ""]
    return "\n".join(out)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out")
    p.add_argument("--minutes", type=float, default=60.0, help="reading time at 150 words/minute")
    p.add_argument("--chapters", type=int, default=12)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    text = book(int(args.minutes * WORDS_PER_MINUTE), args.chapters, args.seed)
    with open(args.out, "w", encoding="utf-8") as f:
        f.write(text)
    print(f"{args.out}: {len(text.split())} words, {text.count('## Chapter')} chapters", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
