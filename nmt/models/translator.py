"""Text in, text out: the `Translator` shared by translate.py, validation and the Python API.

`Translator` turns sentences into translations with a loaded model and its SentencePiece
tokenizer: it encodes, sorts by length into token-budget batches padded to fixed bucket
widths (`data.batching.inference_batches`), runs `decoding.search_with_state`, and restores
input order; `Translator.score` gives each reference's log-probability under the model
instead (force decoding). Scoring translations (BLEU, chrF) is `nmt.translation.scoring`.
"""

from __future__ import annotations

import collections
import concurrent.futures
import copy
import dataclasses
import logging
import os
import time
from collections.abc import Callable, Iterator, Sequence

import jax
import numpy as np
from flax import nnx

from data.batching import inference_batches, single_batch, source_width
from data.config import INFERENCE_BATCH_TOKENS, INFERENCE_BUCKETS, buckets_up_to
from transformer.config import SearchConfig
from transformer.decoding import (
    compile_search,
    pad_sources,
    reference_logprobs_with_state,
    search_with_state,
)
from transformer.ensemble import Ensemble
from transformer.model import Transformer

log = logging.getLogger("translate")


# A width's search programs at fewer rows (`decoding.search_with_state`'s `compact`) cost a
# compilation (about a second each on a CPU) or a load from the compilation cache (a quarter
# of that); each batch they serve saves a third of its search. So a translator compacts the
# batches of a width once it has searched this many of them: long jobs, not a test set's
# handful. A server compiles every shape first (`warm_up`) and compacts from the start.
COMPACT_AFTER_BATCHES = 16


def rows_cost_time() -> bool:
    """Whether a search step's time grows with its rows, which decides how a translator shapes
    its batches: on a CPU it does, and a program compiles in about a second, so small calls
    get small batches and finished sentences leave theirs (compaction); on a GPU or TPU a
    decoder step of a few hundred rows should cost little more than one of a few (its kernel
    launches dominate; not yet timed) while each program took 6-23 s to compile (one H100,
    docs/performance.md), so every batch of a width keeps one shape."""
    return jax.default_backend() == "cpu"


def compile_threads(programs: int, *, searching: bool) -> int:
    """Threads that compile search programs at once (each shape's programs compile on one
    thread; XLA leaves the others free): as many as there are cores, up to 8 and `programs`,
    except beside a search on a CPU, which needs the cores itself (`searching`)."""
    if searching and rows_cost_time():
        return 1
    cores = (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")  # Linux
             else os.cpu_count() or 1)
    return max(1, min(programs, 8, cores))


def rows_per_source(search: SearchConfig) -> int:
    """Decoder rows each source sentence takes in a search: beam_size for beam search, else 1."""
    return search.beam_size if search.strategy == "beam" else 1


def default_searches() -> int:
    """Batches searched at once unless told otherwise: 2 on a CPU, where one search's small
    matrix products keep only part of the cores busy; 1 on a GPU or TPU."""
    return 2 if jax.default_backend() == "cpu" else 1


@dataclasses.dataclass(frozen=True)
class BatchStats:
    """What one searched batch cost: for profiles (bench.search_rules) and padding checks."""

    width: int      # padded source length (a bucket)
    rows: int       # rows of the compiled shape
    sentences: int  # rows holding a sentence; the rest are PAD
    source_tokens: int  # real source tokens, EOS included
    steps: int      # decoder steps the search ran
    row_steps: int  # rows decoded, summed over those steps (finished sentences leave)
    stage_rows: tuple[int, ...]  # rows of each stage of the search: `rows`, then fewer
    seconds: float  # search, from the call until the results are on the host


@dataclasses.dataclass(frozen=True)
class Hypothesis:
    text: str
    score: float
    tokens: tuple[int, ...]


class Translator:
    """Translates lists of sentences with one model (or ensemble), tokenizer and search
    configuration.

    `batch_tokens` bounds source tokens per batch (beam search multiplies the work by
    beam_size). Sources are padded to the smallest of `buckets` (default
    `data.config.INFERENCE_BUCKETS`, capped at the model's max_len) that holds them, and each
    width compiles search once per row count: fewer buckets, fewer compilations, more padding.
    Where rows cost time (`rows_cost_time`, a CPU) a small call gets fewer rows; elsewhere
    every batch of a width has the full budget's rows. Sources
    longer than the model's positions allow are truncated to `max_source_len` tokens (EOS
    included); `truncated` lists the indices of the last call that were. A translation whose
    search reached its output limit (`SearchConfig.max_output_len`, where EOS is forced) is
    kept, and its line (counted as in truncation warnings) is added to `reached_limit`, over
    every call, for the caller to report once. `searches` batches are searched at once, each
    on its own thread (`default_searches`); results come back in order. Once `compact_after`
    batches of a width have been searched (over every call), the next ones leave their
    finished sentences behind as they go (see `COMPACT_AFTER_BATCHES`); None, or a backend
    where rows cost little (`rows_cost_time`), searches every batch whole. Sampling draws
    from `seed` and a count of the batches searched so far, so repeated calls (translate.py
    calls once per chunk of stdin) never reuse random numbers.
    """

    def __init__(self, model: Transformer | Ensemble, tokenizer, search: SearchConfig,
                 batch_tokens: int = INFERENCE_BATCH_TOKENS, seed: int = 0,
                 buckets: Sequence[int] | None = None, searches: int = 1,
                 compact_after: int | None = COMPACT_AFTER_BATCHES):
        vocab = model.config.vocab_size
        if search.strategy == "sample" and search.top_k > vocab:
            raise ValueError(f"top_k {search.top_k} is larger than the model's vocabulary "
                             f"({vocab} tokens); use a smaller value, or 0 for no limit.")
        self.graphdef, self.state = nnx.split(model)
        self.model_config = model.config
        self.tokenizer = tokenizer
        self.search = search
        self.batch_tokens = batch_tokens
        self.searches = searches
        # Where rows cost little, batches keep the full budget's rows and never compact:
        # one search shape per width.
        self.fit_small_calls = rows_cost_time()
        self.compact_after = compact_after if self.fit_small_calls else None
        self.batches_per_width: collections.Counter[int] = collections.Counter()
        self.rng = jax.random.key(seed)
        self.batches_searched = 0  # folded into the rng: each batch of every call draws anew
        self.max_source_len = self.model_config.max_len
        # No bucket is wider than the model's positions: sources are cut to max_len tokens.
        self.buckets = buckets_up_to(self.max_source_len, buckets or INFERENCE_BUCKETS)
        self.truncated: list[int] = []
        self.reached_limit: list[int] = []
        self.batch_stats: list[BatchStats] = []  # the last call's batches
        # ((rows, width), with every halving) of the search programs compiled so far; shared
        # with replicas, which search with the same programs.
        self.compiled_shapes: set[tuple[tuple[int, int], bool]] = set()

    def replica(self, stream: int) -> "Translator":
        """A Translator sharing this one's model, tokenizer and settings, with records and
        random numbers of its own (`stream` is folded into the seed): for another thread."""
        other = copy.copy(self)
        other.rng = jax.random.fold_in(self.rng, stream)
        other.batches_searched = 0
        other.batches_per_width = collections.Counter()
        other.truncated, other.reached_limit, other.batch_stats = [], [], []
        return other

    def translate(self, sentences: Sequence[str]) -> list[str]:
        """The best translation of each sentence, in input order."""
        return [nbest[0].text for nbest in self.translate_nbest(sentences)]

    def translate_nbest(self, sentences: Sequence[str],
                        progress: Callable[[int], None] | None = None, first_line: int = 1,
                        source: str = "input", ids: Sequence[Sequence[int]] | None = None
                        ) -> list[list[Hypothesis]]:
        """`search.nbest` hypotheses per sentence, best first; an empty line gives [""].

        `progress(n)` is told of every n sentences done, empty ones included. Truncation
        warnings say "`source` line N" with N counted from `first_line`. `ids`: the sentences'
        source token ids (`tokenizer.encode(sentences)`), where the caller has them already, so
        that they are not encoded twice (the server counts a request's tokens with them).
        """
        if ids is None:
            ids = self._encode(sentences, first_line, source)
        elif len(ids) != len(sentences):
            raise ValueError(f"{len(ids)} rows of token ids for {len(sentences)} sentences")
        else:
            ids = self._truncate(list(ids), first_line, source)  # the caller's list unchanged
        self.batch_stats = []
        results: list[list[Hypothesis] | None] = [None] * len(sentences)
        empty = [i for i, sentence in enumerate(sentences) if not sentence.strip()]
        for i in empty:
            results[i] = [Hypothesis("", 0.0, ())] * self.search.nbest
        if progress is not None and empty:
            progress(len(empty))
        todo = [i for i, r in enumerate(results) if r is None]
        for batch_index, hypotheses, at_limit in self._search_batches([ids[i] for i in todo]):
            for row, nbest in zip(batch_index, hypotheses):
                results[todo[row]] = nbest
            self.reached_limit.extend(first_line + todo[row] for row in at_limit)
            if progress is not None:
                progress(len(batch_index))
        return results  # type: ignore[return-value]

    def score(self, sources: Sequence[str], references: Sequence[str],
              progress: Callable[[int], None] | None = None, first_line: int = 1,
              where: tuple[str, str] = ("source", "reference")) -> list[tuple[float, int]]:
        """(log p(reference | source), reference tokens with EOS) of each pair, in order.

        Force decoding, as fairseq's --score-reference or marian-scorer: the natural-log
        probability the model gives the whole reference, EOS included, with no search. An
        empty side is scored as it is (EOS alone). `where` names the two sides in errors: a
        side longer than the model's positions is a ValueError naming its line, never a score
        of the truncated text.
        """
        if len(sources) != len(references):
            raise ValueError(f"{len(sources)} sources but {len(references)} references.")
        src_ids = self._encode(sources, first_line, where[0], truncate=False)
        tgt_ids = [row + [self.model_config.eos_id] for row in
                   self._encode(references, first_line, where[1], truncate=False, side="target")]
        out: list[tuple[float, int]] = [(0.0, 0)] * len(sources)
        budget = self._batch_budget(src_ids, per_token=1)
        for src, index in inference_batches(src_ids, batch_tokens=budget, buckets=self.buckets,
                                            special=self.tokenizer.ids):
            real = index[index >= 0]
            tgt = self._pad_targets([tgt_ids[i] for i in real], rows=len(index))
            logprobs = reference_logprobs_with_state(self.graphdef, self.state, src, tgt)
            for row, i in enumerate(real):
                out[i] = (float(logprobs[row]), len(tgt_ids[i]))
            if progress is not None:
                progress(len(real))
        return out

    def _pad_targets(self, targets: list[list[int]], rows: int) -> np.ndarray:
        """[rows, bucket] int32: the targets (EOS included) padded to the smallest bucket that
        holds the longest, so that scoring compiles one shape per bucket pair."""
        longest = max(len(t) for t in targets)
        width = next(b for b in self.buckets if b >= longest)
        return pad_sources(targets, self.model_config.pad_id, batch_size=rows, width=width)

    def _encode(self, sentences: Sequence[str], first_line: int, source: str,
                truncate: bool = True, side: str = "source") -> list[list[int]]:
        """Token ids; a sentence over the model's positions is truncated (with a warning), or
        with `truncate=False` refused (ValueError naming its line)."""
        return self._truncate(self.tokenizer.encode(list(sentences), side), first_line, source,
                              truncate)

    def _truncate(self, ids: list[list[int]], first_line: int, source: str,
                  truncate: bool = True) -> list[list[int]]:
        """`ids` with every row over the model's positions cut to fit (each with a warning),
        or with `truncate=False` refused (ValueError naming its line); `truncated` lists
        them."""
        limit = self.max_source_len - 1  # room for EOS
        self.truncated = [i for i, row in enumerate(ids) if len(row) > limit]
        if self.truncated and not truncate:
            i = self.truncated[0]
            raise ValueError(
                f"{source} line {first_line + i}: {len(ids[i])} tokens, more than the model's "
                f"{limit} (+ EOS); its log-probability cannot be computed without truncating "
                f"it, which would score another text: leave the pair out of the test set")
        for i in self.truncated:
            log.warning("%s line %d: %d tokens, more than the model's %d; truncated to %d tokens",
                        source, first_line + i, len(ids[i]), limit, limit)
            ids[i] = ids[i][:limit]
        return ids

    def _batch_budget(self, ids: list[list[int]], per_token: int | None = None) -> int:
        """Source tokens per batch for this call.

        Batches have a fixed number of rows per source width, so a lone sentence under the full
        budget would be searched alongside dozens of all-padding rows. Where rows cost time
        (`fit_small_calls`), a small call gets the next power of two above what it needs
        instead; powers of two keep the number of compiled shapes small (at most
        log2(batch_tokens / 64) + 1 row counts per width). Elsewhere every call gets the full
        budget. Beam search does beam_size times the work per source token, so its budget is
        divided by beam_size (`per_token` gives another factor).
        """
        if per_token is None:
            per_token = rows_per_source(self.search)
        needed = per_token * sum(len(row) + 1 for row in ids)
        budget = self.batch_tokens
        if self.fit_small_calls:
            budget = min(budget, 1 << max(needed - 1, 1).bit_length())
        return max(budget // per_token, 1)  # inference_batches always makes one row

    def search_shapes(self) -> list[tuple[int, int]]:
        """Every (rows, width) batch shape translate calls can search, narrowest first.

        Widths are the buckets; each width has one row count per budget that `_batch_budget`
        can pick (one where small calls keep the full budget), so a long-running caller (the
        server) can compile them all before it takes requests. A search that leaves finished
        sentences behind halves its rows, which gives the row count of half the budget: no
        other shapes.
        """
        shapes = {(rows, width) for width in self.buckets for rows in self._row_counts(width)}
        return sorted(shapes, key=lambda shape: (shape[1], shape[0]))

    def _row_counts(self, width: int) -> set[int]:
        """The row counts a batch of `width` can have: one per budget `_batch_budget` picks.

        Where rows cost time, also the full budget's row count rounded up to a power of two
        (16 rather than 10 at width 48 with 512 source tokens), for `_call_batches`: a call of
        16 sentences whose longest needs width 48 is then one search rather than two, each of
        which would cost nearly as much (docs/performance.md). It exceeds the budget by less
        than 2x, and only for calls that fit it.
        """
        per_token = rows_per_source(self.search)

        def rows_at(budget: int) -> int:
            return max(max(budget // per_token, 1) // width, 1)

        if not self.fit_small_calls:
            return {rows_at(self.batch_tokens)}
        counts = {rows_at(min(self.batch_tokens, 1 << k))
                  for k in range(1, self.batch_tokens.bit_length() + 1)}
        counts.add(rows_at(self.batch_tokens))
        return counts | {1 << (rows_at(self.batch_tokens) - 1).bit_length()}

    def _call_batches(self, ids: list[list[int]]) -> list[tuple[np.ndarray, np.ndarray]]:
        """A call's batches, `(src, index)` as `inference_batches` makes them.

        Where rows cost time, a call that fits one batch at its longest sentence's width is
        searched as that one batch. Split by width, a call of 16 test2016 sentences became three
        batches of five, each a whole search, and a decoder step over five rows costs nearly
        what one over sixteen does (a server's calls, or a few lines from the shell;
        docs/performance.md). Its row count is one `_row_counts` already has: no new programs
        to compile. Larger calls are sorted by length into batches of the budget.
        """
        if self.fit_small_calls:
            width = source_width(ids, self.buckets)
            fitting = [rows for rows in self._row_counts(width) if rows >= len(ids)]
            if width <= self.buckets[-1] and fitting:
                return [single_batch(ids, min(fitting), width, self.tokenizer.ids)]
        return list(inference_batches(ids, batch_tokens=self._batch_budget(ids),
                                      buckets=self.buckets, special=self.tokenizer.ids))

    def warm_up(self, progress: Callable[[int, int], None] | None = None) -> None:
        """Compile the search for every shape of `search_shapes` (`compile_search`), with
        the programs compaction needs unless this translator never compacts, several shapes
        at once (`compile_threads`); `progress(done, total)` after each. An exception from
        `progress` stops the shapes not yet started."""
        shapes = self.search_shapes()
        compacts = self.compact_after is not None
        pool = concurrent.futures.ThreadPoolExecutor(
            compile_threads(len(shapes), searching=False), thread_name_prefix="compile")
        try:
            futures = [pool.submit(self._compile, shape, compacts) for shape in shapes]
            for done, future in enumerate(concurrent.futures.as_completed(futures), 1):
                future.result()
                if progress is not None:
                    progress(done, len(shapes))
        finally:
            pool.shutdown(wait=False, cancel_futures=True)
        if compacts:
            self.compact_after = 0  # every program compaction needs is compiled

    def _search_batches(self, ids: list[list[int]]
                        ) -> Iterator[tuple[np.ndarray, list[list[Hypothesis]], np.ndarray]]:
        """Yields (indices into `ids`, n-best hypotheses of those rows, the indices whose best
        hypothesis reached its output limit) batch by batch, in order, with `searches` batches
        in flight (one more waits, so no thread idles while the host yields). The programs of
        each batch shape are compiled ahead on threads of their own (`_compile_ahead`,
        `compile_threads`), so that loading the next width's programs overlaps the search of
        the batches before."""
        if not ids:
            return
        batches = [(src, index, *self._next_settings(src))
                   for src, index in self._call_batches(ids)]
        shapes = len({src.shape for src, *_ in batches})
        compiler = concurrent.futures.ThreadPoolExecutor(
            compile_threads(shapes, searching=True), thread_name_prefix="compile")
        try:
            compiled = self._compile_ahead(compiler, batches)
            if self.searches == 1:
                for src, index, rng, compact in batches:
                    compiled[src.shape].result()
                    yield self._record(*self._search_one(src, index, rng, compact))
                return
            with concurrent.futures.ThreadPoolExecutor(self.searches,
                                                       thread_name_prefix="search") as pool:
                pending: collections.deque[concurrent.futures.Future] = collections.deque()
                for src, index, rng, compact in batches:
                    compiled[src.shape].result()
                    pending.append(pool.submit(self._search_one, src, index, rng, compact))
                    if len(pending) > self.searches:
                        yield self._record(*pending.popleft().result())
                while pending:
                    yield self._record(*pending.popleft().result())
        finally:
            # After an error or Ctrl-C, shapes not yet compiled are not waited for.
            compiler.shutdown(wait=False, cancel_futures=True)

    def _compile_ahead(self, compiler: concurrent.futures.Executor, batches: list
                       ) -> dict[tuple[int, int], concurrent.futures.Future]:
        """Futures, one per batch shape (rows, width) of `batches`, done once that shape's
        programs are compiled (`compile_search`, with every halving where a batch of the shape
        compacts), queued in the order the shapes first come. A shape compiled before, by
        this translator or one sharing its records (`replica`), is done at once."""
        compacts: dict[tuple[int, int], bool] = {}
        for src, _, _, compact in batches:
            compacts[src.shape] = compacts.get(src.shape, False) or compact
        futures = {}
        for shape, halvings in compacts.items():
            if (shape, halvings) in self.compiled_shapes or (shape, True) in self.compiled_shapes:
                futures[shape] = concurrent.futures.Future()
                futures[shape].set_result(None)
            else:
                futures[shape] = compiler.submit(self._compile, shape, halvings)
        return futures

    def _compile(self, shape: tuple[int, int], halvings: bool) -> None:
        compile_search(self.graphdef, self.state, shape, self.search, halvings)
        self.compiled_shapes.add((shape, halvings))

    def _next_settings(self, src: np.ndarray) -> tuple[jax.Array, bool]:
        """The next batch's random key and whether it compacts. Sampling gets a key of each
        batch's own, in the order batches are made; greedy and beam search draw nothing and
        get the seed's key as it is (folding would cost them a program to load)."""
        self.batches_searched += 1
        width = src.shape[1]
        self.batches_per_width[width] += 1
        rng = (jax.random.fold_in(self.rng, self.batches_searched - 1)
               if self.search.strategy == "sample" else self.rng)
        compacts = (self.compact_after is not None
                    and self.batches_per_width[width] > self.compact_after)
        return rng, compacts

    def _search_one(self, src: np.ndarray, index: np.ndarray, rng: jax.Array, compact: bool
                    ) -> tuple[BatchStats, tuple[np.ndarray, list[list[Hypothesis]], np.ndarray]]:
        """Search one batch (any thread): its cost and what `_search_batches` yields for it."""
        start = time.perf_counter()
        result = search_with_state(self.graphdef, self.state, src, self.search, rng, compact)
        real = index >= 0
        stats = BatchStats(
            width=src.shape[1], rows=src.shape[0], sentences=int(real.sum()),
            source_tokens=int((src != self.model_config.pad_id).sum()), steps=result.steps,
            row_steps=result.row_steps, stage_rows=result.stage_rows,
            seconds=time.perf_counter() - start)
        return stats, (index[real], [self._hypotheses(result, row) for row in np.flatnonzero(real)],
                       index[real & result.reached_limit()])

    def _record(self, stats: BatchStats, found):
        self.batch_stats.append(stats)
        return found

    def _hypotheses(self, result, row: int) -> list[Hypothesis]:
        eos = self.model_config.eos_id
        out = []
        for tokens, length, score in zip(result.tokens[row], result.lengths[row],
                                         result.scores[row]):
            ids = [int(t) for t in tokens[:length] if t != eos]
            out.append(Hypothesis(self.tokenizer.decode([ids])[0], float(score), tuple(ids)))
        return out
