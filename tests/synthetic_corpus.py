"""A small synthetic parallel corpus for trainer tests, written as aligned PREFIX.en/.de files.

The "translation" of a sentence reverses its words and upper-cases them: easy to learn, so a
tiny model's loss falls within a few steps.
"""

from __future__ import annotations

import random
from pathlib import Path

WORDS = ("red blue green small big old new cat dog bird tree house car boat sun moon "
         "river stone light dark fast slow happy sad").split()


def write_corpus(root: Path, pairs: int, seed: int, name: str, words: tuple[int, int] = (3, 8)
                 ) -> str:
    """Write `pairs` sentences of words[0]..words[1] words to root/name.{en,de}; returns the
    prefix root/name."""
    rng = random.Random(seed)
    src, tgt = [], []
    for _ in range(pairs):
        sentence = [rng.choice(WORDS) for _ in range(rng.randint(*words))]
        src.append(" ".join(sentence))
        tgt.append(" ".join(w.upper() for w in reversed(sentence)))
    (root / f"{name}.en").write_text("\n".join(src) + "\n")
    (root / f"{name}.de").write_text("\n".join(tgt) + "\n")
    return str(root / name)


SYLLABLES = "ka ri to mun sel va ne dor pi las tem gu fo re lin sha bo ti wen gar".split()


def syllable_sentences(count: int, seed: int) -> list[str]:
    """Sentences of words of 1 to 4 random syllables: too many words for whole-word pieces,
    so a small vocabulary segments each word several ways (for subword sampling)."""
    rng = random.Random(seed)

    def word() -> str:
        return "".join(rng.choice(SYLLABLES) for _ in range(rng.randint(1, 4)))

    return [" ".join(word() for _ in range(rng.randint(3, 9))) for _ in range(count)]
