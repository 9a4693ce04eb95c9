"""Language identifiers for the server's /detect, measured on real sentences: accuracy per
language on whole sentences and on their first three words (clients send short strings
too), time per text, time to build, and the size of each package installed.

Each candidate is restricted to the languages a server serves (--languages), as /detect is.

    python -m bench.language_id --languages en,de,fr,ja,ko
"""

from __future__ import annotations

import argparse
import importlib.metadata
import time
from collections.abc import Callable
from pathlib import Path

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
# Real sentences of each language: (file under ../shared/data, first line read).
SENTENCES = {
    "en": ("multi30k/test2016.en", 0), "de": ("multi30k/test2016.de", 0),
    "fr": ("multi30k/test2016.fr", 0), "ja": ("small_parallel_enja/test.ja", 0),
    "ko": ("korean-english/news_test.ko", 0),
}
LINES = 500


def texts(language: str, short: bool) -> list[str]:
    name, first = SENTENCES[language]
    lines = (DATA / name).read_text("utf-8").splitlines()[first:first + LINES]
    if language == "ja":  # the corpus is word-segmented with spaces; Japanese has none
        lines = [line.replace(" ", "") for line in lines]
    if short:
        lines = [line[:8] if language == "ja" else " ".join(line.split()[:3])
                 for line in lines]
    return [line for line in lines if line.strip()]


def py3langid(languages: list[str]) -> Callable[[str], str]:
    from py3langid.langid import MODEL_FILE, LanguageIdentifier

    identifier = LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)
    identifier.set_languages(languages)
    return lambda text: identifier.classify(text)[0]


def lingua(languages: list[str]) -> Callable[[str], str]:
    from lingua import IsoCode639_1, Language, LanguageDetectorBuilder

    chosen = [Language.from_iso_code_639_1(getattr(IsoCode639_1, code.upper()))
              for code in languages]
    detector = LanguageDetectorBuilder.from_languages(*chosen).build()

    def detect(text: str) -> str:
        found = detector.detect_language_of(text)
        return found.iso_code_639_1.name.lower() if found else ""

    return detect


CANDIDATES = {"py3langid": (py3langid, "py3langid"),
              "lingua": (lingua, "lingua-language-detector")}


def package_megabytes(distribution: str) -> float:
    files = importlib.metadata.distribution(distribution).files or []
    return sum(f.locate().stat().st_size for f in files if f.locate().exists()) / 1e6


def measure(name: str, languages: list[str]) -> dict:
    make, distribution = CANDIDATES[name]
    start = time.perf_counter()
    detect = make(languages)
    detect("warm up")
    built = time.perf_counter() - start
    row = {"candidate": name, "build_s": built, "megabytes": package_megabytes(distribution)}
    seconds = count = 0
    for short in (False, True):
        for language in languages:
            sample = texts(language, short)
            start = time.perf_counter()
            right = sum(detect(text) == language for text in sample)
            seconds += time.perf_counter() - start
            count += len(sample)
            row[f"{language}{' 3 words' if short else ''}"] = right / len(sample)
    row["ms_per_text"] = 1000 * seconds / count
    return row


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.language_id",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--languages", default="en,de,fr,ja,ko")
    args = parser.parse_args()
    languages = args.languages.split(",")
    rows = []
    for name, (_, distribution) in CANDIDATES.items():
        try:
            rows.append(measure(name, languages))
        except ModuleNotFoundError:  # only py3langid is a dependency (the serve extra)
            print(f"{name}: not installed; pip install {distribution} to measure it")
    columns = [c for c in rows[0] if c != "candidate"]
    print("| candidate | " + " | ".join(columns) + " |")
    print("|---" * (len(columns) + 1) + "|")
    for row in rows:
        cells = [f"{row[c]:.1%}" if c[:2] in languages else f"{row[c]:.2f}" for c in columns]
        print(f"| {row['candidate']} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
