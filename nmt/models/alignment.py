"""Word alignments read off a model's encoder-decoder attention, for putting a sentence's
inline markup back around the words it enclosed once the sentence is translated whole.

A translation is force-decoded (one teacher-forced pass over source and translation, no
search), and the cross-attention of one decoder layer, averaged over its heads, is read as
how much each target token draws on each source token. Which layer, and which decoder input
a target token's row is (`SHIFTED`), were chosen by measuring placement on sentences whose
right answer is known (bench/alignment.py; docs/performance.md has the figures).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence

import numpy as np

# The decoder layer whose attention is read (negative: from the top), and whether target
# token j's row is the step that reads it as input (Chen et al. 2020's shift) rather than
# the step that predicts it.
ALIGNMENT_LAYER = -1
SHIFTED = False
ROW_BUCKETS = (1, 2, 4, 8, 16, 32, 64)  # batch rows padded up to one of these


@dataclasses.dataclass(frozen=True)
class Alignment:
    """One sentence pair's soft alignment.

    source_spans: [start, end) in the source text of each source token's characters.
    target_spans: the same for each target token in the translation.
    weights: float32 [target tokens, source tokens]; row j is target token j's attention
        over the source tokens (the source's EOS left out), summing to at most 1.
    """

    source_spans: list[tuple[int, int]]
    target_spans: list[tuple[int, int]]
    weights: np.ndarray


def align(graphdef, state, tokenizer, widths: Sequence[int], sources: Sequence[str],
          targets: Sequence[str], layer: int = ALIGNMENT_LAYER, shifted: bool = SHIFTED
          ) -> list[Alignment]:
    """The `Alignment` of each (source, target) pair under the model split as (graphdef,
    state), its rows padded to `ROW_BUCKETS` and its widths to one of `widths` (the
    translator's buckets; the widest is the model's positions, past which tokens are cut)."""
    max_len = widths[-1]
    src = tokenizer.token_spans(sources, "source")
    tgt = tokenizer.token_spans(targets, "target")
    src = [(ids[:max_len - 1], spans[:max_len - 1]) for ids, spans in src]
    tgt = [(ids[:max_len - 1], spans[:max_len - 1]) for ids, spans in tgt]
    out: list[Alignment] = []
    for start in range(0, len(src), ROW_BUCKETS[-1]):
        part = slice(start, start + ROW_BUCKETS[-1])
        out += _align_batch(graphdef, state, tokenizer.ids, widths, src[part], tgt[part],
                            layer, shifted)
    return out


def _align_batch(graphdef, state, ids, widths, src, tgt, layer, shifted) -> list[Alignment]:
    rows = next(r for r in ROW_BUCKETS if r >= len(src))
    src_width = _width(widths, max(len(i) for i, _ in src) + 1)
    tgt_width = _width(widths, max(len(i) for i, _ in tgt) + 1)
    src_ids = np.full((rows, src_width), ids.pad, np.int32)
    tgt_in = np.full((rows, tgt_width), ids.pad, np.int32)
    for row, ((s, _), (t, _)) in enumerate(zip(src, tgt)):
        src_ids[row, :len(s) + 1] = [*s, ids.eos]
        tgt_in[row, :len(t) + 1] = [ids.bos, *t]
    weights = np.asarray(_cross_attention()(graphdef, state, src_ids, tgt_in,
                                            layer))  # [rows, tgt, src]
    first = 1 if shifted else 0
    return [Alignment(s_spans, t_spans,
                      weights[row, first:first + len(t), :len(s)].astype(np.float32))
            for row, ((s, s_spans), (t, t_spans)) in enumerate(zip(src, tgt))]


def aligned_targets(weights: np.ndarray, sources: Sequence[int]) -> list[int]:
    """The target tokens aligned to the source tokens `sources`, ascending: those whose most
    attended source token is one of them and that are the most attending target token of
    one of them (both directions agree, as in symmetrized alignments); where no token is
    both, those of either direction. weights: [target tokens, source tokens]."""
    if not len(sources) or not weights.size:
        return []
    inside = set(sources)
    forward = {j for j in range(weights.shape[0]) if int(weights[j].argmax()) in inside}
    backward = {int(weights[:, i].argmax()) for i in inside}
    return sorted(forward & backward or forward | backward)


def _width(widths: Sequence[int], length: int) -> int:
    return next((w for w in widths if w >= length), widths[-1])


@functools.cache
def _cross_attention():
    """The compiled pass: (graphdef, state, src_ids, tgt_in, layer) -> [rows, tgt, src], decoder
    layer `layer`'s cross-attention averaged over heads. Made at first use: this module is
    imported without JAX where no model is (the HTML placement that reads alignments)."""
    import jax
    from flax import nnx

    from transformer.ensemble import Ensemble

    @functools.partial(jax.jit, static_argnums=(0, 4))
    def attention(graphdef, state, src_ids, tgt_in, layer: int):
        model = nnx.merge(graphdef, state)
        if isinstance(model, Ensemble):
            model = model.models[0]
        weights = model.cross_attention_weights(src_ids, tgt_in)  # [layers, rows, heads, ...]
        return weights[layer].mean(axis=1)

    return attention
