"""One joint SentencePiece model for source and target, and corpus encoding with a disk cache.

Id conventions shared with the model: pad=0, unk=1, bos=2, eos=3. The model is trained with
`byte_fallback=True`, so any character outside the vocabulary becomes UTF-8 byte pieces
instead of <unk>, and with SentencePiece's default `nmt_nfkc` normalization (NFKC plus
whitespace clean-up), so `decode(encode(x)) == normalize(x)`, which equals `x` for most text.

`character_coverage` defaults to 0.9995: the rarest 0.05% of characters are left to byte
fallback instead of taking whole vocabulary entries. That matters for Japanese, Chinese and
Korean, whose thousands of characters would otherwise crowd a small vocabulary (SentencePiece's
own advice), and costs Latin-script text nothing, since its rare characters are rare.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import logging
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Iterable, Sequence

import datasets
import numpy as np
import sentencepiece as spm

from data.corpus import DataError, iter_text

log = logging.getLogger("data")

PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3
MODEL_FILE = "spm.model"
# Bump when the encoded columns change, so old cache entries are not reused.
_ENCODING_VERSION = "1"
_ENCODED_FEATURES = datasets.Features({
    "src_ids": datasets.List(datasets.Value("int32")),
    "tgt_ids": datasets.List(datasets.Value("int32")),
    "src_len": datasets.Value("int32"),
    "tgt_len": datasets.Value("int32"),
})


@dataclasses.dataclass(frozen=True)
class TokenizerConfig:
    """How to train the SentencePiece model (see module docstring for the defaults)."""

    vocab_size: int = 8000
    model_type: str = "unigram"  # or "bpe"
    max_sentences: int = 1_000_000  # sample size; source and target sentences both count
    character_coverage: float = 0.9995
    seed: int = 0

    def __post_init__(self) -> None:
        if self.model_type not in ("unigram", "bpe"):
            raise DataError(f"model_type must be 'unigram' or 'bpe', got {self.model_type!r}")
        if self.vocab_size < 300:
            raise DataError(
                f"vocab_size {self.vocab_size} is too small: 256 byte pieces and 4 special ids "
                "are always in the vocabulary; use --vocab-size 300 or more"
            )


class Tokenizer:
    """A SentencePiece model with this project's id conventions."""

    def __init__(self, model_bytes: bytes):
        self.model_bytes = model_bytes
        try:
            self.processor = spm.SentencePieceProcessor(model_proto=model_bytes)
        except RuntimeError:  # SentencePiece's "ParseFromArray" failure says nothing more
            raise DataError(
                "not a SentencePiece model, or a damaged one (SentencePiece cannot parse it); "
                "restore the spm.model saved with the run or model (its parameters only work "
                "with the tokenizer they were trained with)"
            ) from None
        ids = (self.processor.pad_id(), self.processor.unk_id(), self.processor.bos_id(),
               self.processor.eos_id())
        if ids != (PAD_ID, UNK_ID, BOS_ID, EOS_ID):
            raise DataError(
                f"SentencePiece model has pad/unk/bos/eos ids {ids}, this project needs "
                f"{(PAD_ID, UNK_ID, BOS_ID, EOS_ID)}; train one with spm_train --pad_id={PAD_ID} "
                f"--unk_id={UNK_ID} --bos_id={BOS_ID} --eos_id={EOS_ID}, or let train.py "
                "train one"
            )

    @classmethod
    def load(cls, path: str | Path) -> "Tokenizer":
        """Load a `.model` file, or `spm.model` inside a directory."""
        path = Path(path)
        if path.is_dir():
            path = path / MODEL_FILE
        if not path.is_file():
            raise DataError(f"{path}: SentencePiece model not found")
        try:
            return cls(path.read_bytes())
        except DataError as err:
            raise DataError(f"{path}: {err}") from None

    def save(self, directory: str | Path) -> Path:
        """Write the model as `directory/spm.model` and return that path."""
        path = Path(directory) / MODEL_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(self.model_bytes)
        return path

    @property
    def vocab_size(self) -> int:
        return self.processor.get_piece_size()

    @property
    def fingerprint(self) -> str:
        """Hash of the model bytes: names the encoded-corpus cache entries of this model."""
        return hashlib.md5(self.model_bytes).hexdigest()

    def encode(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids of each text, without BOS or EOS."""
        return self.processor.encode(list(texts), out_type=int)

    def decode(self, ids: Iterable[Sequence[int]]) -> list[str]:
        """Text of each id row (list or numpy array), stopping at EOS, ignoring pad and BOS."""
        return [self.processor.decode(_strip_specials(row)) for row in ids]

    def pieces(self, ids: Sequence[int]) -> list[str]:
        """The piece string of each id (for attention plots), specials included."""
        return [self.processor.id_to_piece(int(i)) for i in ids]

    def normalize(self, text: str) -> str:
        """The text after SentencePiece's normalization: what `decode(encode(text))` gives."""
        # SentencePiece writes spaces as U+2581 and adds one in front (its dummy prefix).
        return self.processor.normalize(text).replace("\u2581", " ").removeprefix(" ")


def _strip_specials(row: Sequence[int]) -> list[int]:
    """Ids up to the first EOS, with pad and BOS removed."""
    out = []
    for i in np.asarray(row).tolist():
        if i == EOS_ID:
            break
        if i not in (PAD_ID, BOS_ID):
            out.append(i)
    return out


def train_tokenizer(texts: Iterable[str], config: TokenizerConfig = TokenizerConfig()
                    ) -> Tokenizer:
    """Train a joint SentencePiece model on `texts` (source and target sentences).

    SentencePiece keeps a random sample of at most `config.max_sentences` sentences, so the
    iterator may be far larger than memory. Raises `DataError` if the vocabulary is too large
    for the text (the message gives the largest size that works).
    """
    spm.set_random_generator_seed(config.seed)
    model = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(texts),
            model_writer=model,
            model_type=config.model_type,
            vocab_size=config.vocab_size,
            character_coverage=config.character_coverage,
            input_sentence_size=config.max_sentences,
            shuffle_input_sentence=True,
            byte_fallback=True,
            pad_id=PAD_ID, unk_id=UNK_ID, bos_id=BOS_ID, eos_id=EOS_ID,
            num_threads=os.cpu_count() or 1,
            minloglevel=2,
        )
    except RuntimeError as err:
        raise _training_error(err, config) from None
    return Tokenizer(model.getvalue())


def _training_error(err: RuntimeError, config: TokenizerConfig) -> DataError:
    """Turn SentencePiece's vocabulary-size complaints into advice about --vocab-size."""
    needed = re.search(r"smaller than required_chars\. \d+ vs (\d+)", str(err))
    if needed:
        return DataError(
            f"--vocab-size {config.vocab_size} is too small: the characters of the training text "
            f"plus 256 byte pieces and 4 special ids need {needed.group(1)}; use --vocab-size "
            f"{needed.group(1)} or more"
        )
    limit = re.search(r"<=\s*(\d+)", str(err))
    if "Vocabulary size" in str(err) and limit:
        return DataError(
            f"--vocab-size {config.vocab_size} is too large for this training text: "
            f"SentencePiece can make at most {limit.group(1)} pieces; use --vocab-size "
            f"{limit.group(1)} or less (or more training data)"
        )
    return DataError(f"SentencePiece training failed: {err}")


def train_or_load_tokenizer(run_dir: str | Path, corpus: datasets.DatasetDict | datasets.Dataset,
                            config: TokenizerConfig = TokenizerConfig(),
                            given: str | Path | None = None) -> Tokenizer:
    """Reuse `run_dir/spm.model` if present (resume), else train on the train split and save.

    A reused model must have `config.vocab_size` pieces, or a `DataError` says so. With
    `given` (train.py's --spm-model), that file is the tokenizer instead: copied into
    `run_dir` on the first run, and required to be the same model on a resumed one.
    """
    path = Path(run_dir) / MODEL_FILE
    if given is not None:
        return _use_given_tokenizer(path, Path(given))
    if path.is_file():
        tokenizer = Tokenizer.load(path)
        if tokenizer.vocab_size != config.vocab_size:
            raise DataError(
                f"{path} has {tokenizer.vocab_size} pieces but --vocab-size is "
                f"{config.vocab_size}; use --vocab-size {tokenizer.vocab_size} to resume this "
                "run, or a new run directory"
            )
        log.info("reusing tokenizer %s (%d pieces)", path, tokenizer.vocab_size)
        return tokenizer
    train = corpus["train"] if isinstance(corpus, datasets.DatasetDict) else corpus
    tokenizer = train_tokenizer(iter_text(train), config)
    tokenizer.save(run_dir)
    log.info(
        "trained %s tokenizer with %d pieces on %d of %d sentences (source and target); saved %s",
        config.model_type, tokenizer.vocab_size, min(config.max_sentences, 2 * len(train)),
        2 * len(train), path,
    )
    return tokenizer


def _use_given_tokenizer(path: Path, given: Path) -> Tokenizer:
    """The SentencePiece model `given`, saved as `path` (the run's spm.model) unless there."""
    tokenizer = Tokenizer.load(given)
    if path.is_file():
        if Tokenizer.load(path).fingerprint != tokenizer.fingerprint:
            raise DataError(
                f"{path} is not the SentencePiece model in --spm-model {given}: the run in "
                f"{path.parent} started with another one, and its parameters only fit that one; "
                "resume without --spm-model, or start a new --output-dir")
        log.info("reusing tokenizer %s (%d pieces, the same as %s)", path,
                 tokenizer.vocab_size, given)
        return tokenizer
    tokenizer.save(path.parent)
    log.info("using SentencePiece model %s (%d pieces), copied to %s", given,
             tokenizer.vocab_size, path)
    return tokenizer


# ---------------------------------------------------------------------------------------------
# Encoding a corpus, cached on disk


def default_cache_dir() -> Path:
    """`$FLAX_NMT_CACHE`, else `$XDG_CACHE_HOME/flax-nmt`, else `~/.cache/flax-nmt`."""
    if os.environ.get("FLAX_NMT_CACHE"):
        return Path(os.environ["FLAX_NMT_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "flax-nmt"


class _EncodeBatch:
    """Picklable batch function for `Dataset.map`; each worker loads the model once."""

    def __init__(self, model_bytes: bytes):
        self.model_bytes = model_bytes
        self._processor: spm.SentencePieceProcessor | None = None

    def __getstate__(self) -> dict:
        return {"model_bytes": self.model_bytes, "_processor": None}

    def __call__(self, batch: dict[str, list[str]]) -> dict[str, list]:
        if self._processor is None:
            self._processor = spm.SentencePieceProcessor(model_proto=self.model_bytes)
        src = self._processor.encode(batch["source"], out_type=int)
        tgt = self._processor.encode(batch["target"], out_type=int)
        return {
            "src_ids": src,
            "tgt_ids": tgt,
            "src_len": [len(ids) for ids in src],
            "tgt_len": [len(ids) for ids in tgt],
        }


def encode_split(split: datasets.Dataset, tokenizer: Tokenizer, cache_dir: str | Path | None = None,
                 num_proc: int | None = None) -> datasets.Dataset:
    """Encode one split to `src_ids`, `tgt_ids` (int32, no BOS/EOS), `src_len`, `tgt_len`.

    The result is saved under `cache_dir/encoded/KEY`, KEY a hash of the split's datasets
    fingerprint (content-based for in-memory data, file-based for loaded data) and of the
    tokenizer model bytes, and loaded from there (memory-mapped) on later runs.
    """
    cache_root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    key = hashlib.md5(
        f"{split._fingerprint}|{tokenizer.fingerprint}|{_ENCODING_VERSION}".encode()
    ).hexdigest()
    target = cache_root / "encoded" / key
    if (target / "dataset_info.json").is_file():
        log.info("encoded split loaded from cache %s", target)
        return datasets.load_from_disk(str(target))
    if num_proc is None:
        num_proc = min(os.cpu_count() or 1, 8) if len(split) >= 50_000 else 1
    encoded = split.map(
        _EncodeBatch(tokenizer.model_bytes),
        batched=True,
        batch_size=2000,
        num_proc=num_proc if num_proc > 1 else None,
        remove_columns=split.column_names,
        features=_ENCODED_FEATURES,
        new_fingerprint=key,
        desc="encoding",
    )
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=target.parent))
    encoded.save_to_disk(str(tmp))
    try:
        tmp.rename(target)
    except OSError:  # another process finished the same entry first; theirs is identical
        shutil.rmtree(tmp, ignore_errors=True)
    log.info("encoded %d pairs, cached in %s", len(split), target)
    return datasets.load_from_disk(str(target))


def encode_corpus(corpus: datasets.DatasetDict, tokenizer: Tokenizer,
                  cache_dir: str | Path | None = None, num_proc: int | None = None
                  ) -> datasets.DatasetDict:
    """`encode_split` for every split of `corpus`."""
    return datasets.DatasetDict({
        name: encode_split(split, tokenizer, cache_dir, num_proc) for name, split in corpus.items()
    })
