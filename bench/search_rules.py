"""Beam rules and output limits side by side on a real test set: BLEU, work and speed.

    python -m bench.search_rules --model runs/NAME/averaged \\
        --test-prefix ../shared/data/multi30k/valid --src en --tgt de
    python -m bench.search_rules ... --rules exact k-finished --limits 1,50 1.5,10

Translates the same sentences with every --rules value (SearchConfig.beam_rules) and every
--limits pair a,b (output limit a * source tokens + b), the model's other search settings
(beam, alpha) unless flags say otherwise, and prints one JSON line for each: sacreBLEU BLEU
and chrF, decoder steps summed over batches, row-steps (rows decoded, summed over steps: the
work the search did, finished and PAD rows included until they leave the batch), seconds
and sentences/s after a warm-up pass (compilation not counted), and how many translations
reached their output limit. Steps and BLEU do not depend
on the machine; seconds do, so run nothing else beside it.
"""

from __future__ import annotations

import argparse
import dataclasses
import time

from bench.common import emit, environment, read_test_set, test_set_parser, usage_errors
from nmt.runtime import allocator
from transformer.config import BEAM_RULES


def parse_args() -> argparse.Namespace:
    parser = test_set_parser(__doc__.split("\n\n")[0])
    parser.add_argument("--rules", nargs="+", default=list(BEAM_RULES), choices=BEAM_RULES)
    parser.add_argument("--limits", nargs="+", default=[], metavar="A,B",
                        help="output limits a * source + b to try (default: the model's)")
    parser.add_argument("--beam", type=int, help="beam size (default: the model's)")
    parser.add_argument("--alpha", type=float, help="length penalty (default: the model's)")
    parser.add_argument("--greedy", action="store_true", help="greedy search instead (one run "
                                                              "per limit; rules do not apply)")
    parser.add_argument("--bleu-tokenize", help="sacreBLEU tokenizer (default: by --tgt)")
    return parser.parse_args()


def limit_pairs(texts: list[str]) -> list[tuple[float, int] | None]:
    """'a,b' strings -> (a, b); no pairs -> [None] (the model's own limit)."""
    pairs = []
    for text in texts:
        a, b = text.split(",")
        pairs.append((float(a), int(b)))
    return pairs or [None]


def main() -> None:
    args = parse_args()
    from nmt.models.model_dir import load_model
    from nmt.models.translator import Translator
    from nmt.runtime.compilation import enable_compilation_cache
    from nmt.translation.scoring import MetricError, bleu_settings, evaluate

    enable_compilation_cache()
    with usage_errors(MetricError):  # before anything is timed
        bleu = bleu_settings(args.tgt, args.bleu_tokenize)
        sources, references = read_test_set(args)
        model, tokenizer, values = load_model(args.model)
    stored = values["search"]
    changes = {"beam_size": args.beam, "alpha": args.alpha}
    base = dataclasses.replace(stored, nbest=1,
                               **{k: v for k, v in changes.items() if v is not None})
    if args.greedy:
        base = dataclasses.replace(base, strategy="greedy", beam_size=1)
    rules = ["greedy"] if args.greedy else args.rules
    for rule in rules:
        for limit in limit_pairs(args.limits):
            search = base if args.greedy else dataclasses.replace(base, strategy="beam",
                                                                   beam_rules=rule)
            if limit is not None:
                search = dataclasses.replace(search, max_len_a=limit[0], max_len_b=limit[1])
            translator = Translator(model, tokenizer, search)
            translator.translate(sources)  # warm-up: compilation
            start = time.perf_counter()
            done = translator.translate_all(sources)
            seconds = time.perf_counter() - start
            hypotheses = [nbest[0].text for nbest in done.nbest]
            scores = evaluate(hypotheses, references, **bleu)
            stats = done.batches
            emit({"rules": rule, "max_len_a": search.max_len_a, "max_len_b": search.max_len_b,
                  "beam": search.beam_size, "alpha": search.alpha,
                  "bleu": round(scores.bleu, 2), "chrf": round(scores.chrf, 2),
                  "steps": sum(b.steps for b in stats),
                  "row_steps": sum(b.row_steps for b in stats),
                  "batches": len(stats), "reached_limit": len(done.reached_limit),
                  "seconds": round(seconds, 2),
                  "sentences_per_s": round(len(sources) / seconds, 1),
                  "search_seconds": round(sum(b.seconds for b in stats), 2),
                  "model": str(args.model), "test": args.test_prefix,
                  "sentences": len(sources), "bleu_signature": scores.bleu_signature,
                  **environment()})


if __name__ == "__main__":
    allocator.preload()  # as translate.py: mimalloc under XLA:CPU
    main()
