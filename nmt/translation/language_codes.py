"""Language codes as the rules keyed by language read them: "pt-BR", "zh_Hant", "DE" and
"jpn_Jpan" (FLORES and NLLB write codes so) name the languages "pt", "zh", "de" and "ja" that
sentence splitting and BLEU's tokenizers know."""

from __future__ import annotations

import re

# ISO 639-2 (bibliographic and terminological) and 639-3 codes, as their two-letter codes: the
# languages treated apart (sentence splitting: no space between sentences, their own stops,
# ordinals, titles, quotes; BLEU: their word segmenters), then widely translated others.
_TWO_LETTER = {
    **dict.fromkeys(("zho", "chi", "cmn"), "zh"), "jpn": "ja", "kor": "ko", "tha": "th",
    "lao": "lo", "khm": "km", **dict.fromkeys(("mya", "bur"), "my"),
    **dict.fromkeys(("fra", "fre"), "fr"), **dict.fromkeys(("deu", "ger"), "de"),
    "dan": "da", "nob": "nb", "nno": "nn", "nor": "no", "fin": "fi",
    **dict.fromkeys(("isl", "ice"), "is"), "fao": "fo", **dict.fromkeys(("est", "ekk"), "et"),
    **dict.fromkeys(("lav", "lvs"), "lv"), **dict.fromkeys(("ces", "cze"), "cs"),
    **dict.fromkeys(("slk", "slo"), "sk"), "pol": "pl", "slv": "sl", "hrv": "hr", "bos": "bs",
    "srp": "sr", "hun": "hu", "tur": "tr", **dict.fromkeys(("eus", "baq"), "eu"),
    "eng": "en", "spa": "es", "por": "pt", "ita": "it", **dict.fromkeys(("nld", "dut"), "nl"),
    "swe": "sv", "rus": "ru", "ukr": "uk", "bul": "bg", **dict.fromkeys(("ron", "rum"), "ro"),
    "cat": "ca", **dict.fromkeys(("ell", "gre"), "el"), "ara": "ar", "heb": "he",
    **dict.fromkeys(("fas", "per", "pes"), "fa"), "hin": "hi", "vie": "vi", "ind": "id",
}


def base_language(code: str) -> str:
    """The lower-case base of `code` (pt-BR -> pt), and a three-letter code (ISO 639-2 or
    639-3) as the language's two-letter one where `_TWO_LETTER` has it (jpn_Jpan -> ja, zho
    -> zh, deu -> de); an unknown base as it is."""
    base = re.split(r"[-_]", code.strip().lower(), maxsplit=1)[0]
    return _TWO_LETTER.get(base, base)
