"""One joint SentencePiece model for source and target: loading, training, encoding text.

Id conventions shared with the model: pad=0, unk=1, bos=2, eos=3. The model is trained with
`byte_fallback=True`, so any character outside the vocabulary becomes UTF-8 byte pieces
instead of <unk>, and with SentencePiece's default `nmt_nfkc` normalization (NFKC plus
whitespace clean-up), so `decode(encode(x)) == normalize(x)`, which equals `x` for most text.

`character_coverage` defaults to 0.9995: the rarest 0.05% of characters are left to byte
fallback instead of taking whole vocabulary entries. That matters for Japanese, Chinese and
Korean, whose thousands of characters would otherwise crowd a small vocabulary (SentencePiece's
own advice), and costs Latin-script text nothing, since its rare characters are rare.
Encoding whole corpora (with a disk cache) is `data.encoding`.
"""

from __future__ import annotations

import hashlib
import io
import os
import re
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np
import sentencepiece as spm

from data.config import DataError, TokenizerConfig

PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3
MODEL_FILE = "spm.model"


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

    def special_ids(self) -> dict[str, int]:
        """The ids of padding, unknown pieces, BOS and EOS, named as ModelConfig names them."""
        return {"pad_id": PAD_ID, "unk_id": UNK_ID, "bos_id": BOS_ID, "eos_id": EOS_ID}

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
