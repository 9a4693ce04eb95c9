"""Running a started search to its end, leaving finished sentences behind on the way.

A batch's sentences end at different steps, and a finished sentence's row costs as much to
decode as a searching one. With `compact`, the loop stops once at most half of its rows still
search; their rows are gathered into a batch of half the rows (or a quarter, ...: the row
counts `nmt.models.translator` also uses for smaller calls, so no new shapes), the finished
ones are copied out, and the loop resumes. Filler rows of a compacted batch repeat a finished
sentence, frozen. Without, the loop runs once, until every sentence is done.
"""

from __future__ import annotations

import jax
import numpy as np

from transformer.search.result import SearchResult
from transformer.search.step import EncodedSources
from transformer.stored import StoredJit
from transformer.strategies import Strategy

Array = jax.Array


def run_in_stages(loop, strategy: Strategy, max_len: int, state, sources: EncodedSources,
                  loop_state, limits: np.ndarray, pad_id: int, rng: Array, compact: bool,
                  candidates: np.ndarray | None = None) -> SearchResult:
    """The search's result, from the loop state its start program left; limits [batch]:
    each sentence's output limit, as `sources` holds it on the device. With `candidates`
    (a shortlist's token ids [K]) the tokens are positions in it (`model_step`).

    `loop` is the strategy's compiled loop (`transformer.search.programs.Loop`): its
    `resume` runs steps, its `outputs` copies hypotheses to the host.
    """
    nbest, rows = strategy.nbest, len(limits)
    tokens = np.full((rows, nbest, max_len), pad_id, np.int32)
    scores = np.zeros((rows, nbest), np.float32)
    lengths = np.zeros((rows, nbest), np.int32)
    sentence_of_row = np.arange(rows)  # -1: a filler row, or a sentence already copied out
    step, row_steps, stage_rows = 0, 0, []
    while True:
        batch_rows = len(sentence_of_row)
        stage_rows.append(batch_rows)
        stop_at = batch_rows // 2 if compact and batch_rows > 1 else 0
        loop_state = loop.resume(strategy, max_len, state, sources, loop_state,
                                 np.int32(stop_at), rng, candidates)
        done, new_step = (np.asarray(x)
                          for x in jax.device_get((loop_state.done, loop_state.step)))
        row_steps += batch_rows * (int(new_step) - step)
        step = int(new_step)
        finished = done | (step >= max_len)
        leaving = np.flatnonzero(finished & (sentence_of_row >= 0))
        if len(leaving):
            out_tokens, out_scores, out_lengths = loop.outputs(loop_state, pad_id, nbest)
            where = sentence_of_row[leaving]
            tokens[where], scores[where] = out_tokens[leaving], out_scores[leaving]
            lengths[where] = out_lengths[leaving]
            sentence_of_row[leaving] = -1
        staying = np.flatnonzero(~finished)
        if not len(staying):
            return SearchResult(tokens, scores, lengths, limits, step, row_steps,
                                tuple(stage_rows))
        new_rows = smallest_halving(batch_rows, len(staying))
        filler = np.flatnonzero(finished)[0]
        keep = np.concatenate([staying, np.full(new_rows - len(staying), filler)])
        sources, loop_state = compact_rows(sources, loop_state, keep.astype(np.int32))
        sentence_of_row = np.concatenate(
            [sentence_of_row[staying], np.full(new_rows - len(staying), -1)])


def smallest_halving(rows: int, needed: int) -> int:
    """rows / 2^n for the largest n that still holds `needed` rows."""
    while rows // 2 >= needed:
        rows //= 2
    return rows


def _take_rows(sources: EncodedSources, loop_state, keep: Array):
    """The rows `keep` [new_batch] of every per-sentence array (scalars such as the step are
    shared by all rows and stay; the cache takes its own rows, `SearchCache.take_rows`)."""
    def take(x):
        if _is_cache(x):
            return x.take_rows(keep)
        return x[keep] if x.ndim else x
    return jax.tree.map(take, sources), jax.tree.map(take, loop_state, is_leaf=_is_cache)


def _is_cache(x) -> bool:
    return hasattr(x, "take_rows")


compact_rows = StoredJit(_take_rows)
