"""Settings of the data pipeline: where pairs come from, the tokenizer, and batching.

Frozen dataclasses, each field declared once with its help text (`transformer.config.setting`);
train.py derives its flags and recipe schema from them. This module imports nothing heavy, so
that `train.py --help` starts fast.
"""

from __future__ import annotations

import dataclasses
import numbers
import os
from pathlib import Path
from typing import Literal, Sequence

from transformer.config import check_finite_fields, setting

DEFAULT_LOCALE_DIR = "/usr/share/locale"

# Steps of 3 up to 26, where most sentences of short-sentence corpora lie, then growing steps
# (padding waste and shape counts on Multi30k: docs/performance.md, `python -m bench.pipeline`).
DEFAULT_BUCKETS = (
    5, 8, 11, 14, 17, 20, 23, 26, 30, 34, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256,
)
# Source widths for translating. Coarser than training's: every width is one search program
# to compile (or load from the cache) at about 2.5 s each on a 2-core CPU, more than the
# padding costs, since a search step's work hardly depends on the source width (Multi30k
# test2016, beam 4: 3 widths, 13.5 s to first output and 6.5 s per pass, against 8 widths of
# DEFAULT_BUCKETS, 26.1 s and 6.5 s; docs/performance.md, "Translating").
INFERENCE_BUCKETS = (16, 32, 48, 64, 96, 128, 192, 256)
# Source tokens per translation batch before dividing by the beam size: translate.py's
# default, and validation's during training, so that both compile the same search programs.
INFERENCE_BATCH_TOKENS = 4096


class DataError(ValueError):
    """Bad or missing input data; the message says what is wrong and what to do."""


def _check_finite(config) -> None:
    """DataError naming a float setting of `config` that is NaN or infinite."""
    try:
        check_finite_fields(config)
    except ValueError as err:
        raise DataError(str(err)) from None


@dataclasses.dataclass(frozen=True)
class CorpusSpec:
    """Where the sentence pairs come from.

    Give at most one training source: `train_prefix`, `train_file` or `dataset`. With none of
    them (or `builtin=True`) the built-in gettext corpus is used. `valid_*` / `test_*` override
    or add those splits whatever the training source. Without a validation split, a seeded
    slice of `valid_fraction` of train (at most `max_valid` pairs) is held out.
    """

    src: str = setting("en", "source language code")
    tgt: str = setting("de", "target language code")
    train_prefix: str | None = setting(None, "training files PREFIX.SRC and PREFIX.TGT")
    valid_prefix: str | None = setting(None, "validation files PREFIX.SRC and PREFIX.TGT")
    test_prefix: str | None = setting(None, "test files PREFIX.SRC and PREFIX.TGT")
    train_file: str | None = setting(None, "training pairs as .tsv, .jsonl or .parquet")
    valid_file: str | None = setting(None, "validation pairs as .tsv, .jsonl or .parquet")
    test_file: str | None = setting(None, "test pairs as .tsv, .jsonl or .parquet")
    dataset: str | None = setting(None, "Hugging Face dataset name or save_to_disk directory")
    dataset_config: str | None = setting(None, "its configuration, e.g. de-en")
    max_train_pairs: int | None = setting(
        None, "use only N training pairs: the first N, or a seeded random N when validation "
              "is held out of the training data")
    builtin: bool = setting(False, "train on the built-in corpus (gettext catalogs), also the "
                                   "choice when no training source is given")
    locale_dir: str = setting(DEFAULT_LOCALE_DIR, "where the built-in corpus reads gettext "
                                                  "catalogs (LANG/LC_MESSAGES/*.mo)")
    min_builtin_pairs: int = setting(1000, "the fewest pairs the built-in corpus must find")
    valid_fraction: float = setting(0.01, "without a validation split: the fraction of the "
                                          "training pairs held out for validation")
    max_valid: int = setting(2000, "without a validation split: at most this many pairs held "
                                   "out for validation")
    seed: int = setting(0, "seed of the held-out validation slice", derived="optimizer.seed")
    source: str | None = setting(
        None, "where to get the corpus, said when its files are missing (recipes set it)")

    def __post_init__(self) -> None:
        _check_finite(self)
        sources = [name for name, value in (("--train-prefix", self.train_prefix),
                                            ("--train-file", self.train_file),
                                            ("--dataset", self.dataset)) if value]
        if len(sources) > 1 or (self.builtin and sources):
            given = sources + (["the built-in corpus"] if self.builtin else [])
            raise DataError(f"give one training source, not several: got {' and '.join(given)}")
        for split in ("valid", "test"):
            if getattr(self, f"{split}_prefix") and getattr(self, f"{split}_file"):
                raise DataError(f"give --{split}-prefix or --{split}-file, not both")
        if self.dataset_config and not self.dataset:
            raise DataError(f"--dataset-config {self.dataset_config} is a configuration of a "
                            "--dataset, and none is given; add --dataset NAME or drop it")
        if not self.src or not self.tgt or self.src == self.tgt:
            raise DataError(
                f"--src and --tgt must be two different language codes, got {self.src!r} "
                f"and {self.tgt!r}")
        if not 0.0 < self.valid_fraction < 1.0:
            raise DataError(f"valid_fraction must be in (0, 1), got {self.valid_fraction}")
        if self.max_train_pairs is not None and self.max_train_pairs < 1:
            raise DataError(f"--max-train-pairs must be >= 1, got {self.max_train_pairs}")
        for name in ("max_valid", "min_builtin_pairs"):
            if getattr(self, name) < 1:
                raise DataError(f"{name} must be >= 1, got {getattr(self, name)}")

    @property
    def uses_builtin(self) -> bool:
        """True when no training source is named, so the gettext corpus is used."""
        return self.builtin or not (self.train_prefix or self.train_file or self.dataset)


TRAINED_TYPES = ("unigram", "bpe")  # the SentencePiece algorithms a tokenizer is trained with


@dataclasses.dataclass(frozen=True)
class TokenizerConfig:
    """How to train the SentencePiece model (see `data.tokenizer` for the defaults' reasons),
    or which existing one to use."""

    vocab_size: int = setting(
        8000, "SentencePiece vocabulary size (the model's vocabulary); a training text too "
              "small for it gets the most pieces SentencePiece can make from it")
    model_type: Literal["unigram", "bpe"] = setting(
        "unigram", "SentencePiece algorithm: unigram or bpe", flag="--tokenizer-type")
    spm_model: str | None = setting(
        None, "use this SentencePiece model (e.g. another run's spm.model) instead of training "
              "one: its size is the vocabulary size, and its ids 0-3 must be pad, unk, bos, eos")
    max_sentences: int = setting(
        1_000_000, "train on a random sample of at most this many sentences (source and "
                   "target both count)", flag="--tokenizer-sentences")
    character_coverage: float = setting(
        0.9995, "share of the characters that get pieces of their own; the rarest fall back "
                "to UTF-8 byte pieces")
    subword_alpha: float | None = setting(
        None, "subword regularization: segment each training sentence anew every epoch, "
              "sampled with this smoothing (unigram: Kudo 2018, 0.1 to 0.5) or merge-dropout "
              "probability (bpe: BPE-dropout, 0.1); unset: one fixed segmentation")
    subword_nbest: int = setting(
        -1, "unigram sampling: from the N best segmentations (-1: from all of them)")
    seed: int = setting(0, "SentencePiece's sampling seed", derived="optimizer.seed")

    def __post_init__(self) -> None:
        _check_finite(self)
        check_sampling_settings(self.subword_alpha, self.subword_nbest)
        if self.model_type not in TRAINED_TYPES:
            raise DataError(f"model_type must be 'unigram' or 'bpe', got {self.model_type!r}")
        # A given model's own type decides, not model_type: data.tokenizer checks it.
        trains_bpe = self.model_type == "bpe" and self.spm_model is None
        if self.subword_nbest != -1 and (self.subword_alpha is None or trains_bpe):
            raise nbest_without_unigram(self.subword_nbest)
        if self.spm_model is not None:  # the given model's size: any that holds a piece
            if self.vocab_size < 5:
                raise DataError(
                    f"--spm-model {self.spm_model} has {self.vocab_size} pieces: it needs the 4 "
                    "special ids and at least one piece more; train it with a larger vocab_size")
        elif self.vocab_size < 300:  # the tokenizers trained here hold 256 byte pieces
            raise DataError(
                f"vocab_size {self.vocab_size} is too small: 256 byte pieces and 4 special ids "
                "are always in the vocabulary; use --vocab-size 300 or more")
        if self.max_sentences < 1:
            raise DataError(f"max_sentences must be >= 1, got {self.max_sentences}")
        if not 0.0 < self.character_coverage <= 1.0:
            raise DataError(f"character_coverage must be in (0, 1], got "
                            f"{self.character_coverage}")


MAX_SUBWORD_NBEST = 1000  # an N-best lattice search costs N times one segmentation


def nbest_without_unigram(nbest: int, found: str = "") -> DataError:
    """The error for a --subword-nbest that no unigram sampling would use; `found` says
    what the tokenizer is instead, where that is not the flags' doing."""
    return DataError(f"--subword-nbest {nbest} chooses among the N best segmentations of "
                     f"unigram sampling{found}: give --subword-alpha with a unigram "
                     "tokenizer, or drop --subword-nbest")


def check_sampling_settings(alpha: float | None, nbest: int) -> None:
    """DataError for a subword-sampling setting out of its range (one line, naming the flag)."""
    if alpha is not None and not 0.0 < alpha <= 1.0:
        raise DataError(f"--subword-alpha must be in (0, 1] (unigram: Kudo uses 0.1 to 0.5; "
                        f"BPE-dropout 0.1), got {alpha}; leave it unset for no sampling")
    if nbest != -1 and not 2 <= nbest <= MAX_SUBWORD_NBEST:
        raise DataError(f"--subword-nbest must be -1 (sample from every segmentation) or 2 to "
                        f"{MAX_SUBWORD_NBEST} (from the N best; Kudo uses 64), got {nbest}")


@dataclasses.dataclass(frozen=True)
class BatchConfig:
    """How training pairs are filtered and batched.

    `max_len` counts positions, a side's tokens and its EOS (source) or BOS (target) token;
    it is also the widest batch (the last bucket used is `max_len` itself, also when it is
    beyond the last of `buckets`). The trainer caps it at the model's max_len. `max_ratio`
    drops pairs whose longer side has more than this many times the tokens of the shorter
    (without EOS or BOS), as Moses' clean-corpus counts words. `num_devices` is the global
    device count: every batch size is a multiple of it (and so of the process count).
    `max_shapes` bounds the distinct (B, S, T) shapes, and so the compilations of the train
    step: on large corpora, cells need more pairs before they get a shape of their own (see
    `data.batching.bucket_epoch`). With `packing`, buckets and max_shapes do not apply: every
    batch is [batch_tokens // width rows, width] (`data.packing`).
    """

    batch_tokens: int = setting(
        4096, "tokens per micro-batch, padding included (an update holds K times that under "
              "--accum K)")
    max_len: int = setting(256, "drop training pairs with a side longer than this many "
                                "positions: its tokens plus the EOS (source) or BOS (target) "
                                "token", flag="--max-tokens-per-sentence")
    max_ratio: float = setting(9.0, "drop training pairs whose longer side has more than this "
                                    "many times the tokens of the shorter (EOS and BOS not "
                                    "counted)")
    buckets: tuple[int, ...] = setting(
        DEFAULT_BUCKETS, "padded batch lengths, comma-separated, or 'default'")
    max_shapes: int = setting(48, "bucketed batches: at most this many batch shapes (each "
                                  "compiles the train step once)")
    packing: bool = setting(
        True, "lay several pairs end to end in rows of one width (one train shape, almost no "
              "padding); --no-packing pads each pair to a bucket length instead")
    pack_width: int | None = setting(
        None, "packed rows' width in tokens, at least --max-tokens-per-sentence (default: the "
              "longest pair of the corpus that the length filter keeps, rounded up to a "
              "multiple of 8)")
    fitted_width: int | None = setting(None, "the longest pair kept, rounded up",
                                       derived="the corpus")
    num_devices: int = setting(1, "global device count", derived="the devices")
    seed: int = setting(0, "seed of each epoch's batch order", derived="optimizer.seed")

    def __post_init__(self) -> None:
        _check_finite(self)
        check_buckets(self.buckets)
        if self.batch_tokens < 1:  # else refused only once the corpus is encoded, as rows
            raise DataError(f"--batch-tokens must be >= 1, got {self.batch_tokens}")
        if self.max_shapes < 1:
            raise DataError(f"max_shapes must be >= 1, got {self.max_shapes}")
        if self.num_devices < 1:
            raise DataError(f"num_devices must be >= 1, got {self.num_devices}")
        if self.max_len < 2:
            raise DataError(f"--max-tokens-per-sentence must be >= 2, got {self.max_len}")
        if not self.max_ratio >= 1.0:
            raise DataError(f"max_ratio must be >= 1, got {self.max_ratio}")
        if self.packing:
            self._check_packing()
            return
        if self.pack_width is not None:
            raise DataError(f"--pack-width {self.pack_width} sets the width of packed rows, but "
                            "--no-packing pads each pair to a bucket instead; drop one of them")
        largest = self.used_buckets[-1]
        if self.batch_tokens // largest < self.num_devices:
            # The trainer passes --batch-tokens and the device count both times --accum.
            raise DataError(
                f"a batch of {self.batch_tokens} tokens (--batch-tokens x --accum) holds "
                f"{self.batch_tokens // largest} rows of the longest pairs ({largest} tokens: "
                "the smaller of --max-tokens-per-sentence and the model's --max-len), fewer "
                f"than the {self.num_devices} it needs (devices x --accum); use --batch-tokens "
                f"{largest * self.num_devices} or more, or lower --max-tokens-per-sentence")

    def _check_packing(self) -> None:
        if self.pack_width is not None and self.pack_width < self.max_len:
            raise DataError(
                f"--pack-width {self.pack_width} is narrower than the longest pair kept "
                f"(--max-tokens-per-sentence {self.max_len}, at most the model's max_len): "
                f"raise --pack-width to {self.max_len} or more, or lower "
                "--max-tokens-per-sentence")
        # Until the corpus gives the width (`data.packing.fit_width`, which makes a new config
        # and so checks again), max_len is only a bound on it: a budget too small for rows of
        # max_len can still hold enough rows of the pairs the corpus has.
        if self.pack_width is not None or self.fitted_width is not None:
            self._check_rows()

    def _check_rows(self) -> None:
        if self.batch_tokens // self.width >= self.num_devices:
            return
        if self.pack_width is not None:
            source, remedy = "--pack-width", "a smaller --pack-width"
        else:
            source = ("the longest pair kept, rounded up to a multiple of 8"
                      if self.fitted_width is not None else "--max-tokens-per-sentence")
            remedy = "lower --max-tokens-per-sentence"
        raise DataError(
            f"a batch of {self.batch_tokens} tokens (--batch-tokens x --accum) holds "
            f"{self.batch_tokens // self.width} packed rows of width {self.width} ({source}), "
            f"fewer than the {self.num_devices} it needs (devices x --accum); use --batch-tokens "
            f"{self.width * self.num_devices} or more, or {remedy}")

    @property
    def width(self) -> int:
        """Packed rows' width: pack_width, else the corpus's longest pair kept (fitted_width,
        once known), else the longest pair the filter keeps (max_len)."""
        return self.pack_width or self.fitted_width or self.max_len

    @property
    def rows_per_batch(self) -> int:
        """Packed rows of one batch: the token budget over the width, a multiple of the
        device count."""
        self._check_rows()  # checked here too while the width is not yet the corpus's
        rows = self.batch_tokens // self.width
        return rows - rows % self.num_devices

    @property
    def used_buckets(self) -> tuple[int, ...]:
        """`buckets_up_to(max_len, buckets)`."""
        return buckets_up_to(self.max_len, self.buckets)

    def rows(self, src_len: int, tgt_len: int) -> int:
        """Batch size B of the (S, T) shape: the token budget, a multiple of num_devices."""
        rows = self.batch_tokens // max(src_len, tgt_len)
        return rows - rows % self.num_devices


def buckets_up_to(max_len: int, buckets: Sequence[int] = DEFAULT_BUCKETS) -> tuple[int, ...]:
    """The buckets below `max_len`, then `max_len` itself: no batch is wider than max_len
    (a model with max_len positions can take every batch)."""
    return tuple(b for b in buckets if b < max_len) + (max_len,)


def check_buckets(buckets: Sequence[int]) -> None:
    """Raise `DataError` unless `buckets` is a non-empty, strictly increasing list from >= 2."""
    integers = all(isinstance(b, numbers.Integral) and not isinstance(b, bool) for b in buckets)
    if (not buckets or not integers or buckets[0] < 2
            or any(a >= b for a, b in zip(buckets, buckets[1:]))):
        raise DataError(
            f"--buckets must be integers >= 2 in strictly increasing order, such as 16,32,64, "
            f"got {','.join(map(str, buckets)) or 'none'}")


def default_cache_dir() -> Path:
    """Where encoded corpora and compiled programs are cached: `$FLAX_NMT_CACHE`, else
    `$XDG_CACHE_HOME/flax-nmt`, else `~/.cache/flax-nmt`."""
    if os.environ.get("FLAX_NMT_CACHE"):
        return Path(os.environ["FLAX_NMT_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "flax-nmt"
