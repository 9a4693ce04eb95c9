"""How well a model's cross-attention places inline markup: on sentences whose right answer
is known.

The checked set is built from a test set's sources and the model's own translations: a
source word from a small English-German dictionary (below) that occurs once in its sentence,
whose dictionary translation occurs once in the model's translation, is the word a tag
around the source word must end up around. For each such word the script reports, per
decoder layer and row choice (the step that predicts a target token, or the one that reads
it: Chen et al. 2020's shift), how often the target words aligned to it are exactly that
word; and, end to end, how often `<b>` put around the source word in HTML comes back around
exactly the dictionary word.

    python -m bench.alignment --model runs/multi30k/averaged \\
        --source ../shared/data/multi30k/test2016.en
"""

from __future__ import annotations

import dataclasses
import re
import time

import numpy as np

from bench.common import bench_parser, positive_int, usage_errors

# English word -> its German translations as a Multi30k model writes them (noun and
# adjective forms); a pair is checked only where exactly one of them occurs.
DICTIONARY = {
    "man": ["Mann"], "men": ["Männer"], "woman": ["Frau"], "women": ["Frauen"],
    "dog": ["Hund"], "dogs": ["Hunde"], "girl": ["Mädchen"], "boy": ["Junge"],
    "boys": ["Jungen", "Jungs"], "child": ["Kind"], "children": ["Kinder"],
    "street": ["Straße"], "water": ["Wasser"], "ball": ["Ball"], "bicycle": ["Fahrrad"],
    "bike": ["Fahrrad"], "shirt": ["Hemd", "T-Shirt"], "hat": ["Hut"], "beach": ["Strand"],
    "snow": ["Schnee"], "grass": ["Gras", "Rasen"], "car": ["Auto"], "building": ["Gebäude"],
    "table": ["Tisch"], "guitar": ["Gitarre"], "crowd": ["Menschenmenge", "Menge"],
    "field": ["Feld"], "city": ["Stadt"], "horse": ["Pferd"], "camera": ["Kamera"],
    "tree": ["Baum"], "jacket": ["Jacke"], "dress": ["Kleid"], "baby": ["Baby"],
    "stage": ["Bühne"], "park": ["Park"], "rock": ["Felsen"], "bench": ["Bank"],
    "red": ["rot", "rote", "roten", "roter", "rotes", "rotem"],
    "blue": ["blau", "blaue", "blauen", "blauer", "blaues", "blauem"],
    "black": ["schwarz", "schwarze", "schwarzen", "schwarzer", "schwarzes", "schwarzem"],
    "white": ["weiß", "weiße", "weißen", "weißer", "weißes", "weißem"],
    "green": ["grün", "grüne", "grünen", "grüner", "grünes", "grünem"],
    "young": ["jung", "junge", "jungen", "junger", "junges", "jungem"],
    "small": ["klein", "kleine", "kleinen", "kleiner", "kleines", "kleinem"],
    "playing": ["spielt", "spielen", "spielende", "spielenden"],
    "sitting": ["sitzt", "sitzen", "sitzende", "sitzenden"],
    "standing": ["steht", "stehen", "stehende", "stehenden"],
}
_WORD = re.compile(r"\w+(?:-\w+)*")


@dataclasses.dataclass(frozen=True)
class Case:
    source: str
    target: str
    source_word: tuple[int, int]  # [start, end) in source
    target_word: tuple[int, int]  # the answer, in target


def checked_cases(sources: list[str], targets: list[str]) -> list[Case]:
    cases = []
    for source, target in zip(sources, targets):
        words = [(m.group().lower(), m.span()) for m in _WORD.finditer(source)]
        found = [(m.group(), m.span()) for m in _WORD.finditer(target)]
        for word, span in words:
            if word not in DICTIONARY or sum(w == word for w, _ in words) != 1:
                continue
            hits = [s for w, s in found if w in DICTIONARY[word]]
            if len(hits) == 1:
                cases.append(Case(source, target, span, hits[0]))
    return cases


def hull_of_aligned(alignment, source_word: tuple[int, int], text: str, both: bool = True
                    ) -> tuple[int, int] | None:
    """The target words aligned into the source word's tokens, [start, end) extended to whole
    words, or None. Aligned: each target token to its argmax source token; with `both`, only
    those that are also the argmax target token of one of the source tokens (the union where
    none is both), the rule `nmt.models.alignment.aligned_targets` uses."""
    from nmt.models.alignment import aligned_targets

    inside = [i for i, (a, b) in enumerate(alignment.source_spans)
              if a < source_word[1] and b > source_word[0]]
    if both:
        chosen = aligned_targets(alignment.weights, inside)
    else:
        chosen = [j for j in range(len(alignment.target_spans))
                  if int(alignment.weights[j].argmax()) in inside]
    picked = [alignment.target_spans[j] for j in chosen
              if alignment.target_spans[j][1] > alignment.target_spans[j][0]]
    if not picked:
        return None
    start, end = min(a for a, _ in picked), max(b for _, b in picked)
    while start > 0 and text[start - 1].isalnum():
        start -= 1
    while end < len(text) and text[end].isalnum():
        end += 1
    return start, end


def layer_table(translator, cases: list[Case], layers: int
                ) -> list[tuple[int, bool, float, float]]:
    """(layer from 1, shifted, share right by target argmax, share right by both argmaxes)."""
    from nmt.models.alignment import align

    rows = []
    sources, targets = [c.source for c in cases], [c.target for c in cases]
    for layer in range(-layers, 0):
        for shifted in (False, True):
            found = align(translator.graphdef, translator.state, translator.tokenizer,
                          translator.buckets, sources, targets, layer, shifted)
            shares = [sum(hull_of_aligned(a, c.source_word, c.target, both) == c.target_word
                          for a, c in zip(found, cases)) / len(cases) for both in (False, True)]
            rows.append((layers + layer + 1, shifted, *shares))
    return rows


def placement_accuracy(translator, cases: list[Case]) -> tuple[float, float]:
    """(share of `<b>` tags around exactly the answer word, seconds per sentence) through
    split_html and join with the translator's alignment."""
    from nmt.translation.paragraphs import split_html

    start, right = time.perf_counter(), 0
    for case in cases:
        a, b = case.source_word
        markup = f"{case.source[:a]}<b>{case.source[a:b]}</b>{case.source[b:]}"
        document = split_html(markup, "en")
        translations = translator.translate(document.sentences)
        alignments = dict(zip(document.needs_alignment, translator.align(
            [document.sentences[i] for i in document.needs_alignment],
            [translations[i] for i in document.needs_alignment])))
        out = document.join(translations, alignments)
        x, y = case.target_word
        right += f"<b>{case.target[x:y]}</b>" in out
    return right / len(cases), (time.perf_counter() - start) / len(cases)


def main() -> None:
    parser = bench_parser(__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="an English-German model directory")
    parser.add_argument("--source", required=True, help="English sentences, one per line")
    parser.add_argument("--lines", type=positive_int, default=1000,
                        help="sentences read (default 1000)")
    args = parser.parse_args()

    from data.lines import read_lines
    from nmt.models.model_dir import load_models
    from nmt.models.translator import Translator

    with usage_errors():
        model, tokenizer, values = load_models([args.model])
        sources = read_lines(args.source)[:args.lines]
    translator = Translator(model, tokenizer, values["search"])
    targets = translator.translate(sources)
    cases = checked_cases(sources, targets)
    print(f"{len(cases)} checked words in {len(sources)} sentences")
    if not cases:
        parser.error(f"--source {args.source}: no word of its first {len(sources)} lines is "
                     "one whose translation this benchmark knows; give English sentences "
                     "(and an English-German --model)")
    print("layer | row         | exactly the answer: target argmax | both argmaxes")
    for layer, shifted, one, both in layer_table(translator, cases,
                                                 model.config.decoder_layers):
        print(f"{layer:5d} | {'reads it   ' if shifted else 'predicts it'} | {one:32.1%} | "
              f"{both:.1%}")
    share, seconds = placement_accuracy(translator, cases)
    print(f"<b> placed around exactly the answer: {share:.1%} "
          f"({seconds * 1000:.0f} ms per sentence, translation included)")


if __name__ == "__main__":
    np.set_printoptions(precision=3)
    main()
