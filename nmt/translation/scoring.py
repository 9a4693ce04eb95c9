"""Scoring translations with sacreBLEU: BLEU and chrF on detokenized, cased text.

Scores equal what the `sacrebleu` command prints for the same files, with BLEU tokenized as
`sacrebleu -l SRC-TGT` would for the target language. Used by validation during training and
by `translate.py --evaluate`.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Sequence

from nmt.translation.language_codes import base_language

if TYPE_CHECKING:
    import sacrebleu


@dataclasses.dataclass(frozen=True)
class Scores:
    bleu: float
    chrf: float
    bleu_signature: str
    chrf_signature: str
    bleu_details: str  # sacreBLEU's one-line summary: n-gram precisions, BP, ratio, lengths

    def to_dict(self) -> dict[str, float | str]:
        return dataclasses.asdict(self)


# The tokenizer sacreBLEU's command line picks for a target language (`sacrebleu -l SRC-TGT`):
# a word segmenter for Chinese, Japanese and Korean, written without spaces between words (13a
# would score each of their sentences as one or a few "words"), and 13a for every other language.
_BLEU_TOKENIZER_FOR_LANGUAGE = {"zh": "zh", "ja": "ja-mecab", "ko": "ko-mecab"}
_PIP_EXTRA_FOR_TOKENIZER = {"ja-mecab": "ja", "ko-mecab": "ko"}  # pip install 'sacrebleu[ja]'


class MetricError(ValueError):
    """A BLEU tokenizer that is unknown or cannot run here (a missing optional package)."""


def bleu_tokenizer_for(target_language: str | None) -> str:
    """The tokenizer for a target language code: ja -> ja-mecab, zh -> zh, ko -> ko-mecab,
    as sacreBLEU picks them, and also for region and three-letter forms ("ja-JP", "zh_TW",
    "jpn_Jpan", "kor"), which sacreBLEU leaves at 13a; anything else (or None) -> 13a."""
    return _BLEU_TOKENIZER_FOR_LANGUAGE.get(base_language(target_language or ""), "13a")


def bleu_metric(target_language: str | None = None, tokenize: str | None = None
                ) -> sacrebleu.BLEU:
    """sacreBLEU's BLEU (cased, detokenized input) with `tokenize`, or by default the tokenizer
    `bleu_tokenizer_for(target_language)`. MetricError if that tokenizer is unknown or cannot
    be set up (Japanese and Korean need MeCab: `pip install 'sacrebleu[ja]'` / `[ko]`)."""
    import sacrebleu  # here, not at the top: translating one line need not wait for it

    name = tokenize or bleu_tokenizer_for(target_language)
    if name not in sacrebleu.BLEU.TOKENIZERS:
        raise MetricError(f"unknown BLEU tokenizer {name!r}; choose one of "
                          f"{', '.join(sacrebleu.BLEU.TOKENIZERS)}.")
    try:
        return sacrebleu.BLEU(tokenize=name)
    except (AssertionError, ImportError, OSError, RuntimeError) as err:
        # RuntimeError: MeCab is missing; AssertionError: MeCab has another dictionary than
        # sacreBLEU requires; OSError: spm/flores models cannot be downloaded.
        # A given tokenizer is named by the flag that bleu_settings puts in front.
        chosen = ("" if tokenize else
                  f" (sacreBLEU's choice for target language {target_language!r})")
        extra = _PIP_EXTRA_FOR_TOKENIZER.get(name)
        why = (f"needs MeCab: pip install 'sacrebleu[{extra}]' (or pip install -e '.[cjk]')"
               if extra else f"cannot be set up here ({type(err).__name__}: "
                             f"{str(err).strip()})")
        raise MetricError(f"BLEU tokenizer {name}{chosen} {why}; or pick another BLEU "
                          "tokenizer: --bleu-tokenize char scores characters and needs "
                          "nothing.") from None


def bleu_settings(target_language: str | None, bleu_tokenize: str | None
                  ) -> dict[str, str | None]:
    """The keyword arguments of `evaluate` that choose BLEU's tokenizer, checked first:
    MetricError if it is unknown or cannot run here (MeCab missing), before any translating
    or training; one given as `bleu_tokenize` is named by its flag, --bleu-tokenize."""
    try:
        bleu_metric(target_language, bleu_tokenize)
    except MetricError as err:
        raise MetricError(f"--bleu-tokenize: {err}" if bleu_tokenize else str(err)) from None
    return {"target_language": target_language, "bleu_tokenize": bleu_tokenize}


def evaluate(hypotheses: Sequence[str], references: Sequence[str],
             target_language: str | None = None, bleu_tokenize: str | None = None) -> Scores:
    """Corpus BLEU and chrF of detokenized, cased text, as the `sacrebleu` command scores it.

    BLEU tokenizes with `bleu_tokenize`, or by default with sacreBLEU's choice for
    `target_language` (see `bleu_metric`); chrF works on characters and needs no tokenizer.
    """
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses but {len(references)} references; "
                         "the source and reference files must have the same number of lines.")
    import sacrebleu

    bleu, chrf = bleu_metric(target_language, bleu_tokenize), sacrebleu.CHRF()
    bleu_score = bleu.corpus_score(list(hypotheses), [list(references)])
    chrf_score = chrf.corpus_score(list(hypotheses), [list(references)])
    return Scores(bleu=bleu_score.score, chrf=chrf_score.score,
                  bleu_signature=str(bleu.get_signature()),
                  chrf_signature=str(chrf.get_signature()),
                  bleu_details=str(bleu_score))
