"""Benchmark the data pipeline: `python -m bench.pipeline [--synthetic N] [--long-tail N]`.

For Multi30k en-de (from $MULTI30K as the recipes read it, else data/multi30k) and, with
`--synthetic N`, a made-up corpus of N pairs (`--long-tail N`: with a few very long
sentences), prints one JSON line per corpus and batch layout: time to read, to train
SentencePiece and to encode (uncached, then cached); then, for bucketed batches and for
packed rows of each `--pack-widths` width, the padding waste and number of (B, S, T) shapes
of an epoch's plan, and the batches/s and target tokens/s the training iterator delivers.
The encoding cache goes to a temporary directory, so every run measures a cold encode.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np

from data.batching import BatchIterator, load_examples, plan_stats
from data.config import BatchConfig, CorpusSpec, TokenizerConfig
from data.corpus import iter_text, load_corpus
from data.encoding import encode_corpus
from data.tokenizer import train_tokenizer

MULTI30K = Path(os.environ.get("MULTI30K", "data/multi30k"))  # as the recipes read it


def synthetic_prefix(directory: Path, n_pairs: int, seed: int = 0, long_tail: bool = False
                     ) -> Path:
    """Write `n_pairs` made-up sentence pairs as PREFIX.en / PREFIX.de and return PREFIX.

    Words are drawn from a Zipf-like vocabulary of 30,000 random letter strings; sentences
    have 3 to 40 words, or with `long_tail` a log-normal number (median 12, one in a hundred
    over 60, at most 150); the target maps each word to another made-up word and reverses the
    order, so the two sides have similar but not equal token counts.
    """
    rng = np.random.default_rng(seed)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyzäöü"))
    words = ["".join(rng.choice(letters, rng.integers(2, 11))) for _ in range(30_000)]
    mapped = ["".join(rng.choice(letters, rng.integers(2, 13))) for _ in range(30_000)]
    weights = 1.0 / np.arange(1, 30_001)
    weights /= weights.sum()
    prefix = directory / "synthetic"
    with open(f"{prefix}.en", "w", encoding="utf-8") as src, \
            open(f"{prefix}.de", "w", encoding="utf-8") as tgt:
        for start in range(0, n_pairs, 10_000):
            count = min(10_000, n_pairs - start)
            lengths = (np.clip(rng.lognormal(np.log(12), 0.7, count), 3, 150).astype(int)
                       if long_tail else rng.integers(3, 41, count))
            ids = rng.choice(30_000, int(lengths.sum()), p=weights)
            for sentence in np.split(ids, np.cumsum(lengths)[:-1]):
                src.write(" ".join(words[i] for i in sentence).capitalize() + ".\n")
                tgt.write(" ".join(mapped[i] for i in sentence[::-1]).capitalize() + ".\n")
    return prefix


def timed(fn, *args, **kwargs):
    start = time.perf_counter()
    result = fn(*args, **kwargs)
    return result, time.perf_counter() - start


def iterate(examples, config: BatchConfig, max_batches: int) -> dict:
    """Time the training iterator over one epoch (at most `max_batches` batches)."""
    iterator = BatchIterator(examples, config, process_index=0, process_count=1)
    n_batches = min(max_batches, len(iterator.plan(0)))
    tgt_tokens = 0
    start = time.perf_counter()
    for _ in range(n_batches):
        batch = next(iterator)
        tgt_tokens += int(np.count_nonzero(batch["tgt_out"]))
    seconds = time.perf_counter() - start
    return {
        "batches_timed": n_batches,
        "batches_per_s": round(n_batches / seconds, 1),
        "tgt_tokens_per_s": round(tgt_tokens / seconds),
    }


def layouts(args: argparse.Namespace) -> list[tuple[str, BatchConfig]]:
    """Bucketed batches, then packed rows of each width, all with --batch-tokens and
    --max-len."""
    common = {"batch_tokens": args.batch_tokens, "max_len": args.max_len}
    out = [("bucketed", BatchConfig(packing=False, **common))]
    for width in args.pack_widths:
        out.append((f"packed {width}", BatchConfig(pack_width=width, **common)))
    return out


def bench_corpus(name: str, spec: CorpusSpec, args: argparse.Namespace, extra: dict
                 ) -> list[dict]:
    """Read, tokenize, encode and batch one corpus; return one record per batch layout."""
    corpus, read_s = timed(load_corpus, spec)
    tokenizer_config = TokenizerConfig(vocab_size=args.vocab_size,
                                       max_sentences=args.max_sentences)
    tokenizer, spm_s = timed(train_tokenizer, iter_text(corpus["train"]), tokenizer_config)
    records = []
    with tempfile.TemporaryDirectory() as cache:
        encoded, encode_s = timed(encode_corpus, corpus, tokenizer, cache_dir=cache)
        _, cached_s = timed(encode_corpus, corpus, tokenizer, cache_dir=cache)
        preparation = {
            "corpus": name, **extra,
            "train_pairs": len(corpus["train"]), "vocab_size": tokenizer.vocab_size,
            "batch_tokens": args.batch_tokens, "max_len": args.max_len,
            "read_s": round(read_s, 2), "spm_train_s": round(spm_s, 2),
            "encode_s": round(encode_s, 2), "encode_cached_s": round(cached_s, 3),
            "prepare_s": round(spm_s + encode_s, 2)}
        for layout, config in layouts(args):
            examples, examples_s = timed(load_examples, encoded["train"], config)
            stats, plan_s = timed(plan_stats, examples, config)
            records.append({
                **preparation, "layout": layout,
                "kept_pairs": len(examples), "load_examples_s": round(examples_s, 2),
                "plan_epoch_s": round(plan_s, 2),
                "padding_waste": round(stats.padding_waste, 4), "shapes": stats.num_shapes,
                "batches_per_epoch": stats.batches, "all_pad_rows": stats.all_pad_rows,
                **iterate(examples, config, args.max_batches)})
    return records


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--synthetic", type=int, default=0,
                        help="also benchmark a synthetic corpus of N pairs (e.g. 1000000)")
    parser.add_argument("--vocab-size", type=int, default=8000)
    parser.add_argument("--max-sentences", type=int, default=1_000_000,
                        help="SentencePiece training sample (sentences)")
    parser.add_argument("--long-tail", type=int, default=0,
                        help="also benchmark a synthetic corpus of N pairs with a long tail "
                             "of long sentences")
    parser.add_argument("--batch-tokens", type=int, default=4096)
    parser.add_argument("--max-len", type=int, default=128,
                        help="drop pairs longer than this (--max-tokens-per-sentence)")
    parser.add_argument("--pack-widths", type=lambda s: [int(w) for w in s.split(",")],
                        default=[64, 128], help="packed row widths to compare, e.g. 64,128 "
                                                "(each at least --max-len keeps pairs whole)")
    parser.add_argument("--max-batches", type=int, default=2000,
                        help="time at most this many batches")
    args = parser.parse_args(argv)

    too_narrow = [w for w in args.pack_widths if w < args.max_len]
    if too_narrow:
        parser.error(f"--pack-widths {too_narrow} narrower than --max-len {args.max_len}: "
                     "rows must hold the longest pair kept")
    if MULTI30K.is_dir():
        spec = CorpusSpec(train_prefix=str(MULTI30K / "train"),
                          valid_prefix=str(MULTI30K / "valid"))
        for record in bench_corpus("multi30k en-de", spec, args, {}):
            print(json.dumps(record), flush=True)
    else:
        print(json.dumps({"corpus": "multi30k en-de", "skipped": f"{MULTI30K} not found"}))
    for n_pairs, long_tail in ((args.synthetic, False), (args.long_tail, True)):
        if not n_pairs:
            continue
        with tempfile.TemporaryDirectory() as directory:
            prefix, make_s = timed(synthetic_prefix, Path(directory), n_pairs,
                                   long_tail=long_tail)
            name = f"synthetic {n_pairs}" + (" long tail" if long_tail else "")
            for record in bench_corpus(name, CorpusSpec(train_prefix=str(prefix)), args,
                                       {"generate_s": round(make_s, 1)}):
                print(json.dumps(record), flush=True)


if __name__ == "__main__":
    main()
