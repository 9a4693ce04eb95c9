"""The models one server holds, one per language pair, and how a request finds its model."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from nmt.serving.batching import Batcher
from nmt.serving.errors import RequestError, shown

# Names for GET /languages (LibreTranslate lists {"code", "name", "targets"}); a code not
# here is named by itself.
LANGUAGE_NAMES = {
    "ar": "Arabic", "bg": "Bulgarian", "ca": "Catalan", "cs": "Czech", "da": "Danish",
    "de": "German", "el": "Greek", "en": "English", "es": "Spanish", "et": "Estonian",
    "eu": "Basque", "fa": "Persian", "fi": "Finnish", "fr": "French", "ga": "Irish",
    "he": "Hebrew", "hi": "Hindi", "hr": "Croatian", "hu": "Hungarian", "id": "Indonesian",
    "is": "Icelandic", "it": "Italian", "ja": "Japanese", "ko": "Korean", "lt": "Lithuanian",
    "lv": "Latvian", "nb": "Norwegian Bokmål", "nl": "Dutch", "pl": "Polish",
    "pt": "Portuguese", "ro": "Romanian", "ru": "Russian", "sk": "Slovak", "sl": "Slovenian",
    "sq": "Albanian", "sr": "Serbian", "sv": "Swedish", "th": "Thai", "tr": "Turkish",
    "uk": "Ukrainian", "vi": "Vietnamese", "zh": "Chinese",
}


@dataclasses.dataclass
class ServedModel:
    """A loaded model and its batcher, serving one language pair."""

    id: int  # OpenNMT-py's model id: its position among the --model flags
    source: str
    target: str
    path: str
    translator: Any  # nmt.models.translator.Translator, or CTranslate2Translator
    # The same model searching for n-best lists, for requests that ask for alternatives
    # (`alternatives_search`); None where the server gives none (--alternatives-limit 0).
    alternatives: Any | None = None
    batcher: Batcher | None = None  # made once the event loop runs
    alternatives_batcher: Batcher | None = None

    @property
    def pair(self) -> str:
        """The pair as /health and the metrics label it ("de-en")."""
        return f"{self.source}-{self.target}"

    @property
    def direction(self) -> str:
        """The pair as messages name it, readable with codes that hold a hyphen too
        ("pt-BR->zh-Hant", where "pt-BR-zh-Hant" could be cut anywhere)."""
        return f"{self.source}->{self.target}"


class Catalog:
    """Served models by language pair (LibreTranslate) and by id (OpenNMT-py)."""

    def __init__(self, models: Sequence[ServedModel]):
        self.models = list(models)
        self._by_pair = {(m.source, m.target): m for m in self.models}

    def pairs(self) -> str:
        return ", ".join(m.direction for m in self.models)

    def find(self, source: str, target: str) -> ServedModel:
        """The model for source -> target; RequestError (400) naming the pairs served if
        there is none."""
        model = self._by_pair.get((source, target))
        if model is None:
            raise RequestError(400, f"no model for {_code(source)}->{_code(target)}: this "
                                    f"server translates {self.pairs()}")
        return model

    def by_id(self, model_id: object) -> ServedModel:
        """The model with OpenNMT-py id `model_id`; None (no id given) is id 0, as
        OpenNMT-py reads it, or the only model served."""
        if model_id is None and len(self.models) == 1:
            return self.models[0]
        model_id = 0 if model_id is None else model_id
        if isinstance(model_id, int) and not isinstance(model_id, bool):
            for model in self.models:
                if model_id == model.id:
                    return model
        ids = ", ".join(f"{m.id} ({m.direction})" for m in self.models)
        raise RequestError(400, f"no model with id {shown(model_id)}: the ids served are {ids}")

    def languages(self) -> list[dict]:
        """LibreTranslate's GET /languages: each source with the targets it translates to."""
        out: dict[str, dict] = {}
        for m in self.models:
            entry = out.setdefault(m.source, {"code": m.source,
                                              "name": language_name(m.source), "targets": []})
            entry["targets"].append(m.target)
        for m in self.models:  # a language served only as a target is listed too
            out.setdefault(m.target, {"code": m.target, "name": language_name(m.target),
                                      "targets": []})
        return list(out.values())


def _code(text: str) -> str:
    """A language code as an error message quotes it: as it is if short and printable."""
    return text if len(text) <= 20 and text.isprintable() else shown(text)


def language_name(code: str) -> str:
    """The name of the language of `code`, with the region or script the code gives
    ("Portuguese (BR)", "Chinese (Hant)"), so that variants served side by side are told
    apart in a menu; a code whose language is not known here is named by itself."""
    language, *variant = [part for part in code.replace("_", "-").split("-") if part] or [""]
    name = LANGUAGE_NAMES.get(language.lower())
    if name is None:
        return code
    return f"{name} ({', '.join(variant)})" if variant else name
