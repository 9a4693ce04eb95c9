"""A lexical shortlist: the target tokens a batch's source tokens are likely to produce, so
that a search's output projection and softmax cover those instead of the whole vocabulary.

The table holds, for each source token, its `per_source` likeliest target tokens under
IBM Model 1's lexical translation probabilities p(target | source) (Brown et al. 1993),
estimated by EM over the training pairs' token ids with a NULL source word; and every target
token ordered by its count in the corpus. Model 1 rather than raw co-occurrence counts:
counts rank the most frequent target tokens first for every source token, where Model 1's
expected alignments explain those by the words (or NULL) that cause them. Marian's lexical
shortlists are the same kind of table (p(target | source) from fast_align's alignments, the
best 100 per source word plus the 100 most frequent target words); CTranslate2's vocabulary
map lists target tokens per source n-gram plus tokens always included.

A batch's candidates (`Shortlist.candidates`) are a fixed number K of token ids, so that a
search compiles one shape: the special ids, the `always` most frequent target tokens, then
the batch's source tokens' translations by probability, then more frequent tokens until there
are K, ascending. Pure NumPy: built and read without JAX.
"""

from __future__ import annotations

import dataclasses
import io
import json
import zipfile
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from transformer.atomic_files import write_atomically

SHORTLIST_FILE = "shortlist.npz"
# Expected alignments held at once while estimating: a corpus with more sentence-pair
# products (source tokens x target tokens) is estimated on a seeded sample of its pairs.
MAX_ALIGNMENT_LINKS = 30_000_000


@dataclasses.dataclass(frozen=True)
class Shortlist:
    """translations: int32 [vocab, per_source], each source token's likeliest target tokens
    (-1 where it has fewer); probabilities: float32, the same shape, p(target | source);
    by_frequency: int32 [vocab - special], every other token, most frequent target first
    (unseen ones by id); always: how many
    of those every batch gets; special: the ids below it are special (PAD, UNK, BOS, EOS);
    tokenizer: the fingerprint of the SentencePiece model whose ids these are."""

    translations: np.ndarray
    probabilities: np.ndarray
    by_frequency: np.ndarray
    always: int
    special: int
    tokenizer: str

    @property
    def vocab_size(self) -> int:
        return len(self.translations)

    def candidates(self, src_ids: np.ndarray, size: int) -> np.ndarray:
        """int32 [size] ascending token ids for a batch of source ids (any shape; padding
        and special ids are ignored): `size` clamped to the vocabulary gives every token."""
        vocab = self.vocab_size
        if size >= vocab:
            return np.arange(vocab, dtype=np.int32)
        chosen = np.zeros(vocab, bool)
        chosen[:self.special] = True
        # The most frequent first where `size` leaves no room for all `always` of them.
        chosen[self.by_frequency[:min(self.always, size - self.special)]] = True
        sources = np.unique(src_ids)
        sources = sources[(sources >= self.special) & (sources < vocab)]
        tokens = self.translations[sources].ravel()
        order = np.argsort(-self.probabilities[sources].ravel(), kind="stable")
        tokens = tokens[order]
        _add_in_order(chosen, tokens[tokens >= 0], size)
        _add_in_order(chosen, self.by_frequency, size)
        return np.flatnonzero(chosen)[:size].astype(np.int32)

    # ---------------------------------------------------------------- storage

    def save(self, path: str | Path) -> None:
        buffer = io.BytesIO()
        np.savez(buffer, translations=self.translations, probabilities=self.probabilities,
                 by_frequency=self.by_frequency,
                 settings=np.frombuffer(json.dumps(
                     {"always": self.always, "special": self.special,
                      "tokenizer": self.tokenizer}).encode(), np.uint8))
        write_atomically(path, buffer.getvalue())

    @classmethod
    def load(cls, path: str | Path) -> Shortlist:
        """The stored table; ValueError naming the file and what is wrong if it cannot be
        read or its arrays do not fit together (a search would index past them)."""
        # np.load reads what is not an archive as a pickle, and refuses it with advice to
        # allow pickles: the file is damaged or another file, never a pickle of ours.
        if Path(path).is_file() and not zipfile.is_zipfile(path):
            raise _unreadable(path, "not a NumPy .npz archive")
        try:
            with np.load(path) as stored:
                settings = json.loads(bytes(stored["settings"]).decode())
                shortlist = cls(stored["translations"], stored["probabilities"],
                                stored["by_frequency"], int(settings["always"]),
                                int(settings["special"]), str(settings["tokenizer"]))
        except (OSError, ValueError, KeyError, TypeError, EOFError,
                zipfile.BadZipFile) as err:
            raise _unreadable(path, err) from None
        problem = shortlist._inconsistency()
        if problem:
            raise _unreadable(path, problem)
        return shortlist

    def _inconsistency(self) -> str | None:
        """What in the arrays does not fit together, or None: checked where a table is read,
        since `candidates` indexes with its ids."""
        translations, by_frequency = self.translations, self.by_frequency
        if translations.ndim != 2 or not np.issubdtype(translations.dtype, np.integer):
            return f"translations are {translations.dtype} {translations.shape}, not 2-D ids"
        if self.probabilities.shape != translations.shape \
                or not np.issubdtype(self.probabilities.dtype, np.floating):
            return (f"probabilities are {self.probabilities.dtype} {self.probabilities.shape}, "
                    f"translations {translations.shape}")
        vocab = self.vocab_size
        if not 0 < self.special < vocab:
            return f"special {self.special} is not between 0 and the vocabulary's {vocab}"
        if not 0 <= self.always <= vocab:
            return f"always {self.always} is not between 0 and the vocabulary's {vocab}"
        if translations.size and not -1 <= translations.min() <= translations.max() < vocab:
            return f"translations hold ids outside -1 to {vocab - 1}"
        if not (np.issubdtype(by_frequency.dtype, np.integer) and by_frequency.shape
                == (vocab - self.special,) and np.array_equal(np.sort(by_frequency),
                                                              np.arange(self.special, vocab))):
            return f"by_frequency is not the ids {self.special} to {vocab - 1}, each once"
        return None


def _unreadable(path: str | Path, why: object) -> ValueError:
    return ValueError(f"{path} is not a readable shortlist ({why}); build it again with "
                      "python -m nmt.distillation.shortlist.")


def _add_in_order(chosen: np.ndarray, tokens: np.ndarray, size: int) -> None:
    """Mark the first new tokens of `tokens` (in order, repeats counted once) until `size`
    are marked."""
    room = size - int(chosen.sum())
    if room <= 0:
        return
    new = tokens[~chosen[tokens]]
    _, first = np.unique(new, return_index=True)
    chosen[new[np.sort(first)[:room]]] = True


# ----------------------------------------------------------------------------- building


def build_shortlist(pairs: Iterable[tuple[Sequence[int], Sequence[int]]], vocab_size: int,
                    special: int, tokenizer: str, per_source: int = 50, always: int = 100,
                    iterations: int = 5, seed: int = 0) -> Shortlist:
    """The shortlist of token-id pairs (source ids, target ids; no BOS or EOS): IBM Model 1
    estimated by `iterations` of EM from uniform probabilities, over a seeded sample of the
    pairs if they hold more than `MAX_ALIGNMENT_LINKS` token pairs."""
    pairs = _sample(list(pairs), seed)
    null = vocab_size  # the NULL source word, present in every sentence
    links = _links(pairs, null)
    keys = links.source.astype(np.int64) * vocab_size + links.target
    unique, link_of = np.unique(keys, return_inverse=True)
    source_of = (unique // vocab_size).astype(np.int64)
    probability = np.ones(len(unique))
    for _ in range(iterations):
        weight = probability[link_of]
        # E: each target token's alignment over its sentence's source tokens (and NULL).
        weight /= np.bincount(links.occurrence, weight)[links.occurrence]
        # M: expected counts, normalised per source token.
        counts = np.bincount(link_of, weight, minlength=len(unique))
        probability = counts / np.bincount(source_of, counts, minlength=null + 1)[source_of]
    translations, probabilities = _best_per_source(unique % vocab_size, source_of, probability,
                                                   vocab_size, per_source)
    return Shortlist(translations, probabilities, _by_frequency(pairs, vocab_size, special),
                     min(always, vocab_size), special, tokenizer)


@dataclasses.dataclass
class _Links:
    """Every (source token, target token) pair of every sentence pair, and which target
    occurrence (sentence, position) each belongs to."""

    source: np.ndarray
    target: np.ndarray
    occurrence: np.ndarray


def _links(pairs: list[tuple[Sequence[int], Sequence[int]]], null: int) -> _Links:
    sources, targets, occurrences = [], [], []
    first_occurrence = 0
    for src, tgt in pairs:
        src = np.append(np.asarray(src, np.int32), null)
        tgt = np.asarray(tgt, np.int32)
        sources.append(np.tile(src, len(tgt)))
        targets.append(np.repeat(tgt, len(src)))
        occurrences.append(np.repeat(np.arange(first_occurrence, first_occurrence + len(tgt)),
                                     len(src)))
        first_occurrence += len(tgt)
    join = lambda parts, dtype: (np.concatenate(parts).astype(dtype) if parts  # noqa: E731
                                 else np.zeros(0, dtype))
    return _Links(join(sources, np.int32), join(targets, np.int32),
                  join(occurrences, np.int64))


def _sample(pairs: list, seed: int) -> list:
    sizes = np.array([(len(s) + 1) * len(t) for s, t in pairs], np.int64)
    if sizes.sum() <= MAX_ALIGNMENT_LINKS:
        return pairs
    order = np.random.default_rng(seed).permutation(len(pairs))
    kept = order[np.cumsum(sizes[order]) <= MAX_ALIGNMENT_LINKS]
    return [pairs[i] for i in np.sort(kept)]


def _best_per_source(target: np.ndarray, source: np.ndarray, probability: np.ndarray,
                     vocab_size: int, per_source: int) -> tuple[np.ndarray, np.ndarray]:
    """[vocab, per_source] target ids (-1 padded) and their probabilities, best first."""
    translations = np.full((vocab_size, per_source), -1, np.int32)
    probabilities = np.zeros((vocab_size, per_source), np.float32)
    real = source < vocab_size  # NULL's translations are not a source token's
    target, source, probability = target[real], source[real], probability[real]
    order = np.lexsort((-probability, source))
    target, source, probability = target[order], source[order], probability[order]
    group_start = np.searchsorted(source, source)
    rank = np.arange(len(source)) - group_start
    keep = rank < per_source
    translations[source[keep], rank[keep]] = target[keep]
    probabilities[source[keep], rank[keep]] = probability[keep]
    return translations, probabilities


def _by_frequency(pairs: list, vocab_size: int, special: int) -> np.ndarray:
    """Every non-special token id, most frequent target token first (unseen ones by id)."""
    targets = [np.asarray(tgt, np.int64) for _, tgt in pairs]
    counts = np.bincount(np.concatenate(targets) if targets else np.zeros(0, np.int64),
                         minlength=vocab_size)
    ids = np.arange(special, vocab_size)
    return ids[np.argsort(-counts[special:], kind="stable")].astype(np.int32)
