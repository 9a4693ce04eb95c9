"""Greedy, sampling and beam search over the Transformer's cached decoder, and force decoding
of given references.

Every search starts from BOS, runs the decoder on one new position per step (keys and values
of earlier positions come from the cache), and loops with `lax.while_loop` over static shapes
until every sentence has ended or reached its length limit. Each sentence has its own limit
`max_len_a * source_length + max_len_b` (EOS included); at that position EOS is forced, as
fairseq does, so every output ends with EOS. PAD and BOS are never produced. After EOS a
sequence is padded with PAD.

Modules, in reading order:
  step        the seam: a search sees the model only as a step function, (last tokens,
              cache) -> (next-token logits, cache); tests script their own
  tokens      which tokens may be produced at a step, and the best of them
  greedy      greedy search and sampling
  beam        beam search, its beam rules and stopping
  compaction  running a search in stages, leaving finished sentences behind
  programs    the jitted start and loop of each strategy, once per model graph
  run         `search`: output limits, start, stages; `compile_search` ahead of a shape
  scoring     `reference_logprobs`: force decoding

The strategy (`transformer.strategies`: `Greedy`, `Sample`, `Beam`) is made once from a
`SearchConfig` and is, with the output length, the static argument of the jitted programs.
The model is a `Transformer` or a `transformer.ensemble.Ensemble`; both give caches with the
operations search needs (`transformer.cache.SearchCache`). A compiled shape is (batch,
padded source length); `nmt.models.translator` feeds search with batches whose widths come
from a fixed bucket list, so the number of compiled shapes stays bounded.
"""

from transformer.search.beam import length_penalty
from transformer.search.result import SearchResult
from transformer.search.run import (
    compile_search,
    output_limits,
    pad_sources,
    search,
    search_with_state,
)
from transformer.search.scoring import reference_logprobs, reference_logprobs_with_state
from transformer.search.tokens import NEG_INF, top_k_over_vocab

__all__ = ["NEG_INF", "SearchResult", "compile_search", "length_penalty", "output_limits",
           "pad_sources", "reference_logprobs", "reference_logprobs_with_state", "search",
           "search_with_state", "top_k_over_vocab"]
