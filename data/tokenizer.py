"""Tokenizers: text <-> ids, with the special ids the model is built around.

Two layouts, one interface (`encode`, `decode`, `pieces`, `special_ids`, `save`):

- `Tokenizer`: one joint SentencePiece model for source and target (`spm.model`), trained
  here. Ids are SentencePiece's, with this project's conventions pad=0, unk=1, bos=2, eos=3.
  It is trained with `byte_fallback=True`, so any character outside the vocabulary becomes
  UTF-8 byte pieces instead of <unk>, and with SentencePiece's default `nmt_nfkc`
  normalization (NFKC plus whitespace clean-up), so `decode(encode(x)) == normalize(x)`.
  That is `x` for most Latin-script text, but not for Japanese or Chinese written with
  full-width punctuation and digits (`？（１）` -> `?(1)`) or half-width katakana
  (`ｶﾀｶﾅ` -> `カタカナ`): input and output are normalized alike, so a model trained with
  this tokenizer writes the ASCII forms (docs/training.md, "Normalization", says how to
  keep them: a tokenizer without normalization, given with --spm-model).
  `character_coverage` defaults to 0.9995: the rarest 0.05% of characters are left to byte
  fallback instead of taking whole vocabulary entries. That matters for Japanese, Chinese
  and Korean, whose thousands of characters would otherwise crowd a small vocabulary
  (SentencePiece's own advice), and costs Latin-script text nothing.
- `VocabTokenizer`: Marian's layout, which OPUS-MT models use: a source and a target
  SentencePiece model that only split text into pieces, and `vocab.json`, one piece -> id
  table for both sides. Ids: eos `</s>`, unk `<unk>` and pad `<pad>` as the table says (0, 1
  and the last id in OPUS-MT models); there is no BOS: the decoder starts from pad.

`load_tokenizer(directory)` reads whichever layout a model or run directory holds. Encoding
whole corpora (with a disk cache) is `data.encoding`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import itertools
import json
import logging
import os
import re
from pathlib import Path
from typing import Iterable, Literal, Sequence

import sentencepiece as spm

from data.config import DataError, TokenizerConfig, nbest_without_unigram
from data.lines import SURROGATE

log = logging.getLogger(__name__)

PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3
MODEL_FILE = "spm.model"
# Marian's files (the names MarianTokenizer reads).
SOURCE_SPM, TARGET_SPM, VOCAB_FILE = "source.spm", "target.spm", "vocab.json"
SPECIAL_TOKENS_FILE = "special_tokens_map.json"
# Its entries read here; bos_token, when present, is the decoder's start (else the pad id).
SPECIAL_TOKENS = ("eos_token", "unk_token", "pad_token", "bos_token")

Side = Literal["source", "target"]


@dataclasses.dataclass(frozen=True)
class SpecialIds:
    """The ids batches and search are built around. `bos` is the decoder's first input: BOS
    here, the pad id in Marian's models (which have no BOS)."""

    pad: int = PAD_ID
    unk: int = UNK_ID
    bos: int = BOS_ID
    eos: int = EOS_ID

    def as_model_fields(self) -> dict[str, int]:
        """Named as ModelConfig names them."""
        return {"pad_id": self.pad, "unk_id": self.unk, "bos_id": self.bos, "eos_id": self.eos}


def _processor(model_bytes: bytes, file_name: str) -> spm.SentencePieceProcessor:
    try:
        return spm.SentencePieceProcessor(model_proto=model_bytes)
    except RuntimeError:  # SentencePiece's "ParseFromArray" failure says nothing more
        raise DataError(
            f"not a SentencePiece model, or a damaged one (SentencePiece cannot parse it); "
            f"restore the {file_name} saved with the run or model (its parameters only work "
            "with the tokenizer they were trained with)"
        ) from None


class TokenizerBase:
    """What both layouts share: files, fingerprints, special ids. Each layout gives
    `vocab_size`, `vocabulary()`, `encode(texts, side)`, `decode(rows)`, `pieces(ids, side)`,
    `normalize(text)`, `sentencepiece_models()` and `files()`, and pickles as its files (for
    `datasets.map` workers)."""

    ids: SpecialIds

    def files(self) -> dict[str, bytes]:
        """File name -> content: what `save` writes and `load_tokenizer` reads back."""
        raise NotImplementedError

    def save(self, directory: str | Path) -> Path:
        """Write the tokenizer's files into `directory`; returns the first one's path
        (`spm.model`, or `source.spm`)."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        for name, content in self.files().items():
            (directory / name).write_bytes(content)
        return directory / next(iter(self.files()))

    @property
    def fingerprint(self) -> str:
        """md5 of the files: names the encoded-corpus cache entries of this tokenizer."""
        return hashlib.md5(b"".join(self.files().values())).hexdigest()

    @property
    def sha256(self) -> str:
        """sha256 of the files (of spm.model's bytes alone for a joint model), recorded with
        checkpoints to refuse resuming with another tokenizer."""
        return hashlib.sha256(b"".join(self.files().values())).hexdigest()

    def special_ids(self) -> dict[str, int]:
        """The ids of padding, unknown pieces, BOS and EOS, named as ModelConfig names them."""
        return self.ids.as_model_fields()

    def token_spans(self, texts: Sequence[str], side: Side = "source"
                    ) -> list[tuple[list[int], list[tuple[int, int]]]]:
        """(ids, [start, end) in the text of each token's characters) of each text, as
        `encode` cuts it: where a word alignment meets the text. A token's span leaves out
        the spaces before it; one with no characters of its own is empty."""
        raise NotImplementedError

    def check_sampling(self, alpha: float, nbest: int) -> None:
        """DataError unless `sample` can draw segmentations with these settings."""
        raise DataError("subword sampling (--subword-alpha) needs a joint SentencePiece "
                        "model; this run's tokenizer is a Marian vocabulary (vocab.json over "
                        "source.spm and target.spm), whose ids follow one segmentation: drop "
                        "--subword-alpha")

    def sample(self, texts: Sequence[str], side: Side, alpha: float, nbest: int
               ) -> list[list[int]]:
        """Token ids of each text under a segmentation drawn at random (`data.sampling`)."""
        self.check_sampling(alpha, nbest)
        raise NotImplementedError

    def _strip_specials(self, row: Sequence[int]) -> list[int]:
        """Ids up to the first EOS, with pad and BOS removed."""
        out = []
        for i in map(int, row):  # a list or a numpy array
            if i == self.ids.eos:
                break
            if i not in (self.ids.pad, self.ids.bos):
                out.append(i)
        return out


class Tokenizer(TokenizerBase):
    """A joint SentencePiece model with this project's id conventions."""

    def __init__(self, model_bytes: bytes):
        self.model_bytes = model_bytes
        self.processor = _processor(model_bytes, MODEL_FILE)
        self.ids = SpecialIds()
        found = (self.processor.pad_id(), self.processor.unk_id(), self.processor.bos_id(),
                 self.processor.eos_id())
        if found != (PAD_ID, UNK_ID, BOS_ID, EOS_ID):
            raise DataError(
                f"SentencePiece model has pad/unk/bos/eos ids {found}, this project needs "
                f"{(PAD_ID, UNK_ID, BOS_ID, EOS_ID)}; train one with spm_train --pad_id={PAD_ID} "
                f"--unk_id={UNK_ID} --bos_id={BOS_ID} --eos_id={EOS_ID}, or let train.py "
                "train one"
            )

    def __getstate__(self) -> dict:
        return {"model_bytes": self.model_bytes}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["model_bytes"])

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

    def files(self) -> dict[str, bytes]:
        return {MODEL_FILE: self.model_bytes}

    @property
    def vocab_size(self) -> int:
        return self.processor.get_piece_size()

    @property
    def model_type(self) -> str:
        """The SentencePiece algorithm the model was trained with, as its proto names it
        in lower case: "unigram", "bpe", "word" or "char"."""
        from sentencepiece import sentencepiece_model_pb2

        return sentencepiece_model_pb2.TrainerSpec.ModelType.Name(
            self._trainer_spec().model_type).lower()

    @property
    def byte_fallback(self) -> bool:
        """Whether characters outside the vocabulary become UTF-8 byte pieces (else <unk>):
        always so in the models trained here, not in every model given with --spm-model."""
        return self._trainer_spec().byte_fallback

    def _trainer_spec(self):
        from sentencepiece import sentencepiece_model_pb2

        proto = sentencepiece_model_pb2.ModelProto()
        proto.ParseFromString(self.model_bytes)
        return proto.trainer_spec

    def vocabulary(self) -> list[str]:
        """The piece of each id, in id order."""
        return [self.processor.id_to_piece(i) for i in range(self.vocab_size)]

    def sentencepiece_models(self) -> tuple[bytes, bytes]:
        """(source, target) SentencePiece models: the joint one twice."""
        return self.model_bytes, self.model_bytes

    def encode(self, texts: Sequence[str], side: Side = "source") -> list[list[int]]:
        """Token ids of each text, without BOS or EOS (one model for both sides); ValueError
        for a text that is not valid Unicode."""
        _check_unicode(texts)
        return self.processor.encode(list(texts), out_type=int)

    def check_sampling(self, alpha: float, nbest: int) -> None:
        # Asked to sample, a word or char model raises (sentencepiece 0.2.3) or returns no
        # ids at all (0.2.1): its type is read instead.
        if self.model_type in ("word", "char"):
            raise DataError(
                "subword sampling (--subword-alpha) needs a unigram or bpe SentencePiece model; "
                f"this run's spm.model (a {self.model_type} model) has one segmentation per "
                "sentence: drop --subword-alpha, or train a tokenizer with --tokenizer-type "
                "unigram")
        if nbest != -1 and self.model_type == "bpe":  # BPE-dropout has no N best to draw from
            raise nbest_without_unigram(
                nbest, ", and this run's spm.model is a BPE model (the one --spm-model or "
                "--init-from gave)")

    def sample(self, texts: Sequence[str], side: Side, alpha: float, nbest: int
               ) -> list[list[int]]:
        _check_unicode(texts)
        # One worker: several would share the draws in whatever order they run.
        return self.processor.encode(list(texts), out_type=int, enable_sampling=True,
                                     alpha=alpha, nbest_size=nbest, num_threads=1)

    def token_spans(self, texts: Sequence[str], side: Side = "source"
                    ) -> list[tuple[list[int], list[tuple[int, int]]]]:
        _check_unicode(texts)
        return [_spans_of(self.processor, text) for text in texts]

    def decode(self, ids: Iterable[Sequence[int]]) -> list[str]:
        """Text of each id row (list or numpy array), stopping at EOS, ignoring pad and BOS."""
        return [self.processor.decode(self._strip_specials(row)) for row in ids]

    def pieces(self, ids: Sequence[int], side: Side = "source") -> list[str]:
        """The piece string of each id (for attention plots), specials included."""
        return [self.processor.id_to_piece(int(i)) for i in ids]

    def normalize(self, text: str) -> str:
        """The text after SentencePiece's normalization: what `decode(encode(text))` gives."""
        # SentencePiece writes spaces as U+2581 and adds one in front (its dummy prefix).
        return self.processor.normalize(text).replace("\u2581", " ").removeprefix(" ")


class VocabTokenizer(TokenizerBase):
    """Marian's layout: source and target SentencePiece models that split text into pieces,
    and one piece -> id table (`vocab.json`) for both sides.

    As MarianTokenizer does: a piece missing from the table is <unk>; a language token such as
    `>>fra<<` at the start of a source text is one piece (multilingual OPUS-MT models read the
    target language from it); the decoder starts from the pad id (or from `bos_token` where
    one is named, as in models exported from here).
    """

    def __init__(self, source_bytes: bytes, target_bytes: bytes, vocab: dict[str, int],
                 special_tokens: dict[str, str] | None = None):
        self.source_bytes, self.target_bytes = source_bytes, target_bytes
        self.vocab = dict(vocab)
        self.special_tokens = {"eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>",
                               **(special_tokens or {})}
        self.source = _named_processor(source_bytes, SOURCE_SPM)
        self.target = _named_processor(target_bytes, TARGET_SPM)
        ids = sorted(self.vocab.values())
        if ids != list(range(len(ids))):
            raise DataError(f"{VOCAB_FILE}: ids must be 0 .. {len(ids) - 1}, each once; it has "
                            f"{len(set(ids))} distinct ids between {ids[0]} and {ids[-1]}")
        self.id_to_piece = {i: piece for piece, i in self.vocab.items()}
        special = {}
        for name in ("eos_token", "unk_token", "pad_token"):
            piece = self.special_tokens[name]
            if piece not in self.vocab:
                raise DataError(f"{VOCAB_FILE} has no {name} {piece!r}; add it, or name the "
                                f"piece in {SPECIAL_TOKENS_FILE}")
            special[name] = self.vocab[piece]
        start = self.special_tokens.get("bos_token")  # the decoder's start, if not pad
        if start is not None and start not in self.vocab:
            raise DataError(f"{VOCAB_FILE} has no bos_token {start!r}")
        self.ids = SpecialIds(pad=special["pad_token"], unk=special["unk_token"],
                              bos=self.vocab[start] if start else special["pad_token"],
                              eos=special["eos_token"])

    def __getstate__(self) -> dict:
        return {"args": (self.source_bytes, self.target_bytes, self.vocab, self.special_tokens)}

    def __setstate__(self, state: dict) -> None:
        self.__init__(*state["args"])

    @classmethod
    def load(cls, directory: str | Path, special_tokens: dict[str, str] | None = None
             ) -> "VocabTokenizer":
        """Read source.spm, target.spm, vocab.json, and the special tokens of
        special_tokens_map.json if there (or those given)."""
        directory = Path(directory)
        for name in (SOURCE_SPM, TARGET_SPM, VOCAB_FILE):
            if not (directory / name).is_file():
                raise DataError(f"{directory / name} is missing: a Marian-style tokenizer needs "
                                f"{SOURCE_SPM}, {TARGET_SPM} and {VOCAB_FILE}")
        vocab = _read_json(directory / VOCAB_FILE)
        if not isinstance(vocab, dict) or not all(isinstance(i, int) for i in vocab.values()):
            raise DataError(f"{directory / VOCAB_FILE} must map each piece to an integer id")
        if special_tokens is None and (directory / SPECIAL_TOKENS_FILE).is_file():
            special_tokens = read_special_tokens(directory / SPECIAL_TOKENS_FILE)
        try:
            return cls((directory / SOURCE_SPM).read_bytes(), (directory / TARGET_SPM).read_bytes(),
                       vocab, special_tokens)
        except DataError as err:
            raise DataError(f"{directory}: {err}") from None

    def files(self) -> dict[str, bytes]:
        special = json.dumps(self.special_tokens, indent=2, sort_keys=True) + "\n"
        return {SOURCE_SPM: self.source_bytes, TARGET_SPM: self.target_bytes,
                VOCAB_FILE: (json.dumps(self.vocab, ensure_ascii=False, indent=1) + "\n").encode(),
                SPECIAL_TOKENS_FILE: special.encode()}

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    def vocabulary(self) -> list[str]:
        return [self.id_to_piece[i] for i in range(self.vocab_size)]

    def sentencepiece_models(self) -> tuple[bytes, bytes]:
        return self.source_bytes, self.target_bytes

    def encode(self, texts: Sequence[str], side: Side = "source") -> list[list[int]]:
        """Token ids of each text, without EOS; ValueError for a text that is not valid
        Unicode."""
        _check_unicode(texts)
        processor = self.source if side == "source" else self.target
        unk = self.ids.unk
        out = []
        for text in texts:
            code = []
            if side == "source" and text.startswith(">>") and "<<" in text:
                end = text.index("<<") + 2
                code, text = [text[:end]], text[end:]
            out.append([self.vocab.get(piece, unk)
                        for piece in code + processor.encode(text, out_type=str)])
        return out

    def token_spans(self, texts: Sequence[str], side: Side = "source"
                    ) -> list[tuple[list[int], list[tuple[int, int]]]]:
        processor = self.source if side == "source" else self.target
        out = []
        for text, ids in zip(texts, self.encode(texts, side)):
            # A leading language token (">>fra<<", see `encode`) spans its own characters.
            code = text.index("<<") + 2 if len(ids) > 0 and side == "source" and \
                text.startswith(">>") and "<<" in text else 0
            _, spans = _spans_of(processor, text[code:], shift=code)
            out.append((ids, [(0, code)] * (len(ids) - len(spans)) + spans))
        return out

    def decode(self, ids: Iterable[Sequence[int]]) -> list[str]:
        """Text of each id row, stopping at EOS, ignoring pad; pieces joined by the target
        model as SentencePiece's decode (Marian's, `Tokenizer.decode`) joins them: the word
        boundaries before any text give no space, one at the end does (transformers'
        MarianTokenizer strips the text as well)."""
        # A piece the target model lacks (the table holds both sides' pieces) comes back
        # verbatim from decode_pieces: its word-boundary marks still need to become spaces,
        # except those before any text, which SentencePiece drops from the pieces it knows.
        return [self.target.decode_pieces(self.pieces(self._strip_specials(row), "target"))
                .lstrip("\u2581").replace("\u2581", " ") for row in ids]

    def pieces(self, ids: Sequence[int], side: Side = "source") -> list[str]:
        return [self.id_to_piece.get(int(i), self.special_tokens["unk_token"]) for i in ids]

    def normalize(self, text: str) -> str:
        return self.target.normalize(text).replace("\u2581", " ").removeprefix(" ")


def _check_unicode(texts: Sequence[str]) -> None:
    """ValueError naming the first text that holds a lone UTF-16 surrogate (what bytes that
    are not UTF-8 become when decoded with errors="surrogateescape", or a JSON \\ud800
    escape): no character, no UTF-8, and SentencePiece refuses it with a bare TypeError."""
    for index, text in enumerate(texts):
        if isinstance(text, str) and (found := SURROGATE.search(text)):
            raise ValueError(
                f"text {index} is not valid Unicode: it holds U+{ord(found.group()):04X} (at "
                f"character {found.start()}), half of a UTF-16 surrogate pair and no "
                "character; decode its bytes as UTF-8, or drop the character")


# How `encode` returns pieces with their offsets: before sentencepiece 0.2.2, as an immutable
# proto whose offsets the wrapper has made character offsets; from 0.2.2, as a proto with
# SentencePiece's own byte offsets.
_BYTE_OFFSETS = tuple(int(re.match(r"\d*", part).group() or 0)  # "0.2.2rc1" too
                      for part in spm.__version__.split(".")[:3]) >= (0, 2, 2)
_WITH_OFFSETS = {"return_type": "proto"} if _BYTE_OFFSETS else {"out_type": "immutable_proto"}


def _spans_of(processor: spm.SentencePieceProcessor, text: str, shift: int = 0
              ) -> tuple[list[int], list[tuple[int, int]]]:
    """(ids, character spans) of `text` from SentencePiece's offsets of each piece's
    surface, leading spaces left out."""
    pieces = processor.encode(text, **_WITH_OFFSETS).pieces
    char_at = _char_offsets(text) if _BYTE_OFFSETS else range(len(text) + 1)
    spans = []
    for piece in pieces:
        start, end = char_at[piece.begin], char_at[piece.end]
        start += len(text[start:end]) - len(text[start:end].lstrip())
        spans.append((start + shift, max(start, end) + shift))
    return [piece.id for piece in pieces], spans


def _char_offsets(text: str) -> list[int]:
    """For each UTF-8 byte offset of `text` (and its end), the character it falls in."""
    offsets = []
    for i, char in enumerate(text):
        offsets += [i] * len(char.encode("utf-8"))
    return offsets + [len(text)]


def _named_processor(model_bytes: bytes, name: str) -> spm.SentencePieceProcessor:
    try:
        return _processor(model_bytes, name)
    except DataError as err:
        raise DataError(f"{name}: {err}") from None


def read_special_tokens(path: Path) -> dict[str, str]:
    """The special-token pieces a transformers tokenizer file (special_tokens_map.json,
    tokenizer_config.json) names, as {"eos_token": "</s>", ...}."""
    names = _read_json(path)
    if not isinstance(names, dict):
        raise DataError(f"{path} must be a JSON object naming the special tokens, such as "
                        '{"eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>"}')
    special = {}
    for name, value in names.items():
        if isinstance(value, dict):  # transformers' AddedToken form
            value = value.get("content")
        if name in SPECIAL_TOKENS and isinstance(value, str):
            special[name] = value
    return special


def _read_json(path: Path):
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as err:
        raise DataError(f"{path} is not valid JSON ({err})") from None


def load_tokenizer(path: str | Path) -> TokenizerBase:
    """The tokenizer in a model or run directory (either layout), or a `.model` file."""
    path = Path(path)
    if path.is_dir() and (path / VOCAB_FILE).is_file():
        return VocabTokenizer.load(path)
    return Tokenizer.load(path)


def tokenizer_present(directory: str | Path) -> bool:
    """Whether `directory` holds a tokenizer's files (either layout)."""
    directory = Path(directory)
    return (directory / MODEL_FILE).is_file() or (directory / VOCAB_FILE).is_file()


def train_tokenizer(texts: Iterable[str], config: TokenizerConfig = TokenizerConfig()
                    ) -> Tokenizer:
    """Train a joint SentencePiece model on `texts` (source and target sentences).

    SentencePiece keeps a random sample of at most `config.max_sentences` sentences, so
    `texts` may be far larger than memory. `config.vocab_size` is the most pieces: a text too
    small for them gets the most SentencePiece can make from it (one info line says so), read
    a second time, so `texts` is then re-iterable (a list, or an object whose `__iter__` reads
    the text again); a one-shot iterator gets a `DataError` naming the size that works, as does
    a vocabulary too small for the text's characters.

    SentencePiece's most for BPE is far more pieces than its segmentation of a small text
    uses: BPE merges on until each word is one piece, and the pieces merged on the way stay in
    the vocabulary unused. A BPE model is kept as trained (no size makes every merged piece
    used, so none is chosen for the user); one info line counts the merged pieces that never
    occur in the segmentation of `texts` (read again to count them: not for a one-shot
    iterator), and where they are more than a quarter, names the size the text uses.
    """
    tokenizer = _train_most(texts, config)
    if config.model_type == "bpe" and iter(texts) is not texts:
        unused, merged = _unused_merges(tokenizer, texts)
        advice = ""
        if unused > merged * MOST_UNUSED_MERGES:
            advice = (f"; --vocab-size {config.vocab_size} is more than this text supports: "
                      f"about {tokenizer.vocab_size - unused} suits it (or --tokenizer-type "
                      "unigram, which is fitted to the text)")
        log.info("BPE: %d of the %d merged pieces never occur in the segmentation of the "
                 "training text (the model never sees them)%s", unused, merged, advice)
    return tokenizer


# BPE on a text large enough for the size leaves about 3% (8,000 pieces on Multi30k's 29,000
# pairs) to 16% (32,000 pieces) of its merged pieces unused.
MOST_UNUSED_MERGES = 0.25


def _unused_merges(tokenizer: Tokenizer, texts: Iterable[str]) -> tuple[int, int]:
    """(merged pieces that the segmentation of `texts` never uses, merged pieces): a merged
    piece is a normal one (no byte, special or unused piece) of more than one character."""
    processor, used = tokenizer.processor, set()
    lines = iter(texts)
    while chunk := list(itertools.islice(lines, 10_000)):
        used.update(i for row in processor.encode(chunk) for i in row)
    merged = [i for i in range(tokenizer.vocab_size) if len(processor.id_to_piece(i)) > 1 and
              not (processor.is_byte(i) or processor.is_control(i) or processor.is_unknown(i)
                   or processor.is_unused(i))]
    return sum(i not in used for i in merged), len(merged)


def _train_most(texts: Iterable[str], config: TokenizerConfig) -> Tokenizer:
    """A model of `config.vocab_size` pieces, or of the most SentencePiece can make."""
    try:
        return _train(texts, config.vocab_size, config)
    except _TooManyPieces as err:
        fitted = err.most
    if iter(texts) is texts:
        raise DataError(
            f"--vocab-size {config.vocab_size} is too large for this training text: "
            f"SentencePiece can make at most {fitted} pieces; use --vocab-size {fitted} or "
            "less (or more training data)")
    log.info("--vocab-size %d is more pieces than SentencePiece can make from this training "
             "text: using its most, %d (more text allows more)", config.vocab_size, fitted)
    try:
        return _train(texts, fitted, config)
    except _TooManyPieces:
        raise DataError(f"SentencePiece could not make {fitted} pieces from this training "
                        "text, the most it said it could; use a smaller --vocab-size") from None


class _TooManyPieces(Exception):
    """SentencePiece refused a vocabulary size above `most`, the largest it can make."""

    def __init__(self, most: int):
        super().__init__(most)
        self.most = most


def _train(texts: Iterable[str], vocab_size: int, config: TokenizerConfig) -> Tokenizer:
    spm.set_random_generator_seed(config.seed)
    model = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(texts),
            model_writer=model,
            model_type=config.model_type,
            vocab_size=vocab_size,
            character_coverage=config.character_coverage,
            input_sentence_size=config.max_sentences,
            shuffle_input_sentence=True,
            byte_fallback=True,
            pad_id=PAD_ID, unk_id=UNK_ID, bos_id=BOS_ID, eos_id=EOS_ID,
            num_threads=os.cpu_count() or 1,
            minloglevel=2,
        )
    except RuntimeError as err:
        limit = re.search(r"<=\s*(\d+)", str(err))
        if "Vocabulary size" in str(err) and limit:
            raise _TooManyPieces(int(limit.group(1))) from None
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
    return DataError(f"SentencePiece training failed: {err}")
