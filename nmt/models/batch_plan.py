"""How a translator cuts a call's sentences into search batches, and which batch shapes
(rows, padded source width) it can ever search: a value, testable without a model.

Sources are padded to the smallest bucket that holds them, and each width compiles search
once per row count, so the shapes stay few. On a CPU a decoder step's time grows with its
rows, so a small call gets a small batch (the next power of two of the tokens it needs)
rather than the full budget's rows, most of them PAD. On a GPU or TPU a step costs about the
same for a few rows as for a few hundred, while each program takes seconds to compile, so
every batch of a width has the full budget's rows: one shape per width.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from data.batching import inference_batches, single_batch, source_width
from data.tokenizer import SpecialIds
from nmt.runtime.memory import DeviceMemory, device_memory, gib
from transformer.cache import attention_scores_bytes
from transformer.config import SearchConfig


@dataclasses.dataclass(frozen=True)
class BatchPlan:
    """batch_tokens: source tokens per batch, before dividing by `rows_per_sentence` (the
    beam size of beam search, else 1). buckets: the padded widths, narrowest first.
    on_cpu: shape batches for a backend whose steps cost time per row (see the module)."""

    batch_tokens: int
    buckets: tuple[int, ...]
    rows_per_sentence: int
    on_cpu: bool

    def budget(self, ids: list[list[int]], per_token: int | None = None) -> int:
        """Source tokens per batch for a call of `ids` (no EOS).

        On a CPU a call under the full budget gets the next power of two above what it needs,
        so that at most log2(batch_tokens / 64) + 1 row counts per width are ever compiled.
        The budget is divided by the rows each token takes (`per_token`, by default
        `rows_per_sentence`): a beam of 4 does four times the work per source token.
        """
        if per_token is None:
            per_token = self.rows_per_sentence
        needed = per_token * sum(len(row) + 1 for row in ids)
        budget = self.batch_tokens
        if self.on_cpu:
            budget = min(budget, 1 << max(needed - 1, 1).bit_length())
        return max(budget // per_token, 1)  # inference_batches always makes one row

    def search_shapes(self) -> list[tuple[int, int]]:
        """Every (rows, width) batch shape a call can search, narrowest first: what a server
        compiles before it takes requests (a search that leaves finished sentences behind
        continues at halvings of its rows, compiled with its shape: `compile_search`)."""
        shapes = {(rows, width) for width in self.buckets for rows in self.row_counts(width)}
        return sorted(shapes, key=lambda shape: (shape[1], shape[0]))

    def row_counts(self, width: int) -> set[int]:
        """The row counts a batch of `width` can have: one per budget `budget` picks.

        On a CPU, also the full budget's row count rounded up to a power of two (16 rather
        than 10 at width 48 with 512 source tokens), for `call_batches`: a call of 16
        sentences whose longest needs width 48 is then one search rather than two, each of
        which would cost nearly as much. It exceeds the budget by less than 2x, and only for
        calls that fit it.
        """
        def rows_at(budget: int) -> int:
            return max(max(budget // self.rows_per_sentence, 1) // width, 1)

        if not self.on_cpu:
            return {rows_at(self.batch_tokens)}
        counts = {rows_at(min(self.batch_tokens, 1 << k))
                  for k in range(1, self.batch_tokens.bit_length() + 1)}
        counts.add(rows_at(self.batch_tokens))
        return counts | {1 << (rows_at(self.batch_tokens) - 1).bit_length()}

    def call_batches(self, ids: list[list[int]], special: SpecialIds
                     ) -> list[tuple[np.ndarray, np.ndarray]]:
        """A call's batches, `(src, index)` as `inference_batches` makes them.

        On a CPU, a call that fits one batch at its longest sentence's width is searched as
        that one batch, in a row count `row_counts` has: split by width, its sentences would
        make several batches of a few rows, each a whole search costing nearly what one of
        all of them does. Larger calls are sorted by length into batches of the budget.
        """
        if self.on_cpu:
            width = source_width(ids, self.buckets)
            fitting = [rows for rows in self.row_counts(width) if rows >= len(ids)]
            if width <= self.buckets[-1] and fitting:
                return [single_batch(ids, min(fitting), width, special)]
        return list(inference_batches(ids, batch_tokens=self.budget(ids), buckets=self.buckets,
                                      special=special))


def attention_bytes(plan: BatchPlan, search: SearchConfig, heads: int, model_max_len: int
                    ) -> int:
    """The most memory one decoder layer's self-attention scores take in any batch shape
    `plan` searches, at its output limit (`transformer.cache.attention_scores_bytes`)."""
    return max(attention_scores_bytes(rows, plan.rows_per_sentence, heads,
                                      search.max_output_len(width, model_max_len))
               for rows, width in plan.search_shapes())


def check_search_memory(plan: BatchPlan, search: SearchConfig, heads: int, model_max_len: int,
                        memory: DeviceMemory | None = None) -> None:
    """ValueError where a search's attention alone needs more memory than is free (default:
    the device's, `device_memory`): on a CPU the kernel would kill the process without a
    word. Names the largest beam that fits."""
    memory = memory or device_memory()
    if memory.free is None:
        return

    def need(beam: int) -> int:
        return attention_bytes(dataclasses.replace(plan, rows_per_sentence=beam), search,
                               heads, model_max_len)

    beam = plan.rows_per_sentence
    if need(beam) <= memory.free:
        return
    low, high = 0, beam  # need(high) does not fit; need(low) does, or low is 0
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if need(middle) <= memory.free else (low, middle)
    more = f"more than the {gib(memory.free)} free on {memory.where}"
    if not low:  # not even one row per sentence: the batch is too large (any strategy)
        raise ValueError(
            f"a batch of {plan.batch_tokens} source tokens (--batch-tokens) needs up to "
            f"{gib(need(1))} for one layer's attention scores over its longest sentences, "
            f"{more}; give a smaller --batch-tokens.")
    raise ValueError(
        f"SearchConfig.beam_size {beam} needs up to {gib(need(beam))} for one layer's attention "
        f"scores in a batch of the longest sentences (each beam scores every beam's cached "
        f"positions, so this grows with the square of the beam), {more}; give "
        f"SearchConfig.beam_size {low} or less.")
