"""A tiny exported model for translate.py tests, built without the trainer in a few seconds.

`make_model(directory)` trains a 300-piece SentencePiece model on a synthetic corpus,
initializes the `tiny` Transformer with a fixed seed and exports both with
`nmt.models.model_dir.export_model`, as train.py would. The parameters are untrained:
translations are fixed gibberish, which is all the command-line tests need (order, counts,
formats, errors).
"""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path

import numpy as np

WORDS = ("ein mann fährt fahrrad eine frau liest das buch der hund läuft im park zwei kinder "
         "spielen am strand die katze schläft auf dem sofa").split()

# Stored with the model, so that the tests also check that defaults come from here.
SEARCH = dict(beam_size=3, alpha=0.6, max_len_a=1.0, max_len_b=6)


def sentences(count: int, seed: int = 0, min_words: int = 2, max_words: int = 9) -> list[str]:
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        words = [rng.choice(WORDS) for _ in range(rng.randint(min_words, max_words))]
        out.append(" ".join(words).capitalize() + ".")
    return out


def make_model(directory: str | Path) -> Path:
    """Export a tiny random model (max_len 64) to `directory`/model; returns the run dir."""
    from flax import nnx

    from data.tokenizer import TokenizerConfig, train_tokenizer
    from nmt.models.model_dir import export_model
    from transformer.config import SearchConfig, get_preset
    from transformer.model import Transformer

    directory = Path(directory)
    tokenizer = train_tokenizer(sentences(400, seed=1), TokenizerConfig(vocab_size=300))
    tokenizer.save(directory)
    config = get_preset("tiny", vocab_size=tokenizer.vocab_size)
    model = Transformer(config, rngs=nnx.Rngs(0))
    # Scale the shared embedding up so that the untrained model's next-token distribution is
    # peaked: argmax decisions then do not hinge on rounding differences between batch shapes.
    # Zero the 256 byte-fallback pieces so that outputs are words rather than stray bytes.
    params = nnx.state(model, nnx.Param)
    table = params["src_embedding"]["table"]["embedding"]
    byte_rows = [i for i in range(tokenizer.vocab_size)
                 if tokenizer.processor.is_byte(i)]
    table[...] = (table[...] * 8.0).at[np.array(byte_rows)].set(0.0)
    export_model(directory / "model", params, config, tokenizer, SearchConfig(**SEARCH),
                 extra={"source_lang": "de", "target_lang": "en"})
    return directory


def search_config(**changes):
    from transformer.config import SearchConfig

    return dataclasses.replace(SearchConfig(**SEARCH), **changes)
