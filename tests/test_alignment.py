"""nmt.models.alignment: the forced-decoding pass that aligns a translation with its source,
compiled for every shape it meets before a server is ready."""

from __future__ import annotations

import re

import numpy as np
from test_translator import NumberTokenizer, tiny_model

from nmt.models import alignment
from nmt.models.translator import Translator
from nmt.runtime.compilation import CompileLog
from transformer.config import SearchConfig


class SpannedNumbers(NumberTokenizer):
    """Sentences of integers, each token its characters in the sentence."""

    def token_spans(self, texts, side="source"):
        return [([int(m.group()) for m in re.finditer(r"\S+", text)],
                 [m.span() for m in re.finditer(r"\S+", text)]) for text in texts]


def _translator() -> Translator:
    # A model no other test builds, so that its programs are compiled here, not found.
    return Translator(tiny_model(max_len=24), SpannedNumbers(),
                      SearchConfig(strategy="greedy", max_len_b=2), batch_tokens=64,
                      buckets=(8,))


def _numbers(rng: np.random.Generator, length: int) -> str:
    return " ".join(str(n) for n in rng.integers(4, 60, length))


def test_after_warm_up_alignments_of_any_rows_and_lengths_compile_nothing():
    """A served model's warm-up compiles the alignment pass for every row count and width,
    so that the first HTML or .docx request with inline markup waits for no compiler."""
    translator = _translator()
    assert translator.buckets == (8, 24)
    assert alignment.alignment_shapes(translator.buckets) == [
        (rows, width) for width in (8, 24) for rows in alignment.ROW_BUCKETS]
    translator.warm_up()
    rng = np.random.default_rng(3)
    with CompileLog().active() as aligning:
        for count, source_length, target_length in ((1, 3, 3), (3, 2, 12), (5, 20, 4),
                                                    (17, 7, 7), (70, 22, 30)):
            sources = [_numbers(rng, source_length) for _ in range(count)]
            targets = [_numbers(rng, target_length) for _ in range(count)]
            found = translator.align(sources, targets)
            assert len(found) == count
            assert found[0].weights.shape == (min(target_length, 23), min(source_length, 23))
    assert aligning.records == []


def test_an_alignment_is_the_same_alone_and_padded_beside_longer_sentences():
    """Rows and both sides are padded to shared shapes: padding changes no weight."""
    translator = _translator()
    source, target = "5 9 13", "7 11"
    alone = translator.align([source], [target])[0]
    beside = translator.align([source, "4 " * 20], [target, "6 " * 15])[0]
    assert alone.source_spans == beside.source_spans == [(0, 1), (2, 3), (4, 6)]
    assert alone.target_spans == beside.target_spans == [(0, 1), (2, 4)]
    np.testing.assert_allclose(alone.weights, beside.weights, atol=1e-5)
    assert np.all(alone.weights.sum(axis=1) <= 1 + 1e-5)
