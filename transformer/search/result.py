"""What a search returns: hypotheses per sentence, best first, on the host."""

from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass(frozen=True)
class SearchResult:
    """Hypotheses per sentence, best first.

    tokens:  int32 [batch, nbest, max_len], each ending with EOS and padded after it.
    scores:  float32 [batch, nbest]: log-probability divided by the length penalty (beam),
             or the plain log-probability (greedy, sampling; nbest = 1).
    lengths: int32 [batch, nbest], tokens up to and including EOS.
    limits:  int32 [batch], each sentence's output limit (EOS included); a hypothesis as long
             as its limit ended there because EOS was forced.
    steps:   decoder steps the search ran: the batch's longest search, at most the limit for a
             source of the padded width.
    row_steps: the work those steps did, rows (sentences) decoded summed over the steps: less
             than batch * steps where finished sentences were left behind.
    stage_rows: the rows of each stage of the search, the batch's first
             (`transformer.search.compaction`).
    """

    tokens: np.ndarray
    scores: np.ndarray
    lengths: np.ndarray
    limits: np.ndarray
    steps: int
    row_steps: int
    stage_rows: tuple[int, ...]

    def reached_limit(self) -> np.ndarray:
        """bool [batch]: the best hypothesis ended at its output limit, by a forced EOS."""
        return self.lengths[:, 0] >= self.limits

    def token_ids(self, row: int, eos_id: int) -> list[list[int]]:
        """Sentence `row`'s hypotheses as token ids, best first, without EOS and padding (a
        beam search that finished fewer than nbest gives empty ones)."""
        out = []
        for tokens, length in zip(self.tokens[row], self.lengths[row]):
            ids = tokens[:length].tolist()
            out.append(ids[:-1] if ids and ids[-1] == eos_id else ids)
        return out
