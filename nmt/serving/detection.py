"""Which language a text is in, among those a server translates from: /detect and
`"source": "auto"`.

py3langid (langid.py's naive Bayes over byte n-grams, 97 languages), restricted to the
languages served: as accurate as lingua on our test sets' sentences and their first three
words, four times faster and a twentieth of its size (docs/performance.md, "Language
identification"). A served code is matched by its base (`pt-BR` -> `pt`); a served language
py3langid does not know is never detected (the server says so at start).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence

from py3langid.langid import MODEL_FILE, LanguageIdentifier as NaiveBayes

log = logging.getLogger("nmt.serving")
_LETTER = re.compile(r"[^\W\d_]")


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
        if not self._codes or not _LETTER.search(text):
            return []
        ranked = self._model.rank(text)
        if len(ranked) > 1 and ranked[0][1] - ranked[-1][1] < 1e-6:
            return []  # every language alike: nothing in the text told them apart ("ok")
        return [(self._codes[code], float(probability)) for code, probability in ranked[:limit]]
