"""Which language a text is in, among those a server translates from: /detect and
`"source": "auto"`.

py3langid (langid.py's naive Bayes over byte n-grams, 97 languages), restricted to the
languages served: as accurate as lingua on our test sets' sentences and their first three
words, four times faster and a twentieth of its size (docs/performance.md, "Language
identification"). A served code is matched by its base (`pt-BR` -> `pt`); a served language
py3langid does not know is never detected (the server says so at start).

The text is NFKC-normalised first: half-width ｶﾀｶﾅ and full-width Ｌａｔｉｎ are rare forms of
common letters, and are read as those (ｶﾀｶﾅ was Chinese). A script that only one served
language writes settles it whatever the n-grams say: kana is Japanese, Hangul Korean (the
script with more letters, where a text holds both), the others following with confidence 0;
kanji alone, shared with Chinese, is left to the ranking.
"""

from __future__ import annotations

import logging
import re
import unicodedata
from collections.abc import Sequence

from py3langid.langid import MODEL_FILE, LanguageIdentifier as NaiveBayes

from nmt.translation.paragraphs import has_letters

log = logging.getLogger("nmt.serving")
# The letters of scripts that one language writes: kana (not the "・" Chinese uses too) and
# Hangul (syllables and jamo).
_SCRIPTS = {"ja": re.compile(r"[\u3041-\u309f\u30a1-\u30fa\u30fc-\u30ff\u31f0-\u31ff]"),
            "ko": re.compile(r"[\uac00-\ud7a3\u1100-\u11ff\u3131-\u318e]")}


class LanguageIdentifier:
    """Detects the language of texts among `languages` (the codes served)."""

    def __init__(self, languages: Sequence[str]):
        self._model = NaiveBayes.from_model_file(MODEL_FILE, norm_probs=True)
        known = set(self._model.labels)
        self._codes: dict[str, str] = {}  # py3langid's code -> the code served
        for code in languages:
            base = re.split(r"[-_]", code.lower(), maxsplit=1)[0]
            if base in known:
                self._codes.setdefault(base, code)
            else:
                log.warning("language %s: the language identifier does not know it; /detect "
                            "and source auto never answer it", code)
        if self._codes:
            self._model.set_languages(sorted(self._codes))

    def detect(self, text: str, limit: int = 3) -> list[tuple[str, float]]:
        """Up to `limit` (code served, confidence 0-1), best first; [] for a text without
        letters or without anything that tells the languages apart, or when no served
        language is known."""
        if not self._codes or not has_letters(text):
            return []
        text = unicodedata.normalize("NFKC", text)
        ranked = [(self._codes[code], float(probability))
                  for code, probability in self._model.rank(text)]
        written = self._by_script(text)
        if written is not None:  # certain: the others, in their order, have no chance
            others = [(code, 0.0) for code, _ in ranked if code != written]
            return [(written, 1.0), *others][:limit]
        if len(ranked) > 1 and ranked[0][1] - ranked[-1][1] < 1e-6:
            return []  # every language alike: nothing in the text told them apart ("ok")
        return ranked[:limit]

    def _by_script(self, text: str) -> str | None:
        """The served code of the language whose own script `text` is written in, or None
        (no such script, or its language not served)."""
        counts = {base: len(letters.findall(text)) for base, letters in _SCRIPTS.items()
                  if base in self._codes}
        base = max(counts, key=counts.get, default=None)
        return self._codes[base] if base is not None and counts[base] else None
