"""Benchmark the data pipeline: `python -m bench.pipeline [--synthetic N] [--long-tail N]
[--scale N ...]`.

For Multi30k en-de (from $MULTI30K as the recipes read it, else data/multi30k) and, with
`--synthetic N`, a made-up corpus of N pairs (`--long-tail N`: with a few very long
sentences), prints one JSON line per corpus and batch layout: time to read, to train
SentencePiece and to encode (uncached, then cached); then, for bucketed batches and for
packed rows of each `--pack-widths` width, the padding waste and number of (B, S, T) shapes
of an epoch's plan, and the batches/s and target tokens/s the training iterator delivers.
The encoding cache goes to a temporary directory, so every run measures a cold encode.

`--scale N` (repeatable, e.g. `--scale 4500000 --scale 36000000`) measures the pipeline at
the paper's corpus sizes: N pairs recombined from real sentences (one to three Multi30k
en-de or English-Japanese pairs end to end, seeded), then `train.py --max-steps 10` twice,
cold (an empty cache) and cached: the seconds to the first train step and the peak memory of
the trainer and its worker processes; and the real target tokens/s that the training
iterator draws from the memory-mapped token store.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import psutil

from bench.common import bench_parser, non_negative_int, positive_int
from data.batching import BatchIterator, load_examples, plan_stats
from data.config import BatchConfig, CorpusSpec, TokenizerConfig
from data.corpus import iter_text, load_corpus
from data.encoding import encode_corpus
from data.lines import count_lines, read_lines
from data.packing import fit_width
from data.store import TokenStore, store_bytes
from data.tokenizer import train_tokenizer

MULTI30K = Path(os.environ.get("MULTI30K", "data/multi30k"))  # as the recipes read it
SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data"
# Tokens/s one H100 trains on with the `base` model (the README's results, bench.train).
H100_BASE_TOKENS_PER_S = 536_000


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


# ---------------------------------------------------------------------------------------------
# The paper's corpus sizes


def _real_pairs() -> list[tuple[str, str]]:
    """The Multi30k en-de and English-Japanese training pairs (target German or Japanese)."""
    pairs = []
    for corpus, tgt in (("multi30k", "de"), ("small_parallel_enja", "ja")):
        en = read_lines(SHARED / corpus / "train.en")
        other = read_lines(SHARED / corpus / f"train.{tgt}")
        pairs += list(zip(en, other, strict=True))
    return pairs


def recombined_prefix(directory: Path, n_pairs: int, seed: int) -> Path:
    """Write PREFIX.en / PREFIX.xx: `n_pairs` pairs, each one to three real pairs end to end
    (drawn with a generator seeded with `seed`), and return PREFIX (kept from an earlier
    run in the same directory)."""
    pool = _real_pairs()
    en = np.array([p[0] for p in pool], dtype=object)
    xx = np.array([p[1] for p in pool], dtype=object)
    rng = np.random.default_rng(seed)
    prefix = directory / f"recombined-{n_pairs}-{seed}"
    if Path(f"{prefix}.xx").is_file() and count_lines(f"{prefix}.xx") == n_pairs:
        return prefix  # written before in this --scale-dir: the same pairs
    with open(f"{prefix}.en", "w", encoding="utf-8") as src, \
            open(f"{prefix}.xx", "w", encoding="utf-8") as tgt:
        for start in range(0, n_pairs, 100_000):
            count = min(100_000, n_pairs - start)
            picks = rng.integers(0, len(pool), (count, 3))
            parts = rng.integers(1, 4, count)
            for row, k in zip(picks, parts):
                src.write(" ".join(en[row[:k]]) + "\n")
                tgt.write(" ".join(xx[row[:k]]) + "\n")
    return prefix


def _tree_memory(process: psutil.Process) -> tuple[int, int]:
    """(proportional set size, anonymous bytes) of `process` and its descendants (the
    encoding workers). In the first, pages they share, such as a memory-mapped file, count
    once in all; the second leaves out mapped files, which the kernel can drop and read
    again."""
    pss = anonymous = 0
    for member in [process, *process.children(recursive=True)]:
        with contextlib.suppress(psutil.Error, OSError):
            pss += member.memory_full_info().pss
            anonymous += anonymous_bytes(member.pid)
    return pss, anonymous


def anonymous_bytes(pid: int | str = "self") -> int:
    """Anonymous memory of a process (its heap, not pages of mapped files, which the kernel
    can drop and read again): what the data in memory costs."""
    with open(f"/proc/{pid}/smaps_rollup") as rollup:
        for line in rollup:
            if line.startswith("Anonymous:"):
                return int(line.split()[1]) * 1024
    return 0


def first_step(train: Path, valid: Path, run_dir: Path, cache: Path, args) -> dict:
    """Run `train.py --max-steps 10` on the corpus; the seconds until its first train step is
    logged; the peak resident memory of the trainer process and the peak proportional memory
    of it with its workers (sampled every 0.5 s)."""
    command = [sys.executable, "train.py", "--train-prefix", str(train), "--valid-prefix",
               str(valid), "--src", "en", "--tgt", "xx", "--preset", "tiny",
               "--vocab-size", str(args.vocab_size), "--tokenizer-sentences",
               str(args.max_sentences), "--max-steps", "10", "--log-every", "1",
               "--eval-every", "10", "--eval-sentences", "8", "--samples", "0",
               "--no-progress", "--output-dir", str(run_dir)]
    env = {**os.environ, "FLAX_NMT_CACHE": str(cache)}
    log_path = run_dir.with_suffix(".log")
    start = time.perf_counter()
    with open(log_path, "w") as log_file:
        child = subprocess.Popen(command, env=env, stdout=log_file, stderr=subprocess.STDOUT,
                                 cwd=Path(__file__).resolve().parents[1])
        process = psutil.Process(child.pid)
        peak = main_peak = anonymous_peak = tree_anonymous_peak = 0
        first = None
        while child.poll() is None:
            pss, anonymous = _tree_memory(process)
            peak, tree_anonymous_peak = max(peak, pss), max(tree_anonymous_peak, anonymous)
            with contextlib.suppress(psutil.Error, OSError):
                main_peak = max(main_peak, process.memory_info().rss)
                anonymous_peak = max(anonymous_peak, anonymous_bytes(child.pid))
            if first is None and _has_train_line(run_dir / "metrics.jsonl"):
                first = time.perf_counter() - start
            time.sleep(0.5)
    if child.returncode:
        raise SystemExit(f"train.py failed (exit {child.returncode}); see {log_path}")
    return {"first_step_s": round(first, 1) if first else None,
            "total_s": round(time.perf_counter() - start, 1),
            "peak_trainer_rss_mib": round(main_peak / 2**20),
            "peak_trainer_anonymous_mib": round(anonymous_peak / 2**20),
            "peak_pss_with_workers_mib": round(peak / 2**20),
            "peak_anonymous_with_workers_mib": round(tree_anonymous_peak / 2**20),
            "log": str(log_path)}


def _has_train_line(path: Path) -> bool:
    try:
        return '"kind": "train"' in path.read_text()
    except OSError:
        return False


def store_rate(cache: Path, max_batches: int) -> dict:
    """Real target tokens/s of the training iterator over the largest token store in
    `cache`, packed as train.py packs by default."""
    stores = sorted((cache / "encoded").iterdir(), key=store_bytes)
    examples = load_examples(TokenStore.open(stores[-1]), BatchConfig(max_len=64))
    config = fit_width(BatchConfig(max_len=64), examples.src_len, examples.tgt_len)
    rss_before, anonymous_before = psutil.Process().memory_info().rss, anonymous_bytes()
    rate, with_plan_s = timed(iterate, examples, config, max_batches)
    # The iterator runs on one core (the loader thread).
    needed = 2 * H100_BASE_TOKENS_PER_S / rate["tgt_tokens_per_s"]
    return {"pairs": len(examples), "examples_mib": round(
                (examples.index.nbytes + examples.src_len.nbytes + examples.tgt_len.nbytes)
                / 2**20),
            # RSS counts the store's pages that the batches touched; anonymous memory does not.
            "iterator_rss_growth_mib": round((psutil.Process().memory_info().rss - rss_before)
                                             / 2**20),
            "iterator_anonymous_growth_mib": round((anonymous_bytes() - anonymous_before)
                                                   / 2**20),
            "plan_and_iterate_s": round(with_plan_s, 1), **rate,
            "cores_for_2x_h100_base": round(needed, 1)}


def bench_scale(n_pairs: int, args: argparse.Namespace, directory: Path) -> dict:
    """Time to the first train step, cold and cached, and memory, on `n_pairs` pairs."""
    train, make_s = timed(recombined_prefix, directory, n_pairs, seed=0)
    valid = recombined_prefix(directory, 2000, seed=1)
    cache = directory / f"cache-{n_pairs}"
    record = {"corpus": f"recombined {n_pairs}", "generate_s": round(make_s, 1),
              "text_mib": round(sum(Path(f"{train}.{s}").stat().st_size
                                    for s in ("en", "xx")) / 2**20)}
    record["cold"] = first_step(train, valid, directory / f"run-{n_pairs}-cold", cache, args)
    record["cached"] = first_step(train, valid, directory / f"run-{n_pairs}-cached", cache,
                                  args)
    record["cache_mib"] = round(sum(f.stat().st_size for f in cache.rglob("*")
                                    if f.is_file()) / 2**20)
    record["iterator"] = store_rate(cache, args.max_batches)
    return record


def main(argv: list[str] | None = None) -> None:
    parser = bench_parser(__doc__.split("\n\n")[0])
    parser.add_argument("--synthetic", type=non_negative_int, default=0,
                        help="also benchmark a synthetic corpus of N pairs (e.g. 1000000)")
    parser.add_argument("--vocab-size", type=positive_int, default=8000)
    parser.add_argument("--max-sentences", type=positive_int, default=1_000_000,
                        help="SentencePiece training sample (sentences)")
    parser.add_argument("--long-tail", type=non_negative_int, default=0,
                        help="also benchmark a synthetic corpus of N pairs with a long tail "
                             "of long sentences")
    parser.add_argument("--batch-tokens", type=positive_int, default=4096)
    parser.add_argument("--max-len", type=positive_int, default=128,
                        help="drop pairs longer than this (--max-tokens-per-sentence)")
    parser.add_argument("--pack-widths", type=lambda s: [int(w) for w in s.split(",")],
                        help="packed row widths to compare, e.g. 64,128, each at least "
                             "--max-len, so that rows hold every pair kept (default: --max-len "
                             "and twice it)")
    parser.add_argument("--max-batches", type=positive_int, default=2000,
                        help="time at most this many batches")
    parser.add_argument("--scale", type=positive_int, action="append", default=[],
                        help="also time train.py to its first step on N recombined real "
                             "pairs, cold and cached (repeatable)")
    parser.add_argument("--scale-dir", type=Path, default=None,
                        help="where --scale writes its corpora, caches and runs (default: a "
                             "temporary directory, removed after)")
    args = parser.parse_args(argv)

    for n_pairs in args.scale:
        with contextlib.ExitStack() as stack:
            directory = args.scale_dir or Path(stack.enter_context(tempfile.TemporaryDirectory()))
            directory.mkdir(parents=True, exist_ok=True)
            print(json.dumps(bench_scale(n_pairs, args, directory)), flush=True)
    if args.scale:
        return
    if args.pack_widths is None:
        args.pack_widths = [args.max_len, 2 * args.max_len]
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
