"""Text in, text out: the `Translator` shared by translate.py, validation, the server and the
Python API.

`Translator` turns sentences into translations with a loaded model and its SentencePiece
tokenizer: it encodes, cuts the sentences into batches padded to fixed bucket widths
(`nmt.models.batch_plan`), runs `transformer.search.search_with_state`, and restores input
order. Each call returns what it did (`Translations`); the translator keeps only what spans
calls (compiled shapes, batches per width, the random stream), so threads may share one.
`Translator.score` gives each reference's log-probability under the model instead (force
decoding). Scoring translations (BLEU, chrF) is `nmt.translation.scoring`.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence

import jax
import numpy as np
from flax import nnx

from data.batching import inference_batches
from data.config import INFERENCE_BATCH_TOKENS, INFERENCE_BUCKETS, buckets_up_to
from nmt.models.alignment import Alignment, align
from nmt.models.batch_plan import BatchPlan, check_search_memory
from nmt.models.translations import (
    BatchStats,
    CallSources,
    Hypothesis,
    Translations,
    refuse_long_sources,
)
from transformer.config import SearchConfig
from transformer.ensemble import Ensemble
from transformer.model import Transformer
from transformer.search import (
    NEG_INF,
    SearchResult,
    compile_search,
    pad_sources,
    reference_logprobs_with_state,
    search_with_state,
)
from transformer.shortlist import Shortlist
from transformer.strategies import Strategy, plan_search

log = logging.getLogger("translate")

# Compacting a width's batches (`search_with_state`'s `compact`) costs programs to compile or
# load at every halving of its rows, and saves part of each batch's search: it pays for long
# jobs, not for a test set's handful of batches. A server compiles every shape first
# (`warm_up`) and compacts from the start. docs/performance.md has the figures.
COMPACT_AFTER_BATCHES = 16


def cpu_backend() -> bool:
    """Whether JAX runs on a CPU, where a search step's time grows with its rows and programs
    compile fast: batches are shaped for it (`BatchPlan.on_cpu`) and compact."""
    return jax.default_backend() == "cpu"


def compile_threads(programs: int, *, searching: bool) -> int:
    """Threads that compile search programs at once (each shape's programs compile on one
    thread; XLA leaves the others free): as many as there are cores, up to 8 and `programs`,
    except beside a search on a CPU, which needs the cores itself (`searching`)."""
    if searching and cpu_backend():
        return 1
    cores = (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")  # Linux
             else os.cpu_count() or 1)
    return max(1, min(programs, 8, cores))


def default_searches() -> int:
    """Batches searched at once unless told otherwise: 2 on a CPU, where one search's small
    matrix products keep only part of the cores busy; 1 on a GPU or TPU."""
    return 2 if cpu_backend() else 1


@dataclasses.dataclass(frozen=True)
class BatchKeys:
    """Each batch's sampling key. Greedy and beam search draw nothing and get the seed's key
    as it is (folding would cost them a program to load). Sampling folds in the count of
    batches searched before (`counted`, in the order batches are made), so calls never reuse
    random numbers; a call given a `stream` number folds in that number and the batch's
    number in the call (`in_call`) instead, so that it draws the same whatever came before
    it, in any process (a resumed distillation's chunk)."""

    seed: jax.Array
    draws: bool

    def key(self, counted: int, stream: int | None, in_call: int) -> jax.Array:
        if not self.draws:
            return self.seed
        if stream is None:
            return jax.random.fold_in(self.seed, counted)
        return jax.random.fold_in(jax.random.fold_in(self.seed, stream), in_call)


@dataclasses.dataclass
class _Batch:
    """A batch of a call, with what its search draws from and whether it compacts."""

    src: np.ndarray    # [rows, width] padded source ids
    index: np.ndarray  # [rows], each row's sentence in the call, -1 for PAD rows
    rng: jax.Array
    compact: bool
    candidates: np.ndarray | None  # [K] the shortlist's token ids for this batch


class Translator:
    """Translates lists of sentences with one model (or ensemble), tokenizer and search
    configuration.

    `batch_tokens` bounds source tokens per batch (beam search multiplies the work by
    beam_size); `buckets` (default `data.config.INFERENCE_BUCKETS`, capped at the model's
    max_len) are the padded widths; how a call is cut into batches is its `BatchPlan`.
    Sources longer than the model's positions are truncated to `max_source_len` tokens (EOS
    included), with a warning. `searches` batches are searched at once, each on its own
    thread (`default_searches`). Once `compact_after` batches of a width have been searched
    (over every call), the next ones leave their finished sentences behind as they go
    (`COMPACT_AFTER_BATCHES`); None, or a backend other than a CPU, searches every batch
    whole. Sampling draws from `seed` as `BatchKeys` says. With a `shortlist`
    (`transformer.shortlist`), each batch searches over `shortlist_size` candidate tokens
    chosen for its sources. Several threads may call one translator at once.
    """

    def __init__(self, model: Transformer | Ensemble, tokenizer, search: SearchConfig,
                 batch_tokens: int = INFERENCE_BATCH_TOKENS, seed: int = 0,
                 buckets: Sequence[int] | None = None, searches: int = 1,
                 compact_after: int | None = COMPACT_AFTER_BATCHES,
                 shortlist: Shortlist | None = None, shortlist_size: int = 0):
        self.strategy = plan_search(search)
        self.strategy.check_vocabulary(model.config.vocab_size)
        self.shortlist = shortlist
        self.shortlist_size = (shortlist_candidates(shortlist, shortlist_size, model.config,
                                                    self.strategy) if shortlist is not None else 0)
        self.graphdef, self.state = nnx.split(model)
        self.model_config, self.tokenizer = model.config, tokenizer
        self.compute_type = compute_types(model)  # "float32", or an ensemble's, "+"-joined
        self.search, self.searches = search, searches
        self.max_source_len = self.model_config.max_len
        self.plan = search_plan(model, search, batch_tokens, buckets)
        self.compact_after = compact_after if self.plan.on_cpu else None
        self.keys = BatchKeys(jax.random.key(seed), self.strategy.draws)
        # What spans calls, shared by the threads that call at once.
        self._lock = threading.Lock()
        self._batches_searched = 0  # folded into the rng: each batch of every call draws anew
        self._batches_per_width: collections.Counter[int] = collections.Counter()
        # ((rows, width), with every halving) of the search programs compiled so far.
        self._compiled_shapes: set[tuple[tuple[int, int], bool]] = set()

    engine = "jax"

    def describe(self) -> str:
        """The engine and its compute type, as the commands and /health name them."""
        shortlist = f", shortlist of {self.shortlist_size}" if self.shortlist else ""
        return f"{self.engine} {self.compute_type}{shortlist}"

    @property
    def buckets(self) -> tuple[int, ...]:
        return self.plan.buckets

    def search_shapes(self) -> list[tuple[int, int]]:
        """Every (rows, width) batch shape translate calls can search (`BatchPlan`)."""
        return self.plan.search_shapes()

    def translate(self, sentences: Sequence[str]) -> list[str]:
        """The best translation of each sentence, in input order."""
        return [nbest[0].text for nbest in self.translate_nbest(sentences)]

    def translate_nbest(self, sentences: Sequence[str], **options) -> list[list[Hypothesis]]:
        """Up to `search.nbest` hypotheses per sentence, best first (`translate_all`'s options)."""
        return self.translate_all(sentences, **options).nbest

    def translate_all(self, sentences: Sequence[str],
                      progress: Callable[[int], None] | None = None, first_line: int = 1,
                      source: str = "input", ids: Sequence[Sequence[int]] | None = None,
                      line_numbers: Sequence[int] | None = None,
                      stream: int | None = None, each_line: bool = True) -> Translations:
        """The n-best lists of `sentences` (an empty one gives [""]) and the call's records.
        A list is shorter than `search.nbest` where the search found fewer (`real_hypotheses`).

        `progress(n)` is told of every n sentences done, empty ones included. Warnings say "`source`
        line N", N from `line_numbers` (one per sentence: a paragraph's sentences share their line)
        or counted from `first_line`; with `each_line=False`, one warning counts the call's (the
        server's line numbers mean nothing to its clients). `ids`: the sentences' source token ids
        (`tokenizer.encode(sentences)`), where the caller has them (the server counts a request's
        tokens with them), so that they are not encoded twice. `stream`: the call's sampling draws
        from the seed and this number alone (`BatchKeys`).
        """
        call = CallSources.of(sentences, self.tokenizer, self.max_source_len - 1,
                              self.strategy.nbest, ids, line_numbers, first_line, source,
                              progress, each_line)
        ids, results, todo, line_numbers = call.ids, call.results, call.todo, call.line_numbers
        reached_limit, batches = [], []
        for stats, rows, found, at_limit in self._search_batches([ids[i] for i in todo], stream):
            for row, nbest in zip(rows, found):
                results[todo[row]] = nbest
            reached_limit.extend(line_numbers[todo[row]] for row in at_limit)
            batches.append(stats)
            if progress is not None:
                progress(len(rows))
        return Translations(results, call.truncated_lines, sorted(reached_limit),  # type: ignore
                            batches)

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
        limit = self.max_source_len - 1  # room for EOS
        src_ids = refuse_long_sources(self.tokenizer.encode(list(sources), "source"), limit,
                               first_line, where[0])
        tgt_ids = [row + [self.model_config.eos_id] for row in refuse_long_sources(
            self.tokenizer.encode(list(references), "target"), limit, first_line, where[1])]
        out: list[tuple[float, int]] = [(0.0, 0)] * len(sources)
        budget = self.plan.budget(src_ids, per_token=1)
        for src, index in inference_batches(src_ids, batch_tokens=budget, buckets=self.buckets,
                                            special=self.tokenizer.ids):
            real = index[index >= 0]
            tgt = _pad_targets([tgt_ids[i] for i in real], len(index), self.buckets,
                               self.model_config.pad_id)
            logprobs = reference_logprobs_with_state(self.graphdef, self.state, src, tgt)
            for row, i in enumerate(real):
                out[i] = (float(logprobs[row]), len(tgt_ids[i]))
            if progress is not None:
                progress(len(real))
        return out

    def align(self, sources: Sequence[str], targets: Sequence[str]) -> list[Alignment]:
        """A word alignment of each source with its translation, read off the model's
        cross-attention (`nmt.models.alignment`)."""
        return align(self.graphdef, self.state, self.tokenizer, self.buckets, sources, targets)

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

    def _search_batches(self, ids: list[list[int]], stream: int | None = None
                        ) -> Iterator[tuple[BatchStats, np.ndarray, list[list[Hypothesis]],
                                            np.ndarray]]:
        """Yields (the batch's cost, indices into `ids`, n-best hypotheses of those rows, the
        indices whose best hypothesis reached its output limit) batch by batch, in order,
        with `searches` batches in flight (one more waits, so no thread idles while the host
        yields). The programs of each batch shape are compiled ahead on threads of their own
        (`_compile_ahead`), so that loading the next width's programs overlaps the search of
        the batches before."""
        if not ids:
            return
        batches = [self._batch(src, index, stream, number) for number, (src, index)
                   in enumerate(self.plan.call_batches(ids, self.tokenizer.ids))]
        shapes = len({batch.src.shape for batch in batches})
        compiler = concurrent.futures.ThreadPoolExecutor(
            compile_threads(shapes, searching=True), thread_name_prefix="compile")
        try:
            compiled = self._compile_ahead(compiler, batches)
            if self.searches == 1:
                for batch in batches:
                    compiled[batch.src.shape].result()
                    yield self._search_one(batch)
                return
            with concurrent.futures.ThreadPoolExecutor(self.searches,
                                                       thread_name_prefix="search") as pool:
                pending: collections.deque[concurrent.futures.Future] = collections.deque()
                for batch in batches:
                    compiled[batch.src.shape].result()
                    pending.append(pool.submit(self._search_one, batch))
                    if len(pending) > self.searches:
                        yield pending.popleft().result()
                while pending:
                    yield pending.popleft().result()
        finally:
            # After an error or Ctrl-C, shapes not yet compiled are not waited for.
            compiler.shutdown(wait=False, cancel_futures=True)

    def _batch(self, src: np.ndarray, index: np.ndarray, stream: int | None,
               in_call: int) -> _Batch:
        """The next batch, counted, with its sampling key (`BatchKeys`); it compacts once
        `compact_after` batches of its width were searched."""
        width = src.shape[1]
        with self._lock:
            self._batches_searched += 1
            self._batches_per_width[width] += 1
            number, of_width = self._batches_searched - 1, self._batches_per_width[width]
        rng = self.keys.key(number, stream, in_call)
        compact = self.compact_after is not None and of_width > self.compact_after
        candidates = (self.shortlist.candidates(src, self.shortlist_size)
                      if self.shortlist is not None else None)
        return _Batch(src, index, rng, compact, candidates)

    def _compile_ahead(self, compiler: concurrent.futures.Executor, batches: list[_Batch]
                       ) -> dict[tuple[int, int], concurrent.futures.Future]:
        """Futures, one per batch shape (rows, width) of `batches`, done once that shape's
        programs are compiled (`compile_search`, with every halving where a batch of the shape
        compacts), queued in the order the shapes first come. A shape compiled before is
        done at once."""
        compacts: dict[tuple[int, int], bool] = {}
        for batch in batches:
            compacts[batch.src.shape] = compacts.get(batch.src.shape, False) or batch.compact
        futures = {}
        for shape, halvings in compacts.items():
            if {(shape, halvings), (shape, True)} & self._compiled_shapes:
                futures[shape] = concurrent.futures.Future()
                futures[shape].set_result(None)
            else:
                futures[shape] = compiler.submit(self._compile, shape, halvings)
        return futures

    def _compile(self, shape: tuple[int, int], halvings: bool) -> None:
        compile_search(self.graphdef, self.state, shape, self.search, halvings,
                       self.shortlist_size or None)
        self._compiled_shapes.add((shape, halvings))

    def _search_one(self, batch: _Batch
                    ) -> tuple[BatchStats, np.ndarray, list[list[Hypothesis]], np.ndarray]:
        """Search one batch (any thread): what `_search_batches` yields for it."""
        start = time.perf_counter()
        src, index = batch.src, batch.index
        result = search_with_state(self.graphdef, self.state, src, self.search, batch.rng,
                                   batch.compact, batch.candidates)
        real = index >= 0
        stats = BatchStats(
            width=src.shape[1], rows=src.shape[0], sentences=int(real.sum()),
            source_tokens=int((src != self.model_config.pad_id).sum()), steps=result.steps,
            row_steps=result.row_steps, stage_rows=result.stage_rows,
            seconds=time.perf_counter() - start)
        hypotheses = [real_hypotheses(result, row, self.tokenizer, self.model_config.eos_id)
                      for row in np.flatnonzero(real)]
        return stats, index[real], hypotheses, index[real & result.reached_limit()]


def search_plan(model: Transformer | Ensemble, search: SearchConfig, batch_tokens: int,
                buckets: Sequence[int] | None) -> BatchPlan:
    """How a translator of `model` cuts calls into batches. No bucket is wider than the
    model's positions (sources are cut to max_len tokens). ValueError where the search
    cannot fit in the memory there is (`check_search_memory`)."""
    max_len = model.config.max_len
    plan = BatchPlan(batch_tokens, buckets_up_to(max_len, buckets or INFERENCE_BUCKETS),
                     plan_search(search).rows_per_sentence, on_cpu=cpu_backend())
    check_search_memory(plan, search, most_heads(model), max_len)
    return plan


def members(model: Transformer | Ensemble) -> list[Transformer]:
    """The models that decode: an ensemble's members, or the model itself."""
    return list(model.models) if isinstance(model, Ensemble) else [model]


def most_heads(model: Transformer | Ensemble) -> int:
    """The most attention heads of the model's decoder, or of an ensemble's members (they
    decode one after another)."""
    return max(member.config.num_heads for member in members(model))


def compute_types(model: Transformer | Ensemble) -> str:
    """The dtype the model computes in; an ensemble's members' each once, "+"-joined (each
    keeps its own stored dtype unless --dtype gives one)."""
    return "+".join(dict.fromkeys(member.config.dtype for member in members(model)))


def real_hypotheses(result: SearchResult, row: int, tokenizer, eos_id: int
                    ) -> list[Hypothesis]:
    """Sentence `row`'s hypotheses, best first, without the n-best places the search left
    unfilled (scored NEG_INF): a sentence may have fewer hypotheses than nbest, e.g. EOS alone
    under an output limit of one token, or a vocabulary with fewer tokens than the beam. The
    best is always real, kept whatever its score (a model whose training blew up scores
    below NEG_INF): EOS is forced at the output limit."""
    hypotheses = zip(result.token_ids(row, eos_id), result.scores[row])
    found = [(ids, score) for place, (ids, score) in enumerate(hypotheses)
             if place == 0 or score > NEG_INF / 2]
    return [Hypothesis(tokenizer.decode([ids])[0], float(score), tuple(ids))
            for ids, score in found]


def shortlist_candidates(shortlist: Shortlist, size: int, model_config,
                         strategy: Strategy) -> int:
    """The candidates a batch searches over: `size`, clamped to the vocabulary with a
    warning; ValueError for a shortlist of another vocabulary, a size that cannot hold
    the special tokens and one more, or fewer candidates than `strategy` samples among."""
    if shortlist.vocab_size != model_config.vocab_size:
        raise ValueError(f"the shortlist is built for a vocabulary of {shortlist.vocab_size:,} "
                         f"tokens, the model has {model_config.vocab_size:,}: build it again "
                         "for this model.")
    if size <= shortlist.special:
        raise ValueError(f"--shortlist {size}: a batch needs at least {shortlist.special + 1} "
                         f"candidates (the {shortlist.special} special tokens and one more).")
    if size > model_config.vocab_size:
        log.warning("--shortlist %d is more than the vocabulary's %d tokens: every token is a "
                    "candidate", size, model_config.vocab_size)
    size = min(size, model_config.vocab_size)
    strategy.check_vocabulary(size, "--shortlist's candidates")
    return size


def _pad_targets(targets: list[list[int]], rows: int, buckets: Sequence[int], pad_id: int
                 ) -> np.ndarray:
    """[rows, bucket] int32: the targets (EOS included) padded to the smallest bucket that
    holds the longest, so that scoring compiles one shape per bucket pair."""
    longest = max(len(t) for t in targets)
    width = next(b for b in buckets if b >= longest)
    return pad_sources(targets, pad_id, batch_size=rows, width=width)
