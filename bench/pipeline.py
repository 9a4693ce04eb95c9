"""Benchmark the data pipeline: `python -m bench.pipeline [--synthetic N]`.

For Multi30k en-de (from ../shared/data) and, with `--synthetic N`, a made-up corpus of N
pairs, prints one JSON line per corpus with: time to read, to train SentencePiece and to
encode (uncached, then cached), padding waste and number of (B, S, T) shapes of an epoch's
plan, and the batches/s and target tokens/s the training iterator delivers.
The encoding cache goes to a temporary directory, so every run measures a cold encode.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np

from data.batching import BatchIterator, load_examples, plan_stats
from data.config import BatchConfig, CorpusSpec, TokenizerConfig
from data.corpus import iter_text, load_corpus
from data.encoding import encode_corpus
from data.tokenizer import train_tokenizer

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


def synthetic_prefix(directory: Path, n_pairs: int, seed: int = 0) -> Path:
    """Write `n_pairs` made-up sentence pairs as PREFIX.en / PREFIX.de and return PREFIX.

    Words are drawn from a Zipf-like vocabulary of 30,000 random letter strings; sentences
    have 3 to 40 words; the target maps each word to another made-up word and reverses the
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
            lengths = rng.integers(3, 41, count)
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


def bench_corpus(name: str, spec: CorpusSpec, args: argparse.Namespace, extra: dict) -> dict:
    """Read, tokenize, encode and batch one corpus; return the measurements."""
    corpus, read_s = timed(load_corpus, spec)
    tokenizer_config = TokenizerConfig(vocab_size=args.vocab_size,
                                       max_sentences=args.max_sentences)
    tokenizer, spm_s = timed(train_tokenizer, iter_text(corpus["train"]), tokenizer_config)
    with tempfile.TemporaryDirectory() as cache:
        encoded, encode_s = timed(encode_corpus, corpus, tokenizer, cache_dir=cache)
        _, cached_s = timed(encode_corpus, corpus, tokenizer, cache_dir=cache)
        config = BatchConfig(batch_tokens=args.batch_tokens)
        examples, examples_s = timed(load_examples, encoded["train"], config)
        stats, plan_s = timed(plan_stats, examples, config)
        speed = iterate(examples, config, args.max_batches)
    return {
        "corpus": name, **extra,
        "train_pairs": len(corpus["train"]), "vocab_size": tokenizer.vocab_size,
        "batch_tokens": args.batch_tokens,
        "read_s": round(read_s, 2), "spm_train_s": round(spm_s, 2),
        "encode_s": round(encode_s, 2), "encode_cached_s": round(cached_s, 3),
        "prepare_s": round(spm_s + encode_s, 2),
        "load_examples_s": round(examples_s, 2), "plan_epoch_s": round(plan_s, 2),
        "padding_waste": round(stats.padding_waste, 4), "shapes": stats.num_shapes,
        "batches_per_epoch": stats.batches, "all_pad_rows": stats.all_pad_rows,
        **speed,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--synthetic", type=int, default=0,
                        help="also benchmark a synthetic corpus of N pairs (e.g. 1000000)")
    parser.add_argument("--vocab-size", type=int, default=8000)
    parser.add_argument("--max-sentences", type=int, default=1_000_000,
                        help="SentencePiece training sample (sentences)")
    parser.add_argument("--batch-tokens", type=int, default=4096)
    parser.add_argument("--max-batches", type=int, default=2000,
                        help="time at most this many batches")
    args = parser.parse_args(argv)

    multi30k = SHARED_DATA / "multi30k"
    if multi30k.is_dir():
        spec = CorpusSpec(train_prefix=str(multi30k / "train"),
                          valid_prefix=str(multi30k / "valid"))
        print(json.dumps(bench_corpus("multi30k en-de", spec, args, {})), flush=True)
    else:
        print(json.dumps({"corpus": "multi30k en-de", "skipped": f"{multi30k} not found"}))
    if args.synthetic:
        with tempfile.TemporaryDirectory() as directory:
            prefix, make_s = timed(synthetic_prefix, Path(directory), args.synthetic)
            spec = CorpusSpec(train_prefix=str(prefix))
            result = bench_corpus(f"synthetic {args.synthetic}", spec, args,
                                  {"generate_s": round(make_s, 1)})
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
